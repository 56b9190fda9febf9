"""The benchmark models' training steps written in JAX and run by jax.jit on JAX's own XLA CPU
backend: the reference for torch.compile(backend="tpu"), since both end in the same compiler.

Same architectures, parameters (copied from the torch models), batches, losses and AdamW update
(PyTorch's defaults: betas (0.9, 0.999), eps 1e-8, weight decay 1e-2) as benchmarks/bench_compile.py's
cases. Needs `pip install jax` (not a dependency of torch_tpu).
"""
from __future__ import annotations

import os
import time

# jaxlib's own CPU client unless use_plugin says otherwise: with libtpu installed (torch_tpu's tpu
# extra), jax would otherwise try a TPU first and print libtpu's warnings on a machine without one.
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def use_plugin(path):
    """Makes jax run on the PJRT plugin at `path` (torch_tpu's, e.g. OpenXLA's CPU plugin) instead of
    jaxlib's own CPU client; before jax's first use. jax has no public call for a plugin by path:
    this uses jax._src.xla_bridge.register_plugin, as jax's plugin packages do."""
    import jax
    from jax._src import xla_bridge

    xla_bridge.register_plugin("torch_tpu_plugin", priority=500, library_path=path,
                               options={"cpu_device_count": 1})
    jax.config.update("jax_platforms", "torch_tpu_plugin")


def _params(torch_model):
    import jax.numpy as jnp
    return {k: jnp.asarray(v.detach().cpu().numpy()) for k, v in torch_model.named_parameters()}


def _sub(P, prefix):
    return {k.split(".", 1)[1]: v for k, v in P.items() if k.startswith(prefix + ".")}


def _cross_entropy(logits, tgt):
    import jax
    import jax.numpy as jnp
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(tgt.shape[0]), tgt])


