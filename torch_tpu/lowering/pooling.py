"""Pooling over the last 1, 2 or 3 dims: max_pool{2,3}d_with_indices, avg_pool{2,3}d,
_adaptive_avg_pool{2,3}d, adaptive_max_pool{2,3}d, fractional_max_pool{2,3}d and their backward ops.
(The 1-d ops are PyTorch composites over the 2-d ones.)

Each op is written once for N spatial dims (any leading dims: (N, C, *S) or (C, *S)). Max pooling
scans the window positions in CPU order so that values and indices (flat positions within each
input plane) match CPU exactly, ties and NaNs included; its backward routes each window's gradient
to its index (no scatter). Average pooling divides by the same per-window divisor as CPU. Adaptive pooling windows
[floor(i*n/o), ceil((i+1)*n/o)) differ in size, so they are host tables of taps gathered per dim
(upsample.linear_map): sums for the average (so an inf or NaN stays in its own windows), a
(value, index) max-reduction for the max. Half precision is computed in float32 and rounded once.
"""
from __future__ import annotations

import itertools
import math

import torch

from .elementwise import compute_dtype
from .helpers import host_tables
from .helpers.checks import not_implemented
from .registry import register


def _tuple(v, n, default=None):
    """An int[n] argument as a list of n ints (a single value repeats; [] takes `default`)."""
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if not v and default is not None:
        return list(default)
    return v * n if len(v) == 1 else v


def _grid(b, shape, lead, dim, values):
    """Broadcasts a 1-D i64 Value along spatial dim `dim` of `shape` (a position grid)."""
    return b.broadcast_in_dim(values, shape, [lead + dim])


def _starts(b, n, stride, pad, dtype=torch.int64):
    """Window starts o*stride - pad for o in [0, n), as a vector of `dtype`."""
    o = b.iota((n,), 0, dtype)
    return b.subtract(b.multiply(o, b.constant(stride, dtype, (n,))), b.constant(pad, dtype, (n,)))


def _clip(b, v, lo=None, hi=None):
    if lo is not None:
        v = b.maximum(v, b.constant(lo, v.dtype, v.shape))
    if hi is not None:
        v = b.minimum(v, b.constant(hi, v.dtype, v.shape))
    return v


def _lowest(dt):
    return float("-inf") if dt.is_floating_point else torch.iinfo(dt).min


def _strides(sizes):
    """Row-major strides of a spatial shape (flat index = sum pos * stride)."""
    out, acc = [], 1
    for n in reversed(sizes):
        out.insert(0, acc)
        acc *= n
    return out


