"""Bag reductions: aten::_embedding_bag (modes sum / mean / max, per_sample_weights, padding_idx,
include_last_offset) with its backward ops, and aten::segment_reduce with its backward.

A bag is a run of consecutive indices starting at an offset; offset2bag[i] (the bag of index i) is
the number of offsets <= i, minus one, as CPU's kernel defines it. Sums scatter-add gathered weight
rows into their bag (half precision accumulates in float32, as CPU does). Max follows CPU's running
update `if first or value > current`: the result is the earliest maximum of the bag, NaN only when
the bag's first element is NaN (a later NaN is never greater). Indices equal to padding_idx take
no part and are not counted in bag_size. Empty bags give 0 (and max index 0).

Out-of-range indices and malformed offsets are refused before anything runs (`check`, a host sync),
with CPU's RuntimeError, since StableHLO gather/scatter would clamp or drop them silently.
"""
from __future__ import annotations

import torch

from .elementwise import compute_dtype
from .helpers import points
from .reduction import reduce_sum
from .registry import NotLowered, check_reads, fit, register

MODE_SUM, MODE_MEAN, MODE_MAX = 0, 1, 2


# -- helpers ------------------------------------------------------------------------------------
def _offset2bag(b, offsets, n):
    """(n,) int64: for each index position i, the number of offsets <= i minus one."""
    nb = offsets.shape[0]
    if nb == 0:
        return b.constant(-1, torch.int64, (n,))
    pos = b.iota((n, nb), 0)
    le = b.compare(b.broadcast_in_dim(offsets, (n, nb), [1]), pos, "LE")
    return b.subtract(reduce_sum(b, b.convert(le, torch.int64), [1]), b.constant(1, torch.int64, (n,)))


def _rows(b, table, idx, n):
    """table[idx] for a rank-1 int64 idx of n elements (idx clamped into range: callers mask)."""
    hi = table.shape[0] - 1
    idx = b.clamp(b.constant(0, torch.int64), idx, b.constant(max(hi, 0), torch.int64))
    return b.gather(table, b.reshape(idx, (n, 1)), offset_dims=list(range(1, table.rank)), collapsed=[0],
                    start_index_map=[0], index_vector_dim=1, slice_sizes=[1] + list(table.shape[1:]),
                    out_shape=(n,) + tuple(table.shape[1:]))


def _scatter_rows(b, init, idx, upd, combine):
    """init[idx[i]] = combine(init[idx[i]], upd[i]) along dim 0; out-of-range idx[i] are dropped."""
    n = idx.shape[0]
    return b.scatter(init, b.reshape(idx, (n, 1)), upd, update_window_dims=list(range(1, init.rank)),
                     inserted_window_dims=[0], scatter_dims_to_operand_dims=[0], index_vector_dim=1,
                     combine=combine)


def _mask_rows(b, keep, x, value=0):
    """x where keep (rank-1, along dim 0) else value."""
    k = b.broadcast_in_dim(keep, x.shape, [0]) if x.rank > 1 else keep
    return b.select(k, x, b.constant(value, x.dtype, x.shape))


def _not_padding(b, idx, padding_idx):
    if padding_idx is None or padding_idx < 0:
        return None
    return b.compare(idx, b.full_like(idx, padding_idx), "NE")


# -- _embedding_bag ---------------------------------------------------------------------------------
@check_reads('indices', 'offsets')
def _check_embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                         per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    h = points.host_indices(indices)
    o = points.host_indices(offsets)
    if o.numel() and int(o[0]) != 0:
        raise RuntimeError("offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to "
                           f"start from position 0. However, got {int(o[0])}")
    if o.numel() and int(o[-1]) > h.numel():
        raise RuntimeError(f"offsets[-1] can not be greater than input's length {h.numel()} but got "
                           f"offsets[-1] of {int(o[-1])}")
    if o.numel() > 1 and bool((o[1:] < o[:-1]).any()):
        raise RuntimeError("embedding_bag: offsets have to be non-decreasing")
    bad = (h < 0) | (h >= weight.shape[0])
    if bool(bad.any()):
        v = int(h[bad.nonzero()[0, 0]])
        raise RuntimeError(f"embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be {v}")


