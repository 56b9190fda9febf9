"""Transfers between tpu and host, and the ATen ops that cross devices.

- host -> tpu: a contiguous CPU tensor is uploaded as a runtime operand of the `copy` program, which
  converts its dtype, broadcasts it and writes it into any (strided) tpu view.
- tpu -> host: the tpu view is made a whole contiguous buffer of its own (a `clone` program, unless it
  already is one), downloaded, and copied on the CPU into the (any-strided, any-dtype) destination.
"""
from __future__ import annotations

import torch

from .. import _C
from ..lowering.complex import reject_complex32
from .views import is_whole


def to_host(src: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with the value of the tpu tensor `src` (waits for the device)."""
    reject_complex32(src.dtype)
    out = torch.empty(src.shape, dtype=src.dtype)
    if src.numel() == 0:
        return out
    sdt, sn = _C._storage_spec(src)
    # A conj / neg view's bytes are not its value: the clone program resolves the bits.
    if not (sdt == src.dtype and is_whole(sn, src.storage_offset(), src.shape, src.stride())) or \
            src.is_conj() or src.is_neg():
        src = torch.ops.aten.clone.default(src, memory_format=torch.contiguous_format)
    _C._download(src, out)
    return out


def copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """aten::copy_ with a tpu tensor on either side."""
    if self.device.type == "cpu":
        if src.device.type == "cpu":
            return self.copy_(src)
        host = to_host(src)
        with torch.no_grad():
            self.copy_(host)
        return self
    reject_complex32(self.dtype, src.dtype)
    if not src.is_cpu and src.device != self.device:
        src = to_host(src)  # between tpu devices: through the host (the plugin has no shared memory)
    from .register import copy_kernel  # the lowered device-side copy
    return copy_kernel(self, src, non_blocking)


def _copy_from(self: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """aten::_copy_from(src=self, dst): the transfer point used by at::native::copy_."""
    return copy_(dst, self, non_blocking)


def _copy_from_and_resize(self: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if dst.numel() == 0 or tuple(dst.shape) != tuple(self.shape):
        dst.resize_(self.shape)
    return copy_(dst, self)


def _local_scalar_dense(self: torch.Tensor):
    """Tensor.item(): waits for the device and returns a python number."""
    return to_host(self).item()
