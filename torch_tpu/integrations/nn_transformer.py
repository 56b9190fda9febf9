"""torch.nn.TransformerEncoder's nested-tensor fast path on tpu.

Why: in eval mode without grad and with a `src_key_padding_mask`, TransformerEncoder (its default
`enable_nested_tensor=True`; nn.Transformer's encoder too) packs the batch into a nested tensor
(`torch._nested_tensor_from_mask`) on every device its fast path lists, and that list names the
PrivateUse1 device, tpu. Nested tensors do not exist on tpu (lowering/nested.py), so every
validation or greedy-decoding pass of a padded encoder raised NotImplementedError.

What changes, in a process where torch_tpu is loaded: TransformerEncoder.forward, where PyTorch's own
forward reaches that op with tpu tensors (and only then), runs PyTorch's forward again with the nested
path off and returns what the nested path returns: the layers' output with every padded position
zeroed (the nested path's `to_padded_tensor(0.0)`), then the encoder's norm (so a padded row holds
norm(0), as on CPU). The valid positions are the dense path's values, which equal the nested path's
to float rounding (CPU: 6e-7 apart). Calls on other devices, in training, with grad or without a
padding mask take PyTorch's forward unchanged. The retry sets the module's `norm` and
`use_nested_tensor` aside for its duration: one module must not run this path on two threads at once.
"""
from __future__ import annotations

import functools
import inspect

_original = None  # PyTorch's TransformerEncoder.forward


def _dense_as_nested(self, bound):
    """The nested fast path's result of `self(**bound.arguments)`, computed on the dense path."""
    import torch
    norm, nested = self.norm, self.use_nested_tensor
    self.norm, self.use_nested_tensor = None, False
    try:
        out = _original(*bound.args, **bound.kwargs)
    finally:
        self.norm, self.use_nested_tensor = norm, nested
    pad = bound.arguments["src_key_padding_mask"]  # bool: True where padded; float: nonzero where padded
    pad = pad if pad.dtype == torch.bool else pad != 0
    if not self.layers[0].self_attn.batch_first:  # out is (S, N, E); the mask (N, S)
        pad = pad.t()
    out = out.masked_fill(pad.unsqueeze(-1), 0.0)
    return norm(out) if norm is not None else out


def install() -> None:
    """Wraps torch.nn.TransformerEncoder.forward as the module docstring says (once)."""
    global _original
    import torch
    from ..lowering.nested import NestedTensorUnsupported
    if _original is not None:
        return
    _original = torch.nn.TransformerEncoder.forward
    signature = inspect.signature(_original)

    @functools.wraps(_original)
    def forward(self, *args, **kwargs):
        try:
            return _original(self, *args, **kwargs)
        except NestedTensorUnsupported:
            return _dense_as_nested(self, signature.bind(self, *args, **kwargs))
    torch.nn.TransformerEncoder.forward = forward
