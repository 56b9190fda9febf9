"""XLA's bounded dynamic dimensions in a bucketed graph (dynamo/buckets.py), for lowerings that must
not hand a dynamic dimension to an XLA op: a mask of the true region, and a value without its dynamic
sizes."""
from __future__ import annotations

import torch

from ..builder import Builder, Value


def valid(b: Builder, shape, sizes) -> Value | None:
    """i1 `shape`: inside every true size."""
    keep = None
    for d, n in enumerate(sizes):
        if n is None:
            continue
        m = b.compare(b.iota(shape, d, torch.int32), b.broadcast_to(n, shape), "LT")
        keep = m if keep is None else b.and_(keep, m)
    return keep


def static(b: Builder, x: Value, sizes, fill=0) -> Value:
    """x without XLA's dynamic sizes (a scatter's update window refuses them, and XLA:CPU writes a
    dynamic program output with its sizes appended, a buffer no other program takes), its padding
    (past the true `sizes`) holding `fill`: written at the front of a `fill` buffer one longer in
    each symbolic dimension and sliced back. XLA's dynamic padder writes a dynamic update's valid
    region only, and its simplifier removes the forms that would be no-ops (a set_dimension_size to
    the bound, an update of the whole buffer) before the padder runs. A dimension stays dynamic
    unless the buffer is longer in it (measured on the CPU plugin)."""
    shape = tuple(x.shape)
    wide = tuple(n + (sizes[d] is not None) for d, n in enumerate(shape))
    zero = b.constant(0, torch.int32)
    v = b.dynamic_update_slice(b.constant(fill, x.dtype, wide), x, [zero] * len(shape))
    return b.slice(v, [0] * len(shape), list(shape))


def filled(b: Builder, x: Value, fill) -> Value:
    """x as a static value whose padding (past its true sizes, x.sizes) holds `fill`: for an op that
    must read every element of a dimension (a scan: XLA splits a long reduce_window into blocks, and
    its dynamic padder then loses the carry between them). x itself where it has no dynamic sizes."""
    if not x.sizes or all(n is None for n in x.sizes):
        return x
    # The select first: XLA's dynamic padder fails on a dynamic update_slice of the value itself
    # ("Dynamic input unexpectedly found for unsupported instruction: compare").
    shape = tuple(x.shape)
    return static(b, b.select(valid(b, shape, x.sizes), x, b.constant(fill, x.dtype, shape)), x.sizes, fill)


def fill_value(kind, dtype: torch.dtype):
    """A padding fill of `dtype`: "lowest" (below every value: -inf, the integer minimum; a max
    pool's padding, a descending sort's), "highest" (sorted after every value: NaN, which CPU sorts
    last, the integer maximum), or the number `kind` itself."""
    if kind == "lowest":
        return float("-inf") if dtype.is_floating_point else (False if dtype == torch.bool else torch.iinfo(dtype).min)
    if kind == "highest":
        return float("nan") if dtype.is_floating_point else (True if dtype == torch.bool else torch.iinfo(dtype).max)
    return kind
