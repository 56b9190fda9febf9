"""Complex-number ops: complex, polar, angle, and the helpers other families use on complex values.

view_as_real / view_as_complex (and so real, imag, isreal) are true views of the storage
(csrc/aten/metadata_ops.cc); conj() / _neg_view() are lazy bits that the eager kernel applies when
it reads or writes a view (eager/kernel.py). What is left computes values: StableHLO's real, imag and
complex ops split and build complex<f32> / complex<f64> values. complex32 (chalf) has no PJRT element
type, so it is refused with an error that says what to use instead.
"""
from __future__ import annotations

import math

import torch

from .. import _C
from .builder import Builder, Value
from .elementwise import compute_dtype, operand
from .registry import register

COMPLEX32_ERROR = _C.eager.COMPLEX32_ERROR  # one message, shared with the C++ copies (csrc/eager/copies.cc)


def reject_complex32(*dtypes) -> None:
    """Raises the complex32 TypeError when any of `dtypes` is torch.complex32."""
    if torch.complex32 in dtypes:
        raise TypeError(COMPLEX32_ERROR)


def conj(b: Builder, x: Value) -> Value:
    """The complex conjugate (identity on real values)."""
    if not x.dtype.is_complex:
        return x
    return b.make_complex(b.real_part(x), b.negate(b.imag_part(x)))


def _parts_dtype(ctx) -> torch.dtype:
    """The float dtype of the parts of the op's complex result (complex32 refused)."""
    out = ctx.out[0].dtype
    reject_complex32(out)
    return out.to_real()


_SCALAR_TYPE = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
                torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
                torch.uint8: "Byte", torch.bool: "Bool", torch.complex64: "ComplexFloat",
                torch.complex128: "ComplexDouble", torch.complex32: "ComplexHalf"}


def _check_parts(a, b):
    """CPU's argument checks of complex / polar (their meta kernels miss them): two Half, Float or
    Double tensors of one dtype. Runs as `prepare`, before the meta kernel; returns the arguments."""
    ok = (torch.float16, torch.float32, torch.float64)
    if a.dtype not in ok or b.dtype not in ok:
        raise RuntimeError(f"Expected both inputs to be Half, Float or Double tensors but got "
                           f"{_SCALAR_TYPE.get(a.dtype, a.dtype)} and {_SCALAR_TYPE.get(b.dtype, b.dtype)}")
    if a.dtype != b.dtype:
        raise RuntimeError(f"Expected object of scalar type {_SCALAR_TYPE[a.dtype]} but got scalar type "
                           f"{_SCALAR_TYPE[b.dtype]} for second argument")
    return [a, b]


@register("complex", prepare=_check_parts)
def complex_(ctx, real, imag):
    """real + i*imag, both broadcast to the result's shape."""
    pd = _parts_dtype(ctx)
    return ctx.b.make_complex(operand(ctx, real, pd), operand(ctx, imag, pd))


@register("polar", prepare=_check_parts)
def polar(ctx, abs, angle):
    """abs * (cos(angle) + i*sin(angle)), in the parts' precision as on CPU."""
    b = ctx.b
    pd = _parts_dtype(ctx)
    r, t = operand(ctx, abs, pd), operand(ctx, angle, pd)
    return b.make_complex(b.multiply(r, b.unary("cosine", t)), b.multiply(r, b.unary("sine", t)))


@register("angle")
def angle(ctx, x):
    """atan2(imag, real) for complex inputs; for real ones CPU's rule: pi for negative values, 0
    otherwise, NaN kept (integers and bool give a float result)."""
    b = ctx.b
    out = ctx.out[0].dtype
    if x.dtype.is_complex:
        return b.binary("atan2", b.imag_part(x), b.real_part(x))
    cd = compute_dtype(out)
    xv = b.convert(x, cd)
    zero = b.zeros_like(xv)
    r = b.select(b.compare(xv, zero, "LT"), b.full_like(xv, math.pi), zero)
    r = b.select(b.is_nan(xv), xv, r)
    return b.convert(r, out)
