"""Helpers shared by several lowering modules (kept here so that no two lowering modules import
each other)."""
from __future__ import annotations

import torch

# PyTorch's names of dtypes in its errors (c10's ScalarType names: "not implemented for 'Long'",
# "result type Float can't be cast to the desired output type Bool").
_DISPATCH_NAMES = {torch.bool: "Bool", torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short",
                   torch.int32: "Int", torch.int64: "Long", torch.float16: "Half", torch.bfloat16: "BFloat16",
                   torch.float32: "Float", torch.float64: "Double", torch.complex32: "ComplexHalf",
                   torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}


def scalar_type_name(dtype: torch.dtype) -> str:
    """c10's name of `dtype` ("Float", "Long"), as PyTorch's error messages spell it."""
    return _DISPATCH_NAMES.get(dtype, str(dtype))


def not_implemented(name: str, dtype: torch.dtype):
    """Raises CPU's NotImplementedError for kernel `name` on `dtype` ('"max_pool2d" not implemented
    for 'Long''), for dtypes CPU's kernel does not dispatch."""
    raise NotImplementedError(f'"{name}" not implemented for \'{_DISPATCH_NAMES.get(dtype, str(dtype))}\'')
