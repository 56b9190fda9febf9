"""Nested tensors do not exist on tpu: the ops that would make one from tpu tensors raise
NestedTensorUnsupported (a NotImplementedError naming the op and what to do) at once, instead of
running on the CPU fallback and failing to copy a nested result back ("Could not run 'aten::_to_copy'
with arguments from the 'NestedTensortpu' backend"). torch.nn.TransformerEncoder's fast path meets
it in every eval pass with a padding mask; integrations/nn_transformer.py gives that path its result.
"""
from __future__ import annotations

import torch

from .helpers.checks import scalar_type_name
from .registry import host_kernel


class NestedTensorUnsupported(NotImplementedError):
    """An op would make a nested tensor (torch.nested) of tpu tensors, which torch_tpu does not have."""


def nested_tensor_from_mask(t, mask, mask_check=True):
    """aten::_nested_tensor_from_mask(Tensor t, Tensor mask, bool mask_check=True) on tpu: refused."""
    raise NestedTensorUnsupported(
        "aten::_nested_tensor_from_mask: nested tensors are not supported on the tpu device (torch.nested); "
        "keep such data padded with a mask (nn.TransformerEncoder does so on tpu by itself)")


host_kernel("_nested_tensor_from_mask", nested_tensor_from_mask)


def nested_tensor_from_mask_left_aligned(t, mask):
    """aten::_nested_tensor_from_mask_left_aligned(Tensor t, Tensor mask) -> bool on tpu: whether
    every row of `mask` (B, S) bool, True where t (B, S, E) has a value, is True up to a point and False
    after it (TransformerEncoder asks it before its nested path). CPU's checks and their messages; the
    answer is computed on the device and read (a host sync, as CPU's is)."""
    if mask.dtype != torch.bool:
        raise RuntimeError(f"Expected mask to be of ScalarType Bool, but got {scalar_type_name(mask.dtype)} instead.")
    if mask.dim() != 2 or t.dim() < 2 or tuple(mask.shape) != tuple(t.shape[:2]):
        raise RuntimeError("Mask size should match input size")
    if mask.shape[1] < 2:
        return True
    return not bool((mask[:, 1:] & ~mask[:, :-1]).any())


host_kernel("_nested_tensor_from_mask_left_aligned", nested_tensor_from_mask_left_aligned)
