"""A Helion kernel (Pallas backend) as the activation of an MLP, on tpu tensors.

    python examples/kernels/helion_kernel.py

Helion compiles the tile program to a Pallas kernel and launches it with its own Pallas launcher,
which imports torch_tpu._internal.pallas.pallas (JaxCallable, jax_placeholder): it runs through
torch_tpu's bridge unchanged, on the tensors' device buffers (interpret-mode Pallas on the CPU
plugin). Helion kernels have no autograd, so this runs inference and compares with PyTorch.
"""
from __future__ import annotations

import os
import sys

import helion
import helion.language as hl
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch_tpu  # noqa: E402,F401


@helion.kernel(backend="pallas", config=helion.Config(block_sizes=[8, 128]))
def bias_silu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """silu(x + bias), x (rows, features), bias (features,): one fused pass over x."""
    out = torch.empty_like(x)
    for tile_m, tile_n in hl.tile(out.size()):
        h = x[tile_m, tile_n] + bias[tile_n]
        out[tile_m, tile_n] = h * torch.sigmoid(h)
    return out


class HelionMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 256, bias=False)
        self.bias = nn.Parameter(torch.randn(256) * 0.1)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x, helion_activation=True):
        h = self.fc1(x)
        h = bias_silu(h, self.bias) if helion_activation else F.silu(h + self.bias)
        return self.fc2(h)


def main():
    torch.manual_seed(0)
    model = HelionMLP().to("tpu")
    x = torch.randn(32, 64, device="tpu")
    with torch.no_grad():
        got, ref = model(x), model(x, helion_activation=False)
    assert got.device.type == "tpu"
    print(f"max |Helion - PyTorch| = {(got - ref).abs().max().item():.2e}")
    torch.testing.assert_close(got.cpu(), ref.cpu(), rtol=1e-5, atol=1e-5)
    print("match: the Helion kernel computes the activation as PyTorch does")


if __name__ == "__main__":
    main()
