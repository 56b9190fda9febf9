"""Nested tensors do not exist on tpu: the ops that would make one from tpu tensors raise
NestedTensorUnsupported (a NotImplementedError naming the op and what to do) at once, instead of
running on the CPU fallback and failing to copy a nested result back ("Could not run 'aten::_to_copy'
with arguments from the 'NestedTensortpu' backend"). torch.nn.TransformerEncoder's fast path meets
it in every eval pass with a padding mask; integrations/nn_transformer.py gives that path its result.
"""
from __future__ import annotations

from .registry import host_kernel


class NestedTensorUnsupported(NotImplementedError):
    """An op would make a nested tensor (torch.nested) of tpu tensors, which torch_tpu does not have."""


def nested_tensor_from_mask(t, mask, mask_check=True):
    """aten::_nested_tensor_from_mask(Tensor t, Tensor mask, bool mask_check=True) on tpu: refused."""
    raise NestedTensorUnsupported(
        "aten::_nested_tensor_from_mask: nested tensors are not supported on the tpu device (torch.nested); "
        "keep such data padded with a mask (nn.TransformerEncoder does so on tpu by itself)")


host_kernel("_nested_tensor_from_mask", nested_tensor_from_mask)
