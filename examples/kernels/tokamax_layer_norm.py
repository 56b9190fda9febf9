"""Tokamax's layer_norm kernel as the LayerNorms of the GPT-style block, trained against nn.LayerNorm.

    python examples/kernels/tokamax_layer_norm.py

`custom_jax_kernel` makes a function from a JAX kernel library an op on tpu tensors; its backward is
JAX's vjp of the library function. On the CPU plugin Tokamax's XLA implementation runs (its Pallas
implementations target TPUs and GPUs). The script trains TinyGPT with Tokamax's layer_norm and with
nn.LayerNorm from the same initialisation and checks that the losses agree.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch_tpu  # noqa: E402,F401
from tiny_models import TinyGPT  # noqa: E402
from torch_tpu.pallas import custom_jax_kernel  # noqa: E402


def _tokamax_layer_norm(x, weight, bias):
    import tokamax
    return tokamax.layer_norm(x, weight, bias, implementation="xla")


layer_norm = custom_jax_kernel(_tokamax_layer_norm, name="examples::tokamax_layer_norm")


class TokamaxLayerNorm(nn.LayerNorm):
    """nn.LayerNorm (its parameters, eps 1e-5 as Tokamax's default) computed by Tokamax's kernel."""

    def forward(self, x):
        return layer_norm(x, self.weight, self.bias)


def train(model, steps=10):
    torch.manual_seed(1)
    idx = torch.randint(0, 64, (8, 17), device="tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 64), idx[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def with_tokamax_norms(model):
    for name in ("ln1", "ln2", "lnf"):
        old = getattr(model, name)
        new = TokamaxLayerNorm(old.normalized_shape).to("tpu")
        new.load_state_dict(old.state_dict())
        setattr(model, name, new)
    return model


def main():
    from absl import flags
    if not flags.FLAGS.is_parsed():  # Tokamax reads absl flags; this script takes none
        flags.FLAGS(sys.argv[:1])
    torch.manual_seed(0)
    ref = train(TinyGPT().to("tpu"))
    torch.manual_seed(0)
    got = train(with_tokamax_norms(TinyGPT().to("tpu")))
    print(f"loss nn.LayerNorm {ref[0]:.4f} -> {ref[-1]:.4f}   Tokamax layer_norm {got[0]:.4f} -> {got[-1]:.4f}")
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-3, atol=1e-3)
    print("match: Tokamax's layer_norm trains TinyGPT as nn.LayerNorm does")


if __name__ == "__main__":
    main()
