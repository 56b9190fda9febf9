"""Helpers shared by several lowering modules (kept here so that no two lowering modules import
each other)."""
from __future__ import annotations

import torch

# PyTorch's names of integer dtypes in its "not implemented for" errors (AT_DISPATCH's type names).
_DISPATCH_NAMES = {torch.bool: "Bool", torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short",
                   torch.int32: "Int", torch.int64: "Long"}


def not_implemented(name: str, dtype: torch.dtype):
    """Raises CPU's NotImplementedError for kernel `name` on `dtype` ('"max_pool2d" not implemented
    for 'Long''), for dtypes CPU's kernel does not dispatch."""
    raise NotImplementedError(f'"{name}" not implemented for \'{_DISPATCH_NAMES.get(dtype, str(dtype))}\'')
