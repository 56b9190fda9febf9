"""`torch_tpu._internal.utils.hardware`: what chip the tpu device is (Helion's Pallas launcher
asks, to target the attached TPU's Pallas lowering)."""
from __future__ import annotations

from ... import runtime


def get_tpu_device_name() -> str | None:
    """The PJRT device kind of tpu:0 ("TPU v5 lite", "TPU v7", ...) when the plugin is a TPU; None on
    other platforms (the CPU and CUDA plugins), where Pallas kernels lower in interpret mode."""
    if runtime.platform().lower() != "tpu":
        return None
    import torch
    return torch.tpu.get_device_name(0)