@register("_embedding_bag", "_embedding_bag_forward_only", check=_check_embedding_bag)
def embedding_bag(ctx, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """The 4 results of CPU's kernel: output, offset2bag, bag_size, max_indices (shapes from meta)."""
    b = ctx.b
    out_t, o2b_t, bs_t, mi_t = ctx.out
    nbags, dim = out_t.shape
    n = indices.type.numel
    cd = compute_dtype(out_t.dtype)
    idx = b.reshape(points.to_i64(b, indices), (n,))
    offs = b.reshape(points.to_i64(b, offsets), (offsets.type.numel,))
    if offs.shape[0] != nbags:
        offs = b.slice(offs, [0], [nbags])

    def zeros(t):
        return b.constant(0, t.dtype, t.shape)

    if n == 0 or nbags == 0:
        o2b = b.constant(-1, torch.int64, (n,)) if n and nbags == 0 else b.constant(0, torch.int64, (n,))
        return (zeros(out_t), fit(b, o2b, o2b_t) if o2b_t.numel else zeros(o2b_t), zeros(bs_t), zeros(mi_t))
    o2b = _offset2bag(b, offs, n)
    keep = _not_padding(b, idx, padding_idx)
    ones = b.constant(1, torch.int64, (n,))
    counted = ones if keep is None else b.convert(keep, torch.int64)
    bag_size = _scatter_rows(b, b.constant(0, torch.int64, (nbags,)), o2b, counted,
                             points.combine_fn("sum", torch.int64))
    rows = b.convert(_rows(b, weight, idx, n), cd)                     # (n, dim)
    max_idx = None
    if mode == MODE_MAX:
        res, max_idx = _bag_max(b, rows, idx, o2b, keep, nbags, dim)
    else:
        if per_sample_weights is not None:
            psw = b.convert(b.reshape(per_sample_weights, (n,)), cd)
            rows = b.multiply(rows, b.broadcast_in_dim(psw, rows.shape, [0]))
        if keep is not None:
            rows = _mask_rows(b, keep, rows)
        res = _scatter_rows(b, b.constant(0, cd, (nbags, dim)), o2b, rows, points.combine_fn("sum", cd))
        if mode == MODE_MEAN:
            den = b.convert(b.maximum(bag_size, b.constant(1, torch.int64, (nbags,))), cd)
            res = b.divide(res, b.broadcast_in_dim(den, res.shape, [0]))
    outs = [b.convert(res, out_t.dtype)]
    outs.append(fit(b, o2b, o2b_t) if o2b_t.numel else zeros(o2b_t))
    if bs_t.numel > nbags:  # forward_only's meta sizes it like offsets: the extra entries are unused
        bag_size = b.pad(bag_size, b.constant(0, torch.int64), [0], [bs_t.numel - nbags])
    outs.append(fit(b, bag_size, bs_t) if bs_t.numel else zeros(bs_t))
    outs.append(fit(b, max_idx, mi_t) if max_idx is not None and mi_t.numel == nbags * dim else zeros(mi_t))
    return tuple(outs)


def _bag_max(b, rows, idx, o2b, keep, nbags, dim):
    """Per bag and feature, CPU's running max: the earliest maximum, or NaN when the bag's first
    element is NaN; empty bags give 0 and index 0. Returns (values, word indices)."""
    n = rows.shape[0]
    i64 = torch.int64
    pos = b.iota((n,), 0)
    big = b.constant(n, i64, (n,))
    vpos = pos if keep is None else b.select(keep, pos, big)
    first = _scatter_rows(b, b.constant(n, i64, (nbags,)), o2b, vpos, points.combine_fn("amin", i64))  # (nbags,)
    nonempty = b.compare(first, b.constant(n, i64, (nbags,)), "LT")
    # The largest non-NaN value of each bag (padding rows take no part)...
    lowest = b.constant(float("-inf"), rows.dtype, rows.shape)
    clean = b.select(b.is_nan(rows), lowest, rows)
    if keep is not None:
        clean = _mask_rows(b, keep, clean, float("-inf"))
    top = _scatter_rows(b, b.constant(float("-inf"), rows.dtype, (nbags, dim)), o2b, clean,
                        lambda s, x, y: s.maximum(x, y))
    # ...and the earliest position holding it.
    mine = _rows(b, top, o2b, n)                                         # (n, dim): my bag's max
    hit = b.compare(clean, mine, "EQ")
    if keep is not None:
        hit = b.and_(hit, b.broadcast_in_dim(keep, hit.shape, [0]))
    posd = b.select(hit, b.broadcast_in_dim(pos, hit.shape, [0]), b.constant(n, i64, hit.shape))
    arg = _scatter_rows(b, b.constant(n, i64, (nbags, dim)), o2b, posd, points.combine_fn("amin", i64))
    # A NaN first element sticks (nothing compares greater than it).
    firstc = b.clamp(b.constant(0, i64), first, b.constant(n - 1, i64))
    first_nan = b.is_nan(_rows(b, rows, firstc, nbags))                  # (nbags, dim)
    arg = b.select(first_nan, b.broadcast_in_dim(firstc, arg.shape, [0]), arg)
    arg = b.clamp(b.constant(0, i64), arg, b.constant(n - 1, i64))
    vals = points.point_gather(b, rows, points.coords(b, arg, 0, 2))
    words = _rows(b, idx, b.reshape(arg, (nbags * dim,)), nbags * dim)
    words = b.reshape(words, (nbags, dim))
    return _mask_rows(b, nonempty, vals), _mask_rows(b, nonempty, words)


# -- backward -----------------------------------------------------------------------------------------
def _bag_of(b, offset2bag, offsets, n):
    """offset2bag as given, or (CPU's fast sum path leaves it empty) recomputed from offsets."""
    if offset2bag.type.numel == n:
        return b.reshape(points.to_i64(b, offset2bag), (n,))
    if offsets is None:
        raise NotLowered("_embedding_bag backward without offset2bag")
    return _offset2bag(b, b.reshape(points.to_i64(b, offsets), (offsets.type.numel,)), n)


def _cpu_freq(b, idx, n, num_weights):
    """The count CPU's kernel divides by for scale_grad_by_freq. It walks the sorted indices group
    by group and looks the count up at sorted[g] for the g-th group (g = the number of distinct
    indices below this one) rather than at the group's own start, so a row's gradient is scaled by
    the frequency of sorted[g]; reproduced here, since CPU is the reference."""
    i64 = torch.int64
    add = points.combine_fn("sum", i64)
    counts = _scatter_rows(b, b.constant(0, i64, (num_weights,)), idx, b.constant(1, i64, (n,)), add)
    present = b.convert(b.compare(counts, b.zeros_like(counts), "GT"), i64)
    # distinct indices below each row: exclusive cumulative sum of `present`
    below = b.reduce_window([present], [b.constant(0, i64)], [num_weights], [1], [(num_weights, -1)],
                            lambda q, x, y: q.add(x, y))[0]
    group = _rows(b, below, idx, n)
    ordered = b.sort([idx], 0, lambda q, x, y: q.compare(x, y, "LT"))[0]
    return _rows(b, counts, _rows(b, ordered, group, n), n)


def _dense_backward(ctx, grad, indices, offsets, offset2bag, bag_size, max_indices, num_weights,
                    scale_grad_by_freq, mode, per_sample_weights, padding_idx):
    """Gradient of the weight: each bag's gradient row goes back to the rows that made it."""
    b = ctx.b
    out = ctx.out[0]
    cd = compute_dtype(out.dtype)
    n = indices.type.numel
    nbags, dim = grad.shape
    if out.numel == 0 or n == 0 or nbags == 0:
        return b.constant(0, out.dtype, out.shape)
    g = b.convert(grad, cd)
    add = points.combine_fn("sum", cd)
    if mode == MODE_MAX:
        # Bags that counted nothing (empty, or all padding) send no gradient.
        sizes = b.slice(b.reshape(points.to_i64(b, bag_size), (bag_size.type.numel,)), [0], [nbags])
        g = _mask_rows(b, b.compare(sizes, b.constant(0, torch.int64, (nbags,)), "NE"), g)
        words = b.reshape(points.to_i64(b, max_indices), (nbags, dim))
        r = points.point_scatter(b, b.constant(0, cd, out.shape), points.coords(b, words, 0, 2), g, add)
        return b.convert(r, out.dtype)
    idx = b.reshape(points.to_i64(b, indices), (n,))
    o2b = _bag_of(b, offset2bag, offsets, n)
    rows = _rows(b, g, o2b, n)                                           # (n, dim)
    if per_sample_weights is not None:
        psw = b.convert(b.reshape(per_sample_weights, (n,)), cd)
        rows = b.multiply(rows, b.broadcast_in_dim(psw, rows.shape, [0]))
    scale = None
    if mode == MODE_MEAN:
        sizes = b.slice(b.reshape(points.to_i64(b, bag_size), (bag_size.type.numel,)), [0], [nbags])
        sizes = b.maximum(sizes, b.constant(1, torch.int64, (nbags,)))
        scale = b.convert(_rows(b, sizes, o2b, n), cd)
    if scale_grad_by_freq:
        freq = b.convert(_cpu_freq(b, idx, n, num_weights), cd)
        scale = freq if scale is None else b.multiply(scale, freq)
    if scale is not None:
        rows = b.divide(rows, b.broadcast_in_dim(scale, rows.shape, [0]))
    keep = _not_padding(b, idx, padding_idx)
    if keep is not None:
        rows = _mask_rows(b, keep, rows)
    r = _scatter_rows(b, b.constant(0, cd, out.shape), idx, rows, add)
    return b.convert(r, out.dtype)


@register("_embedding_bag_backward")
def embedding_bag_backward(ctx, grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                           scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):
    if sparse:
        raise NotLowered("sparse embedding_bag gradient")
    return _dense_backward(ctx, grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                           scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@register("_embedding_bag_dense_backward")
def embedding_bag_dense_backward(ctx, grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                 scale_grad_by_freq, mode, per_sample_weights, padding_idx=-1):
    return _dense_backward(ctx, grad, indices, None, offset2bag, bag_size, maximum_indices, num_weights,
                           scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@register("_embedding_bag_per_sample_weights_backward")
def embedding_bag_per_sample_weights_backward(ctx, grad, weight, indices, offsets, offset2bag, mode,
                                              padding_idx=-1):
    """d output / d per_sample_weights[i]: the dot of index i's weight row with its bag's gradient."""
    b = ctx.b
    out = ctx.out[0]
    n = indices.type.numel
    if n == 0 or grad.shape[0] == 0:
        return b.constant(0, out.dtype, out.shape)
    cd = compute_dtype(out.dtype)
    idx = b.reshape(points.to_i64(b, indices), (n,))
    o2b = _bag_of(b, offset2bag, offsets, n)
    prod = b.multiply(b.convert(_rows(b, grad, o2b, n), cd), b.convert(_rows(b, weight, idx, n), cd))
    r = reduce_sum(b, prod, [1])
    keep = _not_padding(b, idx, padding_idx)
    if keep is not None:
        r = _mask_rows(b, keep, r)
    return b.convert(r, out.dtype)


# -- segment_reduce -----------------------------------------------------------------------------------
# Segment s of row p (the dims before `axis`) spans [start, end) along `axis`; elements outside every
# segment (before offsets[0], past the last end) take no part. `initial` joins every reduction
# (mean: (initial + sum) / length, and initial itself for an empty segment).
_SEG_COMBINE = {"sum": "sum", "mean": "sum", "prod": "prod", "max": "amax", "min": "amin"}


def _segment_bounds(b, lengths, offsets, axis):
    """(starts, ends), int64 of shape rows + (S,), from lengths (cumulative sums) or offsets."""
    if lengths is not None:
        ln = points.to_i64(b, lengths)
        r = ln.rank
        s = ln.shape[-1]
        window = [1] * r
        window[-1] = max(s, 1)
        padding = [(0, 0)] * r
        padding[-1] = (max(s, 1) - 1, 0)
        ends = b.reduce_window([ln], [b.constant(0, torch.int64)], window, [1] * r, padding,
                               lambda q, a, e: q.add(a, e))[0]
        return b.subtract(ends, ln), ends
    of = points.to_i64(b, offsets)
    r = of.rank
    s = of.shape[-1] - 1
    lo = [0] * r
    hi = list(of.shape)
    hi[-1] = s
    starts = b.slice(of, lo, hi)
    lo[-1], hi[-1] = 1, s + 1
    return starts, b.slice(of, lo, hi)


def _segment_ids(b, starts, ends, data_shape, axis):
    """For every element (broadcast to data's shape) its segment number along axis, or S (dropped by
    scatter, clamped by the caller's gathers) for elements outside all segments."""
    rows = tuple(data_shape[:axis])
    n = data_shape[axis]
    s = ends.shape[-1]
    grid = rows + (n, s)
    k = b.iota(grid, axis)
    ends_g = b.broadcast_in_dim(ends, grid, list(range(axis)) + [axis + 1])
    seg = reduce_sum(b, b.convert(b.compare(ends_g, k, "LE"), torch.int64), [axis + 1])   # rows + (n,)
    pos = b.iota(rows + (n,), axis)

    def edge(x, i):
        lo = [0] * x.rank
        hi = list(x.shape)
        lo[-1], hi[-1] = i, i + 1
        return b.reshape(b.slice(x, lo, hi), rows)

    inside = b.and_(b.compare(pos, b.broadcast_in_dim(edge(starts, 0), pos.shape, list(range(axis))), "GE"),
                    b.compare(pos, b.broadcast_in_dim(edge(ends, s - 1), pos.shape, list(range(axis))), "LT"))
    seg = b.select(inside, seg, b.constant(s, torch.int64, seg.shape))
    return b.broadcast_in_dim(seg, tuple(data_shape), list(range(axis + 1))), inside


def _check_segment_reduce(data, reduce, lengths=None, indices=None, offsets=None, axis=0, unsafe=False,
                          initial=None):
    if lengths is None or unsafe:
        return
    ln = lengths.detach().cpu().long()
    if ln.numel() and bool((ln < 0).any()):
        raise RuntimeError("lengths contains negative value!")
    ax = axis % max(data.dim(), 1)
    if ln.numel() and bool((ln.sum(-1) != data.shape[ax]).any()):
        raise RuntimeError("segment_reduce(): Expected all rows of lengths along axis to sum to "
                           "data.size(lengths.dim()-1) when !unsafe.")


def _initial(b, reduce, initial, cd, shape):
    if initial is not None:
        return b.broadcast_to(b.convert(initial, cd), shape)
    ident = {"sum": 0, "mean": 0, "prod": 1, "max": float("-inf"), "min": float("inf")}[reduce]
    return b.constant(ident, cd, shape)


@register("segment_reduce", check=_check_segment_reduce)
def segment_reduce(ctx, data, reduce, lengths=None, indices=None, offsets=None, axis=0, unsafe=False,
                   initial=None):
    b = ctx.b
    out = ctx.out[0]
    if indices is not None:
        raise NotLowered("segment_reduce with indices")
    cd = compute_dtype(out.dtype)
    if out.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    ax = axis % data.rank
    starts, ends = _segment_bounds(b, lengths, offsets, ax)
    x = b.convert(data, cd)
    init = _initial(b, "sum" if reduce == "mean" else reduce, None if reduce == "mean" else initial, cd, out.shape)
    if data.type.numel:
        seg, _ = _segment_ids(b, starts, ends, data.shape, ax)
        r = points.point_scatter(b, init, points.coords(b, seg, ax, data.rank), x,
                                 points.combine_fn(_SEG_COMBINE[reduce], cd))
    else:
        r = init
    if reduce == "mean":
        length = b.broadcast_in_dim(b.subtract(ends, starts), out.shape, list(range(ax + 1)))
        if initial is not None:
            r = b.add(r, b.broadcast_to(b.convert(initial, cd), out.shape))
        empty = b.compare(length, b.zeros_like(length), "EQ")
        r = b.divide(r, b.convert(length, cd))
        r = b.select(empty, _initial(b, "mean", initial, cd, out.shape) if initial is not None
                     else b.constant(float("nan"), cd, out.shape), r)
    return b.convert(r, out.dtype)


@register("_segment_reduce_backward")
def segment_reduce_backward(ctx, grad, output, data, reduce, lengths=None, offsets=None, axis=0, initial=None):
    """Gradient of data: sum copies each segment's gradient, mean divides it by the length, max/min
    share it evenly among the elements equal to the result (NaN matching NaN), prod multiplies it by
    the product of the other elements (initial included): output / x, or for a zero or NaN x the
    product computed without it."""
    b = ctx.b
    out = ctx.out[0]
    if out.numel == 0 or grad.type.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    cd = compute_dtype(out.dtype)
    ax = axis % data.rank
    starts, ends = _segment_bounds(b, lengths, offsets, ax)
    seg, inside = _segment_ids(b, starts, ends, data.shape, ax)
    nseg = grad.shape[ax]
    segc = b.clamp(b.constant(0, torch.int64), seg, b.constant(nseg - 1, torch.int64))
    coords = points.coords(b, segc, ax, data.rank)
    scoords = points.coords(b, seg, ax, data.rank)                  # outside elements: dropped by scatters
    x = b.convert(data, cd)
    g = points.point_gather(b, b.convert(grad, cd), coords)         # each element's segment gradient
    y = points.point_gather(b, b.convert(output, cd), coords)
    add = points.combine_fn("sum", cd)
    if reduce == "sum":
        r = g
    elif reduce == "mean":
        length = b.convert(b.broadcast_in_dim(b.subtract(ends, starts), grad.shape, list(range(ax + 1))), cd)
        r = b.divide(g, points.point_gather(b, length, coords))
    elif reduce in ("max", "min"):
        hit = b.or_(b.compare(x, y, "EQ"), b.and_(b.is_nan(x), b.is_nan(y)))
        ones = b.convert(hit, cd)
        count = points.point_scatter(b, b.constant(0, cd, grad.shape), scoords, ones, add)
        r = b.select(hit, b.divide(g, points.point_gather(b, count, coords)), b.zeros_like(g))
    elif reduce == "prod":
        zero = b.compare(x, b.zeros_like(x), "EQ")
        nan = b.is_nan(x)
        special = b.or_(zero, nan)
        plain = b.select(special, b.constant(1, cd, x.shape), x)
        pn = points.point_scatter(b, _initial(b, "prod", initial, cd, grad.shape), scoords, plain,
                                  points.combine_fn("prod", cd))
        nz = points.point_scatter(b, b.constant(0, cd, grad.shape), scoords, b.convert(zero, cd), add)
        nn = points.point_scatter(b, b.constant(0, cd, grad.shape), scoords, b.convert(nan, cd), add)
        other_z = b.subtract(points.point_gather(b, nz, coords), b.convert(zero, cd))
        other_n = b.subtract(points.point_gather(b, nn, coords), b.convert(nan, cd))
        excl = points.point_gather(b, pn, coords)
        excl = b.select(b.compare(other_z, b.zeros_like(x), "GT"), b.multiply(excl, b.zeros_like(x)), excl)
        excl = b.select(b.compare(other_n, b.zeros_like(x), "GT"), b.constant(float("nan"), cd, x.shape), excl)
        r = b.multiply(g, b.select(special, excl, b.divide(y, x)))
    else:
        raise NotLowered(f"segment_reduce backward for {reduce}")
    inside_full = b.broadcast_in_dim(inside, x.shape, list(range(ax + 1)))
    return b.convert(b.select(inside_full, r, b.zeros_like(r)), out.dtype)
