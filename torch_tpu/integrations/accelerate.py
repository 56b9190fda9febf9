"""Hugging Face accelerate on the tpu device.

Why: accelerate 1.15 picks its device from a fixed list of accelerators (mps, mlu, sdaa, musa, npu,
hpu, cuda, xpu, neuron) and otherwise falls back to the CPU; it does not consult torch.accelerator,
through which transformers (5.24) puts a Trainer's model on tpu:0. A Trainer's model was then on tpu
while accelerate's data loader left its batches on the CPU, and the first step failed. accelerate
1.16 asks torch.accelerator and picks tpu itself (the device change below is then a no-op), but in
both a torchrun launch on tpu has no distributed type (no distributed backend it knows for tpu).

What changes, in a process where torch_tpu is loaded, when `accelerate.state` is imported:
- `PartialState.default_device` is the current tpu device where accelerate would fall back to the
  CPU and a tpu device exists. What a user asks for still wins, as it does over CUDA: `cpu=True`
  (Trainer's `use_cpu`), and `ACCELERATE_TORCH_DEVICE`. Batches, models, `mixed_precision="bf16"`
  (torch.autocast on tpu), gradient accumulation and clipping then follow accelerate's own code.
- Several processes (torchrun or `accelerate launch`: LOCAL_RANK set): accelerate has no distributed
  type for tpu, so each process would silently train alone. It runs instead in accelerate's
  device-id-free DDP mode, the one it uses for CPU ranks (`DistributedType.MULTI_CPU`: DDP without
  device_ids, sharded batches, barriers without device ids), on the process group `_BACKEND`, with
  `PartialState.device` the rank's own tpu device (not the CPU that mode would pick).
Nothing else of accelerate is touched; `install()` does nothing where accelerate is not installed.
"""
from __future__ import annotations

import importlib.util
import os
import sys

from ._import_hook import on_import

_MODULE = "accelerate.state"
# The process group of a multi-process launch on tpu: tpu tensors on tpu_dist, CPU ones (accelerate's
# RNG-state broadcast) on Gloo.
_BACKEND = "cpu:gloo,tpu:tpu_dist"


def _tpu_usable() -> bool:
    import torch
    return torch.tpu.is_available()


def patch(state) -> None:
    """Applies the changes above to the imported module `accelerate.state` (idempotent)."""
    cls = state.PartialState
    if getattr(cls, "_torch_tpu_patched", False):
        return
    import torch
    fallback = cls.default_device

    def default_device(self):
        device = fallback.fget(self)
        if device.type == "cpu" and _tpu_usable():
            return torch.device("tpu", torch.tpu.current_device())
        return device
    default_device.__doc__ = (fallback.__doc__ or "") + "\n(torch_tpu: the tpu device where accelerate would take the CPU.)"

    prepare = cls._prepare_backend

    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        backend_, distributed_type = prepare(self, cpu, sagemaker_dp, backend)
        several = int(os.environ.get("LOCAL_RANK", -1)) != -1
        self._torch_tpu_ranks = False
        if backend_ is None and several and not cpu and "ACCELERATE_TORCH_DEVICE" not in os.environ and _tpu_usable():
            self._torch_tpu_ranks = True
            return backend or _BACKEND, state.DistributedType.MULTI_CPU
        return backend_, distributed_type

    set_device = cls.set_device

    def _set_device(self):
        if getattr(self, "_torch_tpu_ranks", False) and self.device is None:
            self.device = torch.device("tpu", torch.tpu.current_device())
            return
        set_device(self)

    cls.default_device = property(default_device)
    cls._prepare_backend = _prepare_backend
    cls.set_device = _set_device
    cls._torch_tpu_patched = True


def install() -> None:
    """Patches accelerate.state now if it is imported, else when it is; nothing where accelerate is
    not installed."""
    if _MODULE in sys.modules or importlib.util.find_spec("accelerate") is not None:
        on_import(_MODULE, after=patch)
