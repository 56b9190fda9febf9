"""Factory ops that compute their values: arange, linspace, eye (out= overloads, which PyTorch's
composite torch.arange / torch.linspace / torch.eye call, so that values follow CPU's formulas; the
meta kernel resizes `out` first).
zeros/ones/full/*_like/scalar_tensor need nothing here: they are empty + fill_/zero_."""
from __future__ import annotations

import math

import torch

from .registry import register


def _acc_dtype(dt):
    """CPU's accumulation type for range factories: int64 for integers, float64 for float32/64,
    float32 for half precision."""
    if dt in (torch.float16, torch.bfloat16):
        return torch.float32
    if dt.is_floating_point:
        return torch.float64
    return torch.int64


@register("arange.start_out")
def arange_start_out(ctx, start, end, step, out):
    """start + i * step in the accumulation type (Scalars truncated to it, as Scalar.to<acc>)."""
    b, o = ctx.b, ctx.out[0]
    acc = _acc_dtype(o.dtype)
    shape = (math.prod(o.shape),)  # `out` keeps its shape when it has the element count: filled flat
    s = b.broadcast_to(b.convert(start, acc), shape)
    st = b.broadcast_to(b.convert(step, acc), shape)
    i = b.iota(shape, 0, acc)
    return b.reshape(b.convert(b.add(s, b.multiply(st, i)), o.dtype), o.shape)


def _range_step(b, diff, steps, cd, shape):
    """(end - start) / (steps - 1) as CPU computes it in `cd`; a complex difference is divided part
    by part (c10::complex divided by a real number), not by XLA's complex division."""
    n = b.constant(steps - 1, cd.to_real() if cd.is_complex else cd, shape)
    if cd.is_complex:
        return b.make_complex(b.divide(b.real_part(diff), n), b.divide(b.imag_part(diff), n))
    return b.divide(diff, n)


@register("linspace.out")
def linspace_out(ctx, start, end, steps, out):
    """CPU's formula: start + step*i for the first half, end - step*(steps-1-i) for the rest, with
    step = (end - start) / (steps - 1); float and complex types compute in their own precision,
    integers in float64 then truncate."""
    b, o = ctx.b, ctx.out[0]
    shape = (math.prod(o.shape),)  # `out` keeps its shape when it has the element count: filled flat
    if steps == 0:
        return b.constant(0, o.dtype, o.shape)
    cd = o.dtype if o.dtype.is_floating_point or o.dtype.is_complex else torch.float64
    s = b.broadcast_to(b.convert(b.convert(start, o.dtype), cd), shape)
    if steps == 1:
        return b.reshape(b.convert(s, o.dtype), o.shape)
    e = b.broadcast_to(b.convert(b.convert(end, o.dtype), cd), shape)
    step = _range_step(b, b.subtract(e, s), steps, cd, shape)
    i = b.iota(shape, 0, cd)
    lo = b.add(s, b.multiply(step, i))
    hi = b.subtract(e, b.multiply(step, b.subtract(b.constant(steps - 1, cd, shape), i)))
    first = b.compare(b.iota(shape, 0, torch.int64), b.constant(steps // 2, torch.int64, shape), "LT")
    return b.reshape(b.convert(b.select(first, lo, hi), o.dtype), o.shape)


def _eye(ctx):
    b, o = ctx.b, ctx.out[0]
    if len(o.shape) != 2:
        return b.constant(0, o.dtype, o.shape)
    diag = b.compare(b.iota(o.shape, 0, torch.int64), b.iota(o.shape, 1, torch.int64), "EQ")
    return b.convert(diag, o.dtype)


@register("eye.out")
def eye_out(ctx, n, out):
    return _eye(ctx)


@register("eye.m_out")
def eye_m_out(ctx, n, m, out):
    return _eye(ctx)
