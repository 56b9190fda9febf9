"""A tiled Pallas matmul as the Linear layers of an MLP, trained against nn.Linear.

    python examples/kernels/pallas_matmul.py

The kernel computes one (block_m, block_n) tile of x @ w per grid step, accumulating in float32.
Its backward (dx = g w^T, dw = x^T g) is the same kernel, through jax.custom_vjp; jax_op makes
the JAX function a PyTorch op whose backward is that vjp. The script trains the MLP with the kernel
and with nn.Linear from the same initialisation and checks that the losses agree, then compares one
bfloat16 product with torch.matmul.
"""
from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import torch
import torch.nn as nn
import torch.nn.functional as F
from jax.experimental import pallas as pl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch_tpu  # noqa: E402,F401
from torch_tpu.pallas import jax_op  # noqa: E402


def _tile_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)


def _block(n: int) -> int:
    """128 (the TPU lane width) when it divides n, else the whole dimension (always a valid block)."""
    return 128 if n % 128 == 0 else n


def _tiled(x, w):
    m, k = x.shape
    n = w.shape[1]
    bm, bn = _block(m), _block(n)
    return pl.pallas_call(_tile_kernel, grid=(m // bm, n // bn),
                          in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                                    pl.BlockSpec((k, bn), lambda i, j: (0, j))],
                          out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
                          out_shape=jax.ShapeDtypeStruct((m, n), x.dtype))(x, w)


@jax.custom_vjp
def pallas_matmul(x, w):
    return _tiled(x, w)


def _fwd(x, w):
    return _tiled(x, w), (x, w)


def _bwd(res, g):
    x, w = res
    return _tiled(g, w.T), _tiled(x.T, g)


pallas_matmul.defvjp(_fwd, _bwd)
matmul = jax_op("examples::pallas_matmul", pallas_matmul)


class PallasLinear(nn.Linear):
    """nn.Linear whose product is the Pallas kernel."""

    def forward(self, x):
        return matmul(x, self.weight.t()) + self.bias


def mlp(linear):
    torch.manual_seed(0)
    return nn.Sequential(linear(64, 256), nn.GELU(), linear(256, 128), nn.GELU(), linear(128, 10)).to("tpu")


def train(model, steps=10):
    torch.manual_seed(1)
    x, y = torch.randn(128, 64, device="tpu"), torch.randint(0, 10, (128,), device="tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    ref, got = train(mlp(nn.Linear)), train(mlp(PallasLinear))
    print(f"loss nn.Linear {ref[0]:.4f} -> {ref[-1]:.4f}   Pallas matmul {got[0]:.4f} -> {got[-1]:.4f}")
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=1e-4)
    a = torch.randn(256, 128, dtype=torch.bfloat16)
    b = torch.randn(128, 384, dtype=torch.bfloat16)
    torch.testing.assert_close(matmul(a.to("tpu"), b.to("tpu")).cpu(), a @ b, rtol=2e-2, atol=1e-1)
    print("match: the Pallas matmul trains the MLP as nn.Linear does, and its bfloat16 product is torch.matmul's")


if __name__ == "__main__":
    main()
