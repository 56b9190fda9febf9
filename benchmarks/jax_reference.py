"""The GPT-style block's training step written in JAX and run by jax.jit on JAX's own XLA CPU
backend: the reference for torch.compile(backend="tpu"), since both end in the same compiler.

Same architecture, parameters (copied from the torch model), batch, loss and AdamW update as
benchmarks/bench_compile.py's gpt_case. Needs `pip install jax` (not a dependency of torch_tpu).
"""
from __future__ import annotations

import statistics
import time


def gpt_step_seconds(torch_model, idx, tgt, steps, lr=1e-3, heads=4):
    import jax
    import jax.numpy as jnp

    params = {k: jnp.asarray(v.detach().cpu().numpy()) for k, v in torch_model.named_parameters()}
    idx = jnp.asarray(idx.cpu().numpy())
    tgt = jnp.asarray(tgt.cpu().numpy())

    def ln(x, p):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / jnp.sqrt(v + 1e-5) * params_of(p, "weight") + params_of(p, "bias")

    def params_of(p, name):
        return p[name]

    def forward(P, idx):
        sub = lambda prefix: {k.split(".", 1)[1]: v for k, v in P.items() if k.startswith(prefix + ".")}
        b, t = idx.shape
        x = P["emb.weight"][idx] + P["pos"][:t]
        h = ln(x, sub("ln1")) @ P["qkv.weight"].T + P["qkv.bias"]
        q, k, v = jnp.split(h, 3, axis=-1)
        q, k, v = (z.reshape(b, t, heads, -1).transpose(0, 2, 1, 3) for z in (q, k, v))
        s = q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(q.shape[-1])
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
        y = jax.nn.softmax(s, axis=-1) @ v
        x = x + y.transpose(0, 2, 1, 3).reshape(b, t, -1) @ P["proj.weight"].T + P["proj.bias"]
        m = jax.nn.gelu(ln(x, sub("ln2")) @ P["fc1.weight"].T + P["fc1.bias"], approximate=False)
        x = x + m @ P["fc2.weight"].T + P["fc2.bias"]
        return ln(x, sub("lnf")) @ P["emb.weight"].T

    def loss_fn(P):
        logits = forward(P, idx).reshape(-1, P["emb.weight"].shape[0])
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(tgt.shape[0]), tgt])

    @jax.jit
    def step(P, m, v, t):
        loss, g = jax.value_and_grad(loss_fn)(P)
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
        return newP, newm, newv, t, loss

    m = {k: jnp.zeros_like(p) for k, p in params.items()}
    v = {k: jnp.zeros_like(p) for k, p in params.items()}
    t = jnp.zeros((), jnp.float32)
    P = params
    for _ in range(3):
        P, m, v, t, loss = step(P, m, v, t)
    loss.block_until_ready()
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(steps):
            P, m, v, t, loss = step(P, m, v, t)
        float(loss)
        runs.append((time.perf_counter() - t0) / steps)
    return statistics.median(runs)
