"""A Pallas flash-attention-style kernel in the GPT-style block, in place of scaled_dot_product_attention.

    python examples/kernels/flash_attention.py

The kernel walks the keys block by block with an online softmax (running max and sum), so the full
attention matrix never exists. JAX cannot differentiate a pallas_call, so the op's backward is given
by jax.custom_vjp: the vjp of the plain jnp attention. torch_tpu.pallas.jax_op makes it a PyTorch op
whose backward is JAX's vjp (the custom one here). The script trains TinyGPT with the kernel and
with SDPA from the same initialisation, eager and compiled, and checks that the losses agree.
On the CPU plugin the kernel runs in Pallas's interpret mode (a warning says so once).
"""
from __future__ import annotations

import functools
import os
import sys

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F
from jax.experimental import pallas as pl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch_tpu  # noqa: E402,F401
from tiny_models import TinyGPT  # noqa: E402
from torch_tpu.pallas import jax_op  # noqa: E402


def _flash_kernel(q_ref, k_ref, v_ref, o_ref, *, block_k: int, scale: float):
    """One (batch x head) row: q, k, v (time, head_dim) blocks; causal softmax(q k^T * scale) v."""
    q = q_ref[...].astype(jnp.float32) * scale
    t = q.shape[0]

    def body(i, carry):
        m, l, acc = carry
        k = k_ref[pl.ds(i * block_k, block_k), :].astype(jnp.float32)
        v = v_ref[pl.ds(i * block_k, block_k), :].astype(jnp.float32)
        s = q @ k.T
        rows = jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
        cols = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1) + i * block_k
        s = jnp.where(cols <= rows, s, -jnp.inf)
        m_new = jnp.maximum(m, s.max(axis=1))
        p = jnp.exp(s - m_new[:, None])
        corr = jnp.exp(m - m_new)
        return m_new, l * corr + p.sum(axis=1), acc * corr[:, None] + p @ v

    init = (jnp.full((t,), -jnp.inf, jnp.float32), jnp.zeros((t,), jnp.float32), jnp.zeros(q.shape, jnp.float32))
    _, l, acc = jax.lax.fori_loop(0, t // block_k, body, init)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)


def _flash(q, k, v, block_k=8):
    """(batch, heads, time, head_dim) causal attention by the Pallas kernel, one grid step per row."""
    b, h, t, d = q.shape
    rows = [z.reshape(b * h, t, d) for z in (q, k, v)]
    spec = pl.BlockSpec((None, t, d), lambda i: (i, 0, 0))
    out = pl.pallas_call(functools.partial(_flash_kernel, block_k=min(block_k, t), scale=d ** -0.5),
                         grid=(b * h,), in_specs=[spec] * 3, out_specs=spec,
                         out_shape=jax.ShapeDtypeStruct((b * h, t, d), q.dtype))(*rows)
    return out.reshape(b, h, t, d)


def _reference(q, k, v):
    """The same attention in plain jnp (its vjp is the kernel's backward)."""
    t, d = q.shape[-2], q.shape[-1]
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * d ** -0.5
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)


@jax.custom_vjp
def flash_attention(q, k, v):
    return _flash(q, k, v)


def _fwd(q, k, v):
    return _flash(q, k, v), (q, k, v)


def _bwd(res, g):
    return jax.vjp(_reference, *res)[1](g)


flash_attention.defvjp(_fwd, _bwd)

# The PyTorch op: (batch, heads, time, head_dim) tpu tensors, forward and backward.
attention = jax_op("examples::flash_attention", flash_attention)


def training_step(model, compiled=False):
    """step() -> loss: one AdamW step of `model` on a fixed batch of token ids (compiled whole with
    backend "tpu" if asked)."""
    torch.manual_seed(1)
    idx = torch.randint(0, 64, (8, 17), device="tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step():
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 64), idx[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return torch.compile(step, backend="tpu") if compiled else step


def train(model, steps, compiled=False):
    """Losses of `steps` training steps."""
    step = training_step(model, compiled)
    return [step().item() for _ in range(steps)]


def main(steps=10):
    results = {}
    for compiled in (False, True):
        for name, attn in (("sdpa", None), ("pallas", attention)):
            torch.manual_seed(0)
            results[name, compiled] = train(TinyGPT(attention=attn).to("tpu"), steps, compiled)
        sdpa, pallas = results["sdpa", compiled], results["pallas", compiled]
        print(f"{'compiled' if compiled else 'eager':8s} loss SDPA {sdpa[0]:.4f} -> {sdpa[-1]:.4f}   "
              f"Pallas flash attention {pallas[0]:.4f} -> {pallas[-1]:.4f}")
        torch.testing.assert_close(torch.tensor(pallas), torch.tensor(sdpa), rtol=1e-3, atol=1e-3)
    print("match: the Pallas kernel trains TinyGPT as SDPA does")


if __name__ == "__main__":
    main()
