"""Shape-producing ops: cat, constant_pad_nd, flip, roll, repeat, tril/triu, padding.
(stack, where with scalars, masked_select's broadcast are PyTorch composites over these.)"""
from __future__ import annotations

import torch
from torch._prims_common import compute_elementwise_output_strides

from .helpers import host_tables
from .helpers.checks import meta_result
from .registry import register


def _norm(d, rank):
    return d % rank if rank else 0


def _cat_meta(tensors, dim=0):
    """cat's result, with CPU's first check (PyTorch's Python reference fails on a 0-dim tensor with
    an IndexError or another message)."""
    for i, t in enumerate(tensors):
        if t.dim() == 0:
            raise RuntimeError(f"zero-dimensional tensor (at position {i}) cannot be concatenated")
    return meta_result(torch.ops.aten.cat, tensors, dim)


@register("cat", meta=_cat_meta)
def cat(ctx, tensors, dim=0):
    """Inputs are promoted to the result dtype; empty ones (legacy 1-D `(0,)` too) add nothing."""
    b = ctx.b
    out = ctx.out[0]
    kept = [t for t in tensors if t.type.numel != 0]
    parts = [b.convert(t, out.dtype) for t in kept]
    if out.numel == 0 or not parts:
        return b.constant(0, out.dtype, out.shape)
    d = _norm(dim, len(out.shape))
    if any((getattr(t, "sizes", None) or [None] * t.rank)[d] is not None for t in kept):
        return _cat_bucketed(b, out, kept, parts, d)
    return b.concatenate(parts, d)


def _cat_bucketed(b, out, tensors, parts, d):
    """cat along a dimension that a bucketed graph pads (a KV cache growing by one token): each part
    holds its true size (Value.sizes) at the front of its bound, so part i lands at the sum of the
    true sizes before it, a runtime offset. Position j of the result reads part i at j - offset_i
    (a gather of slice size 1 along d, which XLA's dynamic padder takes where a dynamic_slice or a
    concatenate of dynamic parts would keep the padding in between) where offset_i <= j < offset_i +
    size_i."""
    i32 = torch.int32
    n = out.shape[d]
    j = b.iota((n,), 0, i32)
    at, result = b.constant(0, i32), None
    for t, p in zip(tensors, parts):
        size = (getattr(t, "sizes", None) or [None] * t.rank)[d]
        size = b.constant(t.shape[d], i32) if size is None else b.convert(size, i32)
        start = b.broadcast_to(at, (n,))
        idx = b.clamp(b.constant(0, i32), b.subtract(j, start), b.constant(t.shape[d] - 1, i32))
        got = b.gather(p, b.reshape(idx, (n, 1)), [k for k in range(p.rank) if k != d], [d], [d], 1,
                       [1 if k == d else s for k, s in enumerate(p.type.shape)], out.shape)
        inside = b.and_(b.compare(j, start, "GE"), b.compare(j, b.add(start, b.broadcast_to(size, (n,))), "LT"))
        inside = b.broadcast_in_dim(inside, out.shape, [d])
        result = got if result is None else b.select(inside, got, result)
        at = b.add(at, size)
    return result


