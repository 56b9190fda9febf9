"""Lowerings that only a compiled (functionalized) graph uses: views, view scatters, factories, casts.

Eager runs these ops as metadata kernels (a view aliases its base's storage) or as composites, so
they are registered `graph_only` and get no eager kernel. A functionalized FX graph has value
semantics: a view is just the value it reads, and `slice_scatter` & co. are the writes, so each
lowers to a few StableHLO ops. Same convention as every lowering (registry.py).
"""
from __future__ import annotations

import math

import torch

from .builder import Value
from .registry import REGISTRY, register
from .strided import contiguous_strides, read_view, write_view


def graph_register(*names):
    return register(*names, graph_only=True)


# -- value-preserving views -----------------------------------------------------------------------
@graph_register("alias", "detach", "lift_fresh_copy", "alias_copy", "detach_copy", "lift_fresh")
def _identity(ctx, x, *rest):
    return x


@graph_register("view", "_unsafe_view", "reshape", "view_copy", "unsqueeze", "squeeze", "squeeze.dim",
                "squeeze.dims", "unsqueeze_copy", "squeeze_copy.dim", "squeeze_copy.dims", "flatten.using_ints",
                "_reshape_alias", "view.dtype")
def _reshape(ctx, x, *rest):
    o = ctx.out[0]
    if x.dtype != o.dtype:  # view.dtype: same item size (checked by meta)
        return ctx.b.reshape(ctx.b.bitcast_convert(x, o.dtype), o.shape)
    return ctx.b.reshape(x, o.shape)


@graph_register("view_as_real", "view_as_real_copy")
def _view_as_real(ctx, x):
    """(..., ) complex -> (..., 2) of its (real, imag) parts, the storage's interleaved layout."""
    b = ctx.b
    parts = [b.reshape(f(x), (*x.shape, 1)) for f in (b.real_part, b.imag_part)]
    return b.concatenate(parts, x.rank)


@graph_register("view_as_complex", "view_as_complex_copy")
def _view_as_complex(ctx, x):
    """(..., 2) float -> (..., ) complex whose parts are the last dim's two entries."""
    b = ctx.b
    n = x.rank - 1
    re, im = (b.reshape(b.slice(x, [0] * n + [k], [*x.shape[:n], k + 1]), x.shape[:n]) for k in (0, 1))
    return b.make_complex(re, im)


@graph_register("permute", "permute_copy")
def _permute(ctx, x, dims):
    return ctx.b.transpose(x, [d % max(x.rank, 1) for d in dims]) if x.rank else x


@graph_register("t", "t_copy")
def _t(ctx, x):
    return ctx.b.transpose(x, [1, 0]) if x.rank == 2 else x


@graph_register("transpose.int", "transpose_copy.int")
def _transpose(ctx, x, d0, d1):
    if x.rank < 2:
        return x
    perm = list(range(x.rank))
    d0, d1 = d0 % x.rank, d1 % x.rank
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return ctx.b.transpose(x, perm)


@graph_register("expand", "expand_copy")
def _expand(ctx, x, size, implicit=False):
    return ctx.b.broadcast_to(x, ctx.out[0].shape)


def _slice_bounds(size, start, end, step):
    start = 0 if start is None else start
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end, step


def _from_the_end(b, x: Value, dim: int, n: Value, start: int, k: int, shape) -> Value:
    """x[..., n + start : n + start + k, ...] along `dim` (start < 0), n the true size there (a
    runtime value): a window at a runtime start, of `shape`. A gather of slice size 1 along `dim`
    (XLA's dynamic padder refuses a dynamic_slice that selects part of a dynamic dimension)."""
    at = b.maximum(b.add(b.convert(n, torch.int32), b.constant(start, torch.int32)), b.constant(0, torch.int32))
    idx = b.add(b.iota((k, 1), 0, torch.int32), b.broadcast_to(at, (k, 1)))
    return b.gather(x, idx, [d for d in range(x.rank) if d != dim], [dim], [dim], 1,
                    [1 if d == dim else m for d, m in enumerate(x.shape)], shape)