def _adamw_step(loss_fn, params, lr=1e-3, donate=False):
    """(jitted step, initial carry): one step is value_and_grad of `loss_fn(P, state, batch) -> (loss,
    new_state)` and PyTorch's AdamW update; carry = [P, m, v, t, state] (state: non-trained buffers
    such as BatchNorm's); the batch is the step's last argument, as it is the compiled torch step's
    input (not a constant folded into the program). donate: the step writes P, m, v in place
    (jax.jit's donate_argnums)."""
    import jax
    import jax.numpy as jnp

    def step(P, m, v, t, state, batch):
        (loss, state), g = jax.value_and_grad(loss_fn, has_aux=True)(P, state, batch)
        b1, b2, eps, wd = 0.9, 0.999, 1e-8, 1e-2
        t = t + 1
        newP, newm, newv = {}, {}, {}
        for k in P:
            p = P[k] * (1 - lr * wd)
            newm[k] = b1 * m[k] + (1 - b1) * g[k]
            newv[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
            mh = newm[k] / (1 - b1 ** t)
            vh = newv[k] / (1 - b2 ** t)
            newP[k] = p - lr * mh / (jnp.sqrt(vh) + eps)
        return newP, newm, newv, t, state, loss

    carry = [params, {k: jnp.zeros_like(p) for k, p in params.items()},
             {k: jnp.zeros_like(p) for k, p in params.items()}, jnp.zeros((), jnp.float32)]
    return jax.jit(step, donate_argnums=(0, 1, 2) if donate else ()), carry


def tpu_program(loss_fn, params, state, batch, lr=1e-3):
    """The StableHLO text of the whole AdamW training step lowered for TPU (parameters and moments
    donated, as torch_tpu's optimizer step writes them in place)."""
    step, carry = _adamw_step(loss_fn, params, lr, donate=True)
    return step.trace(*carry, state, batch).lower(lowering_platforms=("tpu",)).as_text()


def _adamw_runner(loss_fn, params, state, batch, lr=1e-3):
    """run(steps) -> seconds per jitted step (value_and_grad + AdamW) over `steps` steps, after 3
    warm-up steps. `loss_fn(P, state, batch) -> (loss, new_state)` (state: non-trained buffers such as
    BatchNorm's; batch: the same inputs every step)."""
    step, carry = _adamw_step(loss_fn, params, lr)
    carry.append(state)

    def run(steps):
        P, m, v, t, st = carry
        t0 = time.perf_counter()
        for _ in range(steps):
            P, m, v, t, st, loss = step(P, m, v, t, st, batch)
        float(loss)
        carry[:] = [P, m, v, t, st]
        return (time.perf_counter() - t0) / steps

    run(3)
    return run


def gpt_forward(heads=4):
    """TinyGPT's forward in JAX: forward(P, idx) -> logits (B, T, vocab), P its parameters by name."""
    import jax
    import jax.numpy as jnp

    def ln(x, p):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / jnp.sqrt(v + 1e-5) * p["weight"] + p["bias"]

    def forward(P, idx):
        b, t = idx.shape
        x = P["emb.weight"][idx] + P["pos"][:t]
        h = ln(x, _sub(P, "ln1")) @ P["qkv.weight"].T + P["qkv.bias"]
        q, k, v = jnp.split(h, 3, axis=-1)
        q, k, v = (z.reshape(b, t, heads, -1).transpose(0, 2, 1, 3) for z in (q, k, v))
        s = q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(q.shape[-1])
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
        y = jax.nn.softmax(s, axis=-1) @ v
        x = x + y.transpose(0, 2, 1, 3).reshape(b, t, -1) @ P["proj.weight"].T + P["proj.bias"]
        m = jax.nn.gelu(ln(x, _sub(P, "ln2")) @ P["fc1.weight"].T + P["fc1.bias"], approximate=False)
        x = x + m @ P["fc2.weight"].T + P["fc2.bias"]
        return ln(x, _sub(P, "lnf")) @ P["emb.weight"].T

    return forward


def gpt_runner(torch_model, idx, tgt, lr=1e-3, heads=4, program=False):
    """examples/tiny_models.py's TinyGPT: idx (B, T) int64 tokens, tgt (B*T,) int64. program: the
    step's StableHLO for TPU (tpu_program) instead of a runner."""
    import jax.numpy as jnp

    batch = (jnp.asarray(idx.cpu().numpy()), jnp.asarray(tgt.cpu().numpy()))
    forward = gpt_forward(heads)

    def loss_fn(P, state, batch):
        idx, tgt = batch
        logits = forward(P, idx).reshape(-1, P["emb.weight"].shape[0])
        return _cross_entropy(logits, tgt), state

    if program:
        return tpu_program(loss_fn, _params(torch_model), (), batch, lr)
    return _adamw_runner(loss_fn, _params(torch_model), (), batch, lr)


def digits_runner(torch_model, x, y, lr=1e-3, program=False):
    """examples/train_digits.py's DigitsCNN in training mode (BatchNorm on batch statistics, running
    statistics updated with momentum 0.1 and the unbiased variance, as PyTorch does): x (N, 1, 8, 8)
    float32, y (N,) int64."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    batch = (jnp.asarray(x.cpu().numpy()), jnp.asarray(y.cpu().numpy()))
    buffers = {k: jnp.asarray(v.cpu().numpy()) for k, v in torch_model.named_buffers()
               if not k.endswith("num_batches_tracked")}

    def conv(h, w, b=None):
        out = lax.conv_general_dilated(h, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return out if b is None else out + b[None, :, None, None]

    def pool(h):
        return lax.reduce_window(h, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def loss_fn(P, state, batch):
        x, y = batch
        h = conv(x, P["conv1.weight"])  # no bias before the batch norm
        mean = h.mean((0, 2, 3))
        var = h.var((0, 2, 3))
        n = h.size // h.shape[1]
        h = (h - mean[None, :, None, None]) / jnp.sqrt(var[None, :, None, None] + 1e-5)
        h = h * P["bn1.weight"][None, :, None, None] + P["bn1.bias"][None, :, None, None]
        h = pool(jax.nn.relu(h))
        h = pool(jax.nn.relu(conv(h, P["conv2.weight"], P["conv2.bias"])))
        h = jax.nn.relu(h.reshape(h.shape[0], -1) @ P["fc1.weight"].T + P["fc1.bias"])
        logits = h @ P["fc2.weight"].T + P["fc2.bias"]
        new_state = {"bn1.running_mean": 0.9 * state["bn1.running_mean"] + 0.1 * lax.stop_gradient(mean),
                     "bn1.running_var": 0.9 * state["bn1.running_var"]
                     + 0.1 * lax.stop_gradient(var) * n / (n - 1)}
        return _cross_entropy(logits, y), new_state

    if program:
        return tpu_program(loss_fn, _params(torch_model), buffers, batch, lr)
    return _adamw_runner(loss_fn, _params(torch_model), buffers, batch, lr)


def mlp_runner(torch_model, x, y, lr=1e-3, program=False):
    """A stack of Linear layers with ReLU between them (torch_model: nn.Sequential of Linear/ReLU):
    x (N, d_in) float32, y (N,) int64."""
    import jax

    batch = (jax.numpy.asarray(x.cpu().numpy()), jax.numpy.asarray(y.cpu().numpy()))
    linears = [str(i) for i, m in enumerate(torch_model) if hasattr(m, "weight")]

    def loss_fn(P, state, batch):
        h, y = batch
        for n, name in enumerate(linears):
            h = h @ P[name + ".weight"].T + P[name + ".bias"]
            if n + 1 < len(linears):
                h = jax.nn.relu(h)
        return _cross_entropy(h, y), state

    if program:
        return tpu_program(loss_fn, _params(torch_model), (), batch, lr)
    return _adamw_runner(loss_fn, _params(torch_model), (), batch, lr)