# -- max pooling ------------------------------------------------------------------------------------
def _max_pool(ctx, x, n, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    """max_pool{n}d_with_indices: one strided slice per window position, kept where it beats the
    running max (or is NaN: CPU lets a NaN in, and a later NaN replace it)."""
    b = ctx.b
    dt = x.dtype
    if dt == torch.bool:
        not_implemented(f"max_pool{n}d", dt)
    k = _tuple(kernel_size, n)
    s, p, d = _tuple(stride, n, k), _tuple(padding, n), _tuple(dilation, n)
    out_shape = ctx.out[0].shape
    if ctx.out[0].numel == 0:
        return b.constant(0, dt, out_shape), b.constant(0, torch.int64, out_shape)
    lead = x.rank - n
    size, n_out = x.shape[lead:], out_shape[lead:]
    lowest = _lowest(dt)
    hi = [max(0, (o - 1) * st + dd * (kk - 1) + 1 - m - pp) for o, st, dd, kk, m, pp in zip(n_out, s, d, k, size, p)]
    xp = b.pad(x, b.constant(lowest, dt), [0] * lead + p, [0] * lead + hi)
    # Positions in 32 bits where a plane allows (TPUs emulate 64-bit integers, at about twice the
    # bytes); the indices are int64 only at the end, which the backward's narrowing cancels in one graph.
    it = torch.int32 if math.prod(size) + max(p) < 2 ** 31 else torch.int64
    starts = [_starts(b, n_out[i], s[i], p[i], it) for i in range(n)]
    strides = _strides(size)

    def first_valid(v, dd):
        # The index CPU reports when no element beats -inf: the window's first position inside the input.
        neg = _clip(b, b.negate(v), lo=0)
        steps = b.divide(b.add(neg, b.constant(dd - 1, it, v.shape)), b.constant(dd, it, v.shape))
        return b.add(v, b.multiply(steps, b.constant(dd, it, v.shape)))

    def flat(pos):
        acc = None
        for i, v in enumerate(pos):
            t = _grid(b, out_shape, lead, i, b.multiply(v, b.constant(strides[i], it, v.shape)))
            acc = t if acc is None else b.add(acc, t)
        return acc

    best = b.constant(lowest, dt, out_shape)
    idx = flat([first_valid(starts[i], d[i]) for i in range(n)])
    for offs in itertools.product(*[range(kk) for kk in k]):
        start = [0] * lead + [o * dd for o, dd in zip(offs, d)]
        limit = list(out_shape[:lead]) + [o * dd + (m - 1) * st + 1 for o, dd, m, st in zip(offs, d, n_out, s)]
        v = b.slice(xp, start, limit, [1] * lead + s)
        upd = b.compare(v, best, "GT")
        if dt.is_floating_point:
            upd = b.or_(upd, b.is_nan(v))
        pos = [b.add(starts[i], b.constant(offs[i] * d[i], it, starts[i].shape)) for i in range(n)]
        best = b.select(upd, v, best)
        idx = b.select(upd, flat(pos), idx)
    return best, b.convert(idx, torch.int64)


def _scatter_back(b, gy, n, in_shape, indices, out_dtype):
    """Gradient of a max-type pooling: grad_output scatter-added to the flat input positions
    `indices` of each plane (the last n dims of in_shape)."""
    cd = compute_dtype(out_dtype)
    lead = in_shape[:len(in_shape) - n]
    planes = math.prod(lead)
    plane = math.prod(in_shape[len(in_shape) - n:])
    m = math.prod(gy.shape[len(gy.shape) - n:])
    if planes * plane == 0 or m == 0:
        return b.constant(0, out_dtype, in_shape)
    g = b.reshape(b.convert(gy, cd), (planes, m))
    i = b.reshape(indices, (planes, m, 1))
    where = b.concatenate([b.iota((planes, m, 1), 0), i], 2)
    gi = b.scatter(b.constant(0, cd, (planes, plane)), where, g, [], [0, 1], [0, 1], 2,
                   combine=lambda bb, old, new: bb.add(old, new))
    return b.convert(b.reshape(gi, in_shape), out_dtype)


def _max_pool_backward(ctx, gy, x, kernel_size, stride, padding, dilation, ceil_mode, indices, n):
    """max_pool{n}d_with_indices_backward without a scatter (slow on TPU, and in 64-bit integers).
    Non-overlapping windows (stride = kernel, no dilation or padding: the common 2x2/2): the windows'
    gradients and indices are repeated over their windows' grid (broadcast and reshape) and an input
    position takes its window's gradient where the index is that position: one elementwise pass.
    Others: each window's recorded index says which offset it took (compared at output resolution);
    per offset, the gradients of the windows that took it are spread to input resolution
    (stablehlo.pad with interior padding stride - 1, edges shifted by the offset) and added.
    Indices are those max_pool{n}d_with_indices gives (each inside its own window), as autograd
    passes them."""
    b = ctx.b
    out_dtype = ctx.out[0].dtype
    in_shape = tuple(x.shape)
    lead = len(in_shape) - n
    size, n_out = in_shape[lead:], tuple(gy.shape[lead:])
    if math.prod(in_shape) == 0 or math.prod(gy.shape) == 0:
        return b.constant(0, out_dtype, in_shape)
    k = _tuple(kernel_size, n)
    s, p, d = _tuple(stride, n, k), _tuple(padding, n), _tuple(dilation, n)
    cd = compute_dtype(out_dtype)
    it = torch.int32 if math.prod(size) < 2 ** 31 else torch.int64  # TPUs emulate 64-bit integers
    g, idx = b.convert(gy, cd), b.convert(indices, it)
    shape = tuple(gy.shape)
    strides = _strides(size)
    if s == k and all(dd == 1 for dd in d) and not any(p):
        # Non-overlapping windows: each input position of a window's grid takes the window's
        # gradient where the window's index is that position (one elementwise pass, fused by XLA).
        grid = [o * kk for o, kk in zip(n_out, k)]
        up_shape = (*shape[:lead], *[e for o, kk in zip(n_out, k) for e in (o, kk)])
        dims = list(range(lead)) + [lead + 2 * i for i in range(n)]

        def up(v):
            return b.reshape(b.broadcast_in_dim(v, up_shape, dims), (*shape[:lead], *grid))
        here = None
        full = (*shape[:lead], *grid)
        for i, st in enumerate(strides):
            t = b.multiply(b.iota(full, lead + i, it), b.constant(st, it, full))
            here = t if here is None else b.add(here, t)
        acc = b.select(b.compare(up(idx), here, "EQ"), up(g), b.constant(0, cd, full))
        high = [m - gg for m, gg in zip(size, grid)]
        if any(high):
            acc = b.pad(acc, b.constant(0, cd), [0] * len(in_shape), [0] * lead + high)
        return b.convert(acc, out_dtype)
    # The recorded index less its window's first position (flat, in the plane): the offset it took,
    # flattened; window offsets are told apart by it as each stays inside its window.
    first = None
    for i, st in enumerate(strides):
        t = _grid(b, shape, lead, i, b.multiply(_starts(b, n_out[i], s[i], p[i], it), b.constant(st, it, (n_out[i],))))
        first = t if first is None else b.add(first, t)
    rel = b.subtract(idx, first)
    zero = b.constant(0, cd, shape)
    acc = None
    for offs in itertools.product(*[range(kk) for kk in k]):
        flat = sum(o * dd * st for o, dd, st in zip(offs, d, strides))
        part = b.select(b.compare(rel, b.constant(flat, it, shape), "EQ"), g, zero)
        low = [o * dd - pp for o, dd, pp in zip(offs, d, p)]
        high = [m - lo - (no - 1) * st - 1 for m, lo, no, st in zip(size, low, n_out, s)]
        low, high, interior = [0] * lead + low, [0] * lead + high, [0] * lead + [st - 1 for st in s]
        spread = b.pad(part, b.constant(0, cd), low, high, interior)
        acc = spread if acc is None else b.add(acc, spread)
    return b.convert(acc, out_dtype)


# -- average pooling ----------------------------------------------------------------------------------
def _avg_divisor(b, shape, lead, size, k, s, p, n_out, count_include_pad, divisor_override, cd):
    """CPU's divide factor per output position, broadcast to `shape`, in compute dtype `cd`."""
    if divisor_override is not None:
        return b.constant(divisor_override, cd, shape)
    div = None
    for i in range(len(k)):
        start = _starts(b, n_out[i], s[i], p[i])
        end = _clip(b, b.add(start, b.constant(k[i], torch.int64, start.shape)), hi=size[i] + p[i])
        if not count_include_pad:
            start, end = _clip(b, start, lo=0), _clip(b, end, hi=size[i])
        t = _grid(b, shape, lead, i, b.subtract(end, start))
        div = t if div is None else b.multiply(div, t)
    div = _clip(b, div, lo=1)  # windows with no input element give 0 (their sum is 0)
    return b.convert(div, cd)


def _avg_args(n, kernel_size, stride, padding):
    k = _tuple(kernel_size, n)
    return k, _tuple(stride, n, k), _tuple(padding, n)


def _avg_pool(ctx, x, n, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    """avg_pool{n}d: window sums by reduce_window over the zero-padded input, / CPU's divisor."""
    b = ctx.b
    out = ctx.out[0]
    if not (out.dtype.is_floating_point or out.dtype == torch.int64):
        not_implemented(f"avg_pool{n}d" if n == 2 else f"avg_pool{n}d_out_frame", out.dtype)
    if out.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    cd = compute_dtype(out.dtype)
    k, s, p = _avg_args(n, kernel_size, stride, padding)
    lead = x.rank - n
    size, n_out = x.shape[lead:], out.shape[lead:]
    hi = [max(0, (o - 1) * st + kk - m - pp) for o, st, kk, m, pp in zip(n_out, s, k, size, p)]
    zero = b.constant(0, cd)
    xp = b.pad(b.convert(x, cd), zero, [0] * lead + p, [0] * lead + hi)
    total = b.reduce_window([xp], [zero], [1] * lead + k, [1] * lead + s, [(0, 0)] * x.rank,
                            lambda bb, a, e: bb.add(a, e))[0]
    total = b.slice(total, [0] * x.rank, list(out.shape))
    div = _avg_divisor(b, out.shape, lead, size, k, s, p, n_out, count_include_pad, divisor_override, cd)
    return b.convert(b.divide(total, div), out.dtype)


def _avg_pool_backward(ctx, gy, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override=None, n=2):
    b = ctx.b
    out = ctx.out[0]
    if out.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    cd = compute_dtype(out.dtype)
    k, s, p = _avg_args(n, kernel_size, stride, padding)
    lead = x.rank - n
    size, n_out = x.shape[lead:], gy.shape[lead:]
    if gy.type.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    g = b.divide(b.convert(gy, cd),
                 _avg_divisor(b, gy.shape, lead, size, k, s, p, n_out, count_include_pad, divisor_override, cd))
    # Each window position sends g to padded-input positions off + o*s: an interior-padded copy.
    full = [max(m + 2 * pp, (o - 1) * st + kk) for m, pp, o, st, kk in zip(size, p, n_out, s, k)]
    zero = b.constant(0, cd)
    acc = None
    for lo in itertools.product(*[range(kk) for kk in k]):
        hi = [f - (l + (o - 1) * st + 1) for f, l, o, st in zip(full, lo, n_out, s)]
        part = b.pad(g, zero, [0] * lead + list(lo), [0] * lead + hi, [0] * lead + [st - 1 for st in s])
        acc = part if acc is None else b.add(acc, part)
    gi = b.slice(acc, [0] * lead + p, list(x.shape[:lead]) + [pp + m for pp, m in zip(p, size)])
    return b.convert(gi, out.dtype)


# -- adaptive pooling -----------------------------------------------------------------------------
def _adaptive_windows(n_in, n_out):
    """Per output position, the input positions of its window [floor(o*n/m), ceil((o+1)*n/m))."""
    return [list(range((o * n_in) // n_out, -(-((o + 1) * n_in) // n_out))) for o in range(n_out)]


def _adaptive_avg(ctx, x, n, output_size):
    """_adaptive_avg_pool{n}d: window sums along each dim (innermost first), / window volume."""
    b = ctx.b
    out = ctx.out[0]
    if not out.dtype.is_floating_point:
        not_implemented("adaptive_avg_pool2d" if n == 2 else f"adaptive_avg_pool{n}d_cpu", out.dtype)
    if out.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    cd = compute_dtype(out.dtype)
    lead = x.rank - n
    y = b.convert(x, cd)
    div = None
    for d in reversed(range(n)):
        win = _adaptive_windows(x.shape[lead + d], out.shape[lead + d])
        y = host_tables.linear_map(b, y, lead + d, win)
        cnt = b.broadcast_in_dim(host_tables.const_table(b, [len(r) for r in win], cd), out.shape, [lead + d])
        div = cnt if div is None else b.multiply(div, cnt)
    return b.convert(b.divide(y, div), out.dtype)


def _adaptive_avg_backward(ctx, gy, x, n):
    """Each output's gradient / its window volume, summed back over the windows (transposed taps)."""
    b = ctx.b
    out = ctx.out[0]
    if out.numel == 0 or gy.type.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    cd = compute_dtype(out.dtype)
    lead = x.rank - n
    g = b.convert(gy, cd)
    div = None
    wins = [_adaptive_windows(x.shape[lead + d], gy.shape[lead + d]) for d in range(n)]
    for d in range(n):
        cnt = b.broadcast_in_dim(host_tables.const_table(b, [len(r) for r in wins[d]], cd), gy.shape, [lead + d])
        div = cnt if div is None else b.multiply(div, cnt)
    g = b.divide(g, div)
    for d in reversed(range(n)):
        g = host_tables.linear_map(b, g, lead + d, host_tables.transpose_map(wins[d], None, x.shape[lead + d])[0])
    return b.convert(g, out.dtype)


def _max_index_pick(bb, v1, i1, v2, i2):
    """(value, index) max in CPU's scan order: a NaN beats everything and the later NaN wins;
    otherwise the larger value, and among equal values the earlier position."""
    if v1.dtype.is_floating_point:
        n1, n2 = bb.is_nan(v1), bb.is_nan(v2)
        later = bb.compare(i1, i2, "GT")
        earlier = bb.compare(i1, i2, "LT")
        first = bb.select(bb.and_(n1, n2), later,
                          bb.select(n1, bb.constant(True, torch.bool), bb.select(
                              n2, bb.constant(False, torch.bool),
                              bb.or_(bb.compare(v1, v2, "GT"), bb.and_(bb.compare(v1, v2, "EQ"), earlier)))))
    else:
        first = bb.or_(bb.compare(v1, v2, "GT"), bb.and_(bb.compare(v1, v2, "EQ"), bb.compare(i1, i2, "LT")))
    return [bb.select(first, v1, v2), bb.select(first, i1, i2)]


def _window_max(b, x, n, wins, lead):
    """Max with flat index over per-dim window tables wins[d] (ragged (m_d, L_d) input positions):
    the taps of all dims are gathered, then one (value, index) reduce over the tap dims."""
    dt = x.dtype
    sizes = x.shape[lead:]
    strides = _strides(sizes)
    Ls = [max(len(r) for r in w) for w in wins]
    y = x
    for d in reversed(range(n)):  # (.., m_d, L_d, ..): tap dim right after each output dim
        padded = [r + [r[0]] * (Ls[d] - len(r)) for r in wins[d]]
        y = host_tables.take(b, y, lead + d, padded)
    # flat input index of every tap, and the mask of real (not padding) taps
    flat, valid = None, None
    for d in range(n):
        pos = [[(r[l] if l < len(r) else 0) * strides[d] for l in range(Ls[d])] for r in wins[d]]
        ok = [[l < len(r) for l in range(Ls[d])] for r in wins[d]]
        dims = [lead + 2 * d, lead + 2 * d + 1]
        t = b.broadcast_in_dim(host_tables.const_table(b, pos, torch.int64), y.shape, dims)
        flat = t if flat is None else b.add(flat, t)
        if not all(all(r) for r in ok):
            m = b.broadcast_in_dim(host_tables.const_table(b, ok, torch.bool), y.shape, dims)
            valid = m if valid is None else b.and_(valid, m)
    if valid is not None:  # padding taps: lowest value, an index that loses every tie
        y = b.select(valid, y, b.constant(_lowest(dt), dt, y.shape))
        flat = b.select(valid, flat, b.constant(2 ** 62, torch.int64, y.shape))
    tap_dims = [lead + 2 * d + 1 for d in range(n)]
    v, i = b.reduce([y, flat], [b.constant(_lowest(dt), dt), b.constant(2 ** 62, torch.int64)], tap_dims,
                    _max_index_pick)
    return v, i


def _adaptive_max(ctx, x, n, output_size):
    """adaptive_max_pool{n}d: (value, flat index) of each adaptive window."""
    b = ctx.b
    out = ctx.out[0]
    if not out.dtype.is_floating_point:
        not_implemented("adaptive_max_pool2d" if n == 2 else f"adaptive_max_pool{n}d_cpu", out.dtype)
    if out.numel == 0:
        return b.constant(0, out.dtype, out.shape), b.constant(0, torch.int64, out.shape)
    lead = x.rank - n
    wins = [_adaptive_windows(x.shape[lead + d], out.shape[lead + d]) for d in range(n)]
    return _window_max(b, x, n, wins, lead)


def _adaptive_max_backward(ctx, gy, x, indices, n):
    return _scatter_back(ctx.b, gy, n, x.shape, indices, ctx.out[0].dtype)


# -- registration: one lowering per op, the spatial rank bound --------------------------------------
def _bind(fn, n):
    def lower(ctx, *args):
        return fn(ctx, args[0], n, *args[1:])
    lower.__name__ = fn.__name__.lstrip("_") + f"{n}d"
    lower.__doc__ = fn.__doc__
    return lower


def _bind_tail(fn, n):
    """For backward ops whose spatial rank goes last."""
    def lower(ctx, *args):
        return fn(ctx, *args, n=n)
    lower.__name__ = fn.__name__.lstrip("_") + f"{n}d"
    return lower


for _n in (2, 3):
    register(f"max_pool{_n}d_with_indices")(_bind(_max_pool, _n))
    register(f"max_pool{_n}d_with_indices_backward")(_bind_tail(_max_pool_backward, _n))
    register(f"avg_pool{_n}d")(_bind(_avg_pool, _n))
    register(f"avg_pool{_n}d_backward")(_bind_tail(_avg_pool_backward, _n))
    register(f"_adaptive_avg_pool{_n}d")(_bind(_adaptive_avg, _n))
    register(f"_adaptive_avg_pool{_n}d_backward")(_bind_tail(_adaptive_avg_backward, _n))
    register(f"adaptive_max_pool{_n}d")(_bind(_adaptive_max, _n))
    register(f"adaptive_max_pool{_n}d_backward")(_bind_tail(_adaptive_max_backward, _n))