@graph_register("slice.Tensor", "slice_copy.Tensor")
def _slice(ctx, x, dim=0, start=None, end=None, step=1):
    b, o = ctx.b, ctx.out[0]
    dim %= x.rank
    n = x.true_size(dim)
    if n is not None and start is not None and start < 0:
        # A bucketed dimension sliced from the end (logits[:, -k:]; dynamo/buckets.py allows this only
        # to the end, with step 1, for an output of static size k).
        return _from_the_end(b, x, dim, n, start, o.shape[dim], o.shape)
    s, e, step = _slice_bounds(x.shape[dim], start, end, step)
    if o.numel == 0:
        return b.constant(0, o.dtype, o.shape)
    lo = [0] * x.rank
    hi = list(x.shape)
    st = [1] * x.rank
    lo[dim], hi[dim], st[dim] = s, e, step
    return b.slice(x, lo, hi, st)


@graph_register("select.int", "select_copy.int")
def _select(ctx, x, dim, index):
    b = ctx.b
    dim %= x.rank
    n = x.true_size(dim)
    if n is not None and index < 0:  # a bucketed dimension, counted from its true end (x[:, -1])
        row = _from_the_end(b, x, dim, n, index, 1, tuple(1 if d == dim else m for d, m in enumerate(x.shape)))
        return b.reshape(row, ctx.out[0].shape)
    index = index + x.shape[dim] if index < 0 else index
    lo = [0] * x.rank
    hi = list(x.shape)
    lo[dim], hi[dim] = index, index + 1
    return b.reshape(b.slice(x, lo, hi), ctx.out[0].shape)


@graph_register("split_with_sizes", "split.Tensor", "split_with_sizes_copy", "split_copy.Tensor", "unbind.int",
                "chunk")
def _split(ctx, x, *args):
    """Every piece's shape comes from meta; pieces are consecutive along the one dim they differ in."""
    b = ctx.b
    dim = args[-1] if args else 0  # schema order: the dim is always last (defaults are filled in)
    dim %= max(x.rank, 1)
    outs, start = [], 0
    for t in ctx.out:
        if len(t.shape) == x.rank:
            n = t.shape[dim]
            lo = [0] * x.rank
            hi = list(x.shape)
            lo[dim], hi[dim] = start, start + n
        else:  # unbind: one index, dim removed
            n = 1
            lo = [0] * x.rank
            hi = list(x.shape)
            lo[dim], hi[dim] = start, start + 1
        outs.append(b.reshape(b.slice(x, lo, hi), t.shape))
        start += n
    return outs


def _strided_read(ctx, x, offset, sizes, strides):
    """A view of x given in x's contiguous element strides (x's value is its storage, row-major)."""
    b, o = ctx.b, ctx.out[0]
    flat = b.reshape(x, [x.type.numel])
    return read_view(b, flat, offset, sizes, strides, o.dtype)


@graph_register("diagonal", "diagonal_copy")
def _diagonal(ctx, x, offset=0, dim1=0, dim2=1):
    o = ctx.out[0]
    st = contiguous_strides(x.shape)
    d1, d2 = dim1 % x.rank, dim2 % x.rank
    start = offset * st[d2] if offset >= 0 else -offset * st[d1]
    keep = [d for d in range(x.rank) if d not in (d1, d2)]
    return _strided_read(ctx, x, start if o.numel else 0, o.shape, [st[d] for d in keep] + [st[d1] + st[d2]])


@graph_register("unfold", "unfold_copy")
def _unfold(ctx, x, dim, size, step):
    o = ctx.out[0]
    if x.rank == 0:
        return ctx.b.reshape(x, o.shape)
    st = contiguous_strides(x.shape)
    dim %= x.rank
    strides = list(st)
    strides[dim] = st[dim] * step
    return _strided_read(ctx, x, 0, o.shape, strides + [st[dim]])


@graph_register("as_strided", "as_strided_copy")
def _as_strided(ctx, x, size, stride, storage_offset=None):
    _require_base(ctx, x, "as_strided")
    return _strided_read(ctx, x, storage_offset or 0, ctx.out[0].shape, stride)


def _require_base(ctx, x, name):
    ex = x.example
    if ex is not None and isinstance(ex, torch.Tensor) and not (ex.is_contiguous() and ex.storage_offset() == 0):
        raise NotImplementedError(f"aten::{name} of a non-contiguous value inside a compiled graph")


