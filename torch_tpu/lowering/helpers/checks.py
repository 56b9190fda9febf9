"""What lowerings need to reproduce CPU's checks: dtype names as PyTorch's errors spell them, the
NotImplementedError of a kernel CPU does not dispatch for a dtype, and results as PyTorch's meta
kernels compute them."""
from __future__ import annotations

import torch

# PyTorch's names of dtypes in its errors (c10's ScalarType names: "not implemented for 'Long'",
# "result type Float can't be cast to the desired output type Bool").
_DISPATCH_NAMES = {torch.bool: "Bool", torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short",
                   torch.int32: "Int", torch.int64: "Long", torch.float16: "Half", torch.bfloat16: "BFloat16",
                   torch.float32: "Float", torch.float64: "Double", torch.complex32: "ComplexHalf",
                   torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
                   torch.float8_e4m3fn: "Float8_e4m3fn", torch.float8_e5m2: "Float8_e5m2",
                   torch.float8_e4m3fnuz: "Float8_e4m3fnuz", torch.float8_e5m2fnuz: "Float8_e5m2fnuz",
                   torch.float8_e8m0fnu: "Float8_e8m0fnu"}


# C++'s names of the element types, as PyTorch's errors print c10::ScalarType through its C++ type
# ("masked_fill_ only supports boolean masks, but got mask with dtype unsigned char").
_CPP_NAMES = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
              torch.bfloat16: "c10::BFloat16", torch.int64: "long int", torch.int32: "int", torch.int16: "short int",
              torch.int8: "signed char", torch.uint8: "unsigned char", torch.bool: "bool",
              torch.complex64: "c10::complex<float>", torch.complex128: "c10::complex<double>"}


def cpp_type_name(dtype: torch.dtype) -> str:
    """The C++ name of `dtype`'s element type ("unsigned char", "c10::Half"), as some of PyTorch's
    errors spell it."""
    return _CPP_NAMES.get(dtype, str(dtype))


def scalar_type_name(dtype: torch.dtype) -> str:
    """c10's name of `dtype` ("Float", "Long"), as PyTorch's error messages spell it."""
    return _DISPATCH_NAMES.get(dtype, str(dtype))


def not_implemented(name: str, dtype: torch.dtype):
    """Raises CPU's NotImplementedError for kernel `name` on `dtype` ('"max_pool2d" not implemented
    for 'Long''), for dtypes CPU's kernel does not dispatch."""
    raise NotImplementedError(f'"{name}" not implemented for \'{_DISPATCH_NAMES.get(dtype, str(dtype))}\'')


def meta_result(op, *args, **kwargs):
    """`op`'s result as PyTorch's meta kernel computes it, on the device of the first tensor argument:
    what a Lowering.meta that only adds CPU's checks returns. (Calling `op` on the arguments
    themselves would re-enter the meta's own FakeTensor rule under torch.compile.)"""
    device = []

    def to_meta(v):
        if isinstance(v, torch.Tensor):
            device.append(v.device)
            return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
        if isinstance(v, (list, tuple)):
            return type(v)(to_meta(x) for x in v)
        return v

    out = op(*[to_meta(a) for a in args], **{k: to_meta(v) for k, v in kwargs.items()})

    def back(r):
        if isinstance(r, torch.Tensor):
            return torch.empty_strided(r.shape, r.stride(), dtype=r.dtype, device=device[0])
        if isinstance(r, (list, tuple)):
            return type(r)(back(x) for x in r)
        return r
    return back(out)


def broadcast_index_shapes(shapes) -> tuple:
    """The shape that advanced indexing's index tensors broadcast to (shapes: of the long index
    tensors; a bool mask counts as the long indices it expands to). Raises CPU's IndexError where
    they do not broadcast (TensorAdvancedIndexing.cpp: "shape mismatch: indexing tensors could not be
    broadcast together with shapes [2], [3]"), not the refs' RuntimeError."""
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        raise IndexError("shape mismatch: indexing tensors could not be broadcast together with shapes "
                         + ", ".join(str(list(s)) for s in shapes)) from None
