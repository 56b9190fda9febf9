"""The precision of float32 dots and convolutions: PyTorch's setting, as StableHLO's precision_config.

torch.set_float32_matmul_precision("highest" | "high" | "medium") (PyTorch's default: "highest")
becomes HIGHEST (float32 products), HIGH (bfloat16 three-pass on a TPU) or DEFAULT (one bfloat16
pass) for float32 and complex64 operands; other dtypes keep HIGHEST (the setting is PyTorch's for
float32 only). The CPU plugin computes all three exactly; a TPU does not. The eager key carries the
setting (csrc/eager/call.cc), so a change takes effect at the next op; compiled graphs lower again.
"""
from __future__ import annotations

import torch

_XLA = {"highest": "HIGHEST", "high": "HIGH", "medium": "DEFAULT"}


def matmul_precision() -> str:
    """StableHLO's name of the current float32 matmul precision."""
    return _XLA[torch.get_float32_matmul_precision()]


def precision_config(dtype: torch.dtype) -> str | None:
    """The precision_config attribute of a dot or convolution computed in `dtype` (None for integers)."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return None
    level = matmul_precision() if dtype in (torch.float32, torch.complex64) else "HIGHEST"
    return f"[#stablehlo<precision {level}>, #stablehlo<precision {level}>]"