# -- scatters: the writes of a functionalized view mutation ---------------------------------------
def _strided_write(ctx, base, src, offset, sizes, strides):
    b, o = ctx.b, ctx.out[0]
    flat = b.reshape(base, [base.type.numel])
    src = b.broadcast_to(b.convert(src, o.dtype), tuple(sizes))
    return b.reshape(write_view(b, flat, offset, sizes, strides, src), o.shape)


@graph_register("slice_scatter")
def _slice_scatter(ctx, base, src, dim=0, start=None, end=None, step=1):
    st = contiguous_strides(base.shape)
    dim %= base.rank
    s, e, step = _slice_bounds(base.shape[dim], start, end, step)
    sizes = list(base.shape)
    sizes[dim] = len(range(s, e, step))
    strides = list(st)
    strides[dim] = st[dim] * step
    return _strided_write(ctx, base, src, s * st[dim], sizes, strides)


@graph_register("diagonal_scatter")
def _diagonal_scatter(ctx, base, src, offset=0, dim1=0, dim2=1):
    st = contiguous_strides(base.shape)
    d1, d2 = dim1 % base.rank, dim2 % base.rank
    start = offset * st[d2] if offset >= 0 else -offset * st[d1]
    keep = [d for d in range(base.rank) if d not in (d1, d2)]
    return _strided_write(ctx, base, src, start if math.prod(src.shape) else 0, src.shape,
                          [st[d] for d in keep] + [st[d1] + st[d2]])


@graph_register("as_strided_scatter")
def _as_strided_scatter(ctx, base, src, size, stride, storage_offset=None):
    _require_base(ctx, base, "as_strided_scatter")
    return _strided_write(ctx, base, src, storage_offset or 0, size, stride)


# -- factories and casts ----------------------------------------------------------------------------
def _filled(ctx, value):
    b, o = ctx.b, ctx.out[0]
    if value is None:
        return b.constant(0, o.dtype, o.shape)
    return b.broadcast_to(b.convert(value, o.dtype), o.shape)


@graph_register("full", "new_full")
def _full(ctx, *args):
    return _filled(ctx, args[1] if len(args) > 1 else None)


@graph_register("full_like")
def _full_like(ctx, x, fill_value, *rest):
    return _filled(ctx, fill_value)


@graph_register("scalar_tensor")
def _scalar_tensor(ctx, s, *rest):
    return _filled(ctx, s)


@graph_register("empty.memory_format", "empty_strided", "empty_like", "zeros_like", "new_empty", "new_zeros",
                "new_empty_strided", "zeros", "empty_permuted")
def _zeros(ctx, *args, **kw):
    # Uninitialised memory in PyTorch: zeros here (any value is valid).
    return ctx.b.constant(0, ctx.out[0].dtype, ctx.out[0].shape)


@graph_register("ones_like", "new_ones", "ones")
def _ones(ctx, *args, **kw):
    return ctx.b.constant(1, ctx.out[0].dtype, ctx.out[0].shape)


@graph_register("_to_copy", "to.dtype", "to.device", "to.dtype_layout", "_to_copy.default",
                "prims::convert_element_type")
def _to_copy(ctx, x, *rest):
    return ctx.b.convert(x, ctx.out[0].dtype)


@graph_register("arange.start_step")
def _arange_start_step(ctx, start, end, step=None, *rest):
    return REGISTRY["arange.start_out"].fn(ctx, start, end, step if step is not None else _one(ctx), None)


@graph_register("arange.start")
def _arange_start(ctx, start, end, *rest):
    return REGISTRY["arange.start_out"].fn(ctx, start, end, _one(ctx), None)


@graph_register("arange")
def _arange(ctx, end, *rest):
    return REGISTRY["arange.start_out"].fn(ctx, _zero(ctx), end, _one(ctx), None)


def _one(ctx):
    c = ctx.b.constant(1, torch.int64)
    return Value(c.name, c.type, 1)


def _zero(ctx):
    c = ctx.b.constant(0, torch.int64)
    return Value(c.name, c.type, 0)


# -- checks that have nothing to compute ----------------------------------------------------------
@graph_register("_assert_tensor_metadata", "_assert_async", "_assert_async.msg", "_assert_scalar",
                "_functional_assert_async.msg", "record_stream")
def _no_value(ctx, *args, **kw):
    return []
