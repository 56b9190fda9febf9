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
    CPU. Scalars are converted to the result dtype first (an int result truncates them)."""
    b = ctx.b
    out = ctx.out[0].dtype
    cd = prod.dtype
    shape = ctx.out[0].shape
    prod = b.broadcast_to(prod, shape)
    if alpha is not None:
        a = b.convert(b.convert(alpha, out), cd)
        prod = b.multiply(prod, b.broadcast_to(a, shape))
    s = b.broadcast_to(b.convert(self, cd), shape)
    if beta is not None:
        bt = b.convert(beta, out)
        zero = b.compare(bt, b.zeros_like(bt), "EQ")
        bt = b.broadcast_to(b.convert(bt, cd), shape)
        s = b.select(b.broadcast_to(zero, shape), b.zeros_like(s), b.multiply(s, bt))
    return b.convert(b.add(s, prod), out)