@register("constant_pad_nd")
def constant_pad_nd(ctx, x, pad, value=0):
    """pad lists (low, high) pairs from the last dim backwards; negative amounts crop."""
    b = ctx.b
    out = ctx.out[0]
    v = b.convert(value, out.dtype) if value is not None else b.constant(0, out.dtype)
    if out.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    if x.type.numel == 0:
        return b.broadcast_to(v, out.shape)
    low, high = [0] * x.rank, [0] * x.rank
    for i in range(len(pad) // 2):
        d = x.rank - 1 - i
        low[d], high[d] = pad[2 * i], pad[2 * i + 1]
    return b.pad(x, v, low, high)


@register("flip")
def flip(ctx, x, dims):
    dims = sorted({_norm(d, x.rank) for d in dims})
    if x.rank == 0 or not dims or x.type.numel == 0:
        return x
    return ctx.b.reverse(x, dims)


@register("roll", layout=lambda outs, x, *args: [compute_elementwise_output_strides(x)])  # as empty_like
def roll(ctx, x, shifts, dims=()):
    b = ctx.b
    if x.type.numel == 0:
        return x
    if not dims:  # roll of the flattened tensor
        flat = b.reshape(x, [x.type.numel])
        return b.reshape(_roll1(b, flat, shifts[0], 0), x.shape)
    for s, d in zip(shifts, dims):
        x = _roll1(b, x, s, _norm(d, x.rank))
    return x


def _roll1(b, x, shift, d):
    n = x.shape[d]
    s = shift % n
    if s == 0:
        return x
    start, limit = [0] * x.rank, list(x.shape)
    tail_start = list(start)
    tail_start[d] = n - s
    head_limit = list(limit)
    head_limit[d] = n - s
    return b.concatenate([b.slice(x, tail_start, limit), b.slice(x, start, head_limit)], d)


@register("repeat")
def repeat(ctx, x, repeats):
    """Broadcast to (r0, s0, r1, s1, ...) then merge each pair: one broadcast, one reshape."""
    b = ctx.b
    out = ctx.out[0]
    if out.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    lead = len(repeats) - x.rank
    sizes = [1] * lead + list(x.shape)
    x = b.reshape(x, sizes)
    wide = [v for r, s in zip(repeats, sizes) for v in (r, s)]
    return b.reshape(b.broadcast_in_dim(x, wide, list(range(1, 2 * len(sizes), 2))), out.shape)


def _triangle(lower):
    def lower_fn(ctx, x, diagonal=0):
        b = ctx.b
        if x.type.numel == 0:
            return x
        r, c = x.shape[-2:]
        diff = b.subtract(b.iota((r, c), 1), b.iota((r, c), 0))  # col - row
        keep = b.compare(diff, b.constant(diagonal, torch.int64, (r, c)), "LE" if lower else "GE")
        keep = b.broadcast_in_dim(keep, x.shape, [x.rank - 2, x.rank - 1])
        return b.select(keep, x, b.zeros_like(x))
    return lower_fn


register("tril")(_triangle(True))
register("triu")(_triangle(False))


# -- reflection / replication padding ---------------------------------------------------------------
def _pad_source(kind, n_in, lo, n_out):
    """Input position read by each output position of one padded dim (lo may be negative: crop)."""
    src = []
    for o in range(n_out):
        i = o - lo
        if kind == "replication":
            i = min(max(i, 0), n_in - 1)
        elif i < 0:
            i = -i
        elif i >= n_in:
            i = 2 * (n_in - 1) - i
        src.append(i)
    return src


def _pad_tables(kind, x_shape, out_shape, padding):
    """(dim, source table) per padded dim; padding lists (low, high) from the last dim backwards."""
    rank = len(x_shape)
    return [(rank - 1 - i, _pad_source(kind, x_shape[rank - 1 - i], padding[2 * i], out_shape[rank - 1 - i]))
            for i in range(len(padding) // 2)]


def _padder(kind):
    def forward(ctx, x, padding):
        """Gathers along each padded dim by a host table of source positions."""
        b = ctx.b
        out = ctx.out[0]
        if out.numel == 0:
            return b.constant(0, out.dtype, out.shape)
        for d, src in _pad_tables(kind, x.shape, out.shape, padding):
            x = host_tables.take(b, x, d, src)
        return x

    def backward(ctx, gy, x, padding):
        """Sums the gradient of every output position into the input position it read."""
        from .elementwise import compute_dtype
        b = ctx.b
        out = ctx.out[0]
        if out.numel == 0 or gy.type.numel == 0:
            return b.constant(0, out.dtype, out.shape)
        g = b.convert(gy, compute_dtype(out.dtype))
        for d, src in _pad_tables(kind, x.shape, gy.shape, padding):
            g = host_tables.linear_map(b, g, d, host_tables.transpose_map([[i] for i in src], None, x.shape[d])[0])
        return b.convert(g, out.dtype)
    return forward, backward


for _kind in ("reflection", "replication"):
    _fwd, _bwd = _padder(_kind)
    for _n in (1, 2, 3):
        register(f"{_kind}_pad{_n}d")(_fwd)
        register(f"{_kind}_pad{_n}d_backward")(_bwd)


@register("select_scatter")
def select_scatter(ctx, x, src, dim, index):
    """x with x.select(dim, index) replaced by src: one dynamic_update_slice; in a bucketed graph, a
    negative index along a dimension of true size n (a runtime value) is n + index, written with a
    mask (XLA's dynamic padder refuses a dynamic update of part of a dynamic dimension)."""
    b = ctx.b
    d = dim % x.rank
    upd = b.reshape(b.convert(src, x.dtype), tuple(1 if k == d else s for k, s in enumerate(x.shape)))
    n = x.true_size(d)
    if n is not None and index < 0:
        shape = tuple(x.shape)
        at = b.add(b.convert(n, torch.int32), b.constant(index, torch.int32))
        hit = b.compare(b.iota(shape, d, torch.int32), b.broadcast_to(at, shape), "EQ")
        return b.select(hit, b.broadcast_to(upd, shape), x)
    index = index % x.shape[d]
    starts = [b.constant(index if k == d else 0, torch.int64) for k in range(x.rank)]
    return b.dynamic_update_slice(x, upd, starts)
