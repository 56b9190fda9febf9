"""Arithmetic shared by several lowerings: integer floor division (StableHLO's divide truncates)
and addmm's `beta * self + alpha * product` with CPU's rules for beta == 0."""
from __future__ import annotations


def floor_div_int(b, x, y):
    """Integer division rounding toward -inf (StableHLO divide truncates)."""
    q = b.divide(x, y)
    r = b.subtract(x, b.multiply(q, y))
    zero = b.zeros_like(q)
    adjust = b.and_(b.compare(r, zero, "NE"), b.compare(b.compare(r, zero, "LT"), b.compare(y, zero, "LT"), "NE"))
    return b.select(adjust, b.subtract(q, b.full_like(q, 1)), q)


def add_scaled(ctx, self, prod, beta, alpha):
    """beta * self + alpha * prod; with beta == 0 self is not read (its NaNs do not propagate), as on
    CPU. An integer result truncates the scalars first; a floating one uses them in the compute
    dtype unrounded, as CPU's gemm takes alpha and beta as its float accumulation type (bfloat16
    addmm(alpha=2.0315) scaled by 2.03125 here, off by up to 0.25 per element)."""
    b = ctx.b
    out = ctx.out[0].dtype
    cd = prod.dtype
    exact = out.is_floating_point or out.is_complex
    shape = ctx.out[0].shape
    prod = b.broadcast_to(prod, shape)
    if alpha is not None:
        a = b.convert(alpha if exact else b.convert(alpha, out), cd)
        prod = b.multiply(prod, b.broadcast_to(a, shape))
    s = b.broadcast_to(b.convert(self, cd), shape)
    if beta is not None:
        bt = beta if exact else b.convert(beta, out)
        zero = b.compare(bt, b.zeros_like(bt), "EQ")
        bt = b.broadcast_to(b.convert(bt, cd), shape)
        s = b.select(b.broadcast_to(zero, shape), b.zeros_like(s), b.multiply(s, bt))
    return b.convert(b.add(s, prod), out)
