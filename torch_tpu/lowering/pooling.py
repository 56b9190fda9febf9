"""2-D pooling: max_pool2d_with_indices, avg_pool2d, _adaptive_avg_pool2d and their backward.

Pooling works on the last two dims (any leading dims: (N, C, H, W) or (C, H, W)). Max pooling scans
the window positions in CPU order so that values and indices (flat positions within each input
plane) match CPU exactly, ties and NaNs included; its backward scatter-adds through the indices.
Average pooling divides by the same per-window divisor as CPU; adaptive pooling is two small
products with 0/1 window matrices. Half precision is computed in float32 and rounded once.
"""
from __future__ import annotations

import torch

from .elementwise import compute_dtype
from .linalg import dot
from .registry import register


def _pair(v, default=None):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if not v and default is not None:
        return list(default)
    return v * 2 if len(v) == 1 else v


def _not_implemented(name, dt):
    names = {torch.bool: "Bool", torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short",
             torch.int32: "Int", torch.int64: "Long"}
    raise NotImplementedError(f'"{name}" not implemented for \'{names.get(dt, str(dt))}\'')


def _grid(b, shape, lead, dim, values):
    """Broadcasts a 1-D i64 Value along dim `dim` of `shape` (an (OH, OW) position grid)."""
    return b.broadcast_in_dim(values, shape, [lead + dim])


def _starts(b, n, stride, pad):
    """Window starts o*stride - pad for o in [0, n), as an i64 vector."""
    o = b.iota((n,), 0)
    return b.subtract(b.multiply(o, b.constant(stride, torch.int64, (n,))), b.constant(pad, torch.int64, (n,)))


def _clip(b, v, lo=None, hi=None):
    if lo is not None:
        v = b.maximum(v, b.constant(lo, torch.int64, v.shape))
    if hi is not None:
        v = b.minimum(v, b.constant(hi, torch.int64, v.shape))
    return v


# -- max pooling ------------------------------------------------------------------------------------
@register("max_pool2d_with_indices")
def max_pool2d_with_indices(ctx, x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    b = ctx.b
    dt = x.dtype
    if dt == torch.bool:
        _not_implemented("max_pool2d", dt)
    k = _pair(kernel_size)
    s, p, d = _pair(stride, k), _pair(padding), _pair(dilation)
    out_shape = ctx.out[0].shape
    lead = x.rank - 2
    (H, W), (OH, OW) = x.shape[-2:], out_shape[-2:]
    if dt.is_floating_point:
        lowest = float("-inf")
    else:
        lowest = torch.iinfo(dt).min
    hi = [max(0, (o - 1) * st + dd * (kk - 1) + 1 - n - pp) for o, st, dd, kk, n, pp in
          zip((OH, OW), s, d, k, (H, W), p)]
    xp = b.pad(x, b.constant(lowest, dt), [0] * lead + p, [0] * lead + hi)
    # The index CPU reports when no element beats -inf: the window's first position inside the input.
    h0, w0 = _starts(b, OH, s[0], p[0]), _starts(b, OW, s[1], p[1])

    def first_valid(v, dd):
        neg = _clip(b, b.negate(v), lo=0)
        steps = b.divide(b.add(neg, b.constant(dd - 1, torch.int64, v.shape)), b.constant(dd, torch.int64, v.shape))
        return b.add(v, b.multiply(steps, b.constant(dd, torch.int64, v.shape)))

    def flat(hv, wv):
        hv = _grid(b, out_shape, lead, 0, b.multiply(hv, b.constant(W, torch.int64, hv.shape)))
        return b.add(hv, _grid(b, out_shape, lead, 1, wv))

    best = b.constant(lowest, dt, out_shape)
    idx = flat(first_valid(h0, d[0]), first_valid(w0, d[1]))
    for kh in range(k[0]):
        for kw in range(k[1]):
            start = [0] * lead + [kh * d[0], kw * d[1]]
            limit = list(out_shape[:lead]) + [kh * d[0] + (OH - 1) * s[0] + 1, kw * d[1] + (OW - 1) * s[1] + 1]
            v = b.slice(xp, start, limit, [1] * lead + s)
            upd = b.compare(v, best, "GT")
            if dt.is_floating_point:
                upd = b.or_(upd, b.is_nan(v))
            hk = b.add(h0, b.constant(kh * d[0], torch.int64, h0.shape))
            wk = b.add(w0, b.constant(kw * d[1], torch.int64, w0.shape))
            best = b.select(upd, v, best)
            idx = b.select(upd, flat(hk, wk), idx)
    return best, idx


@register("max_pool2d_with_indices_backward")
def max_pool2d_with_indices_backward(ctx, gy, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    b = ctx.b
    out = ctx.out[0]
    cd = compute_dtype(out.dtype)
    lead = x.shape[:-2]
    planes = 1
    for n in lead:
        planes *= n
    hw = x.shape[-2] * x.shape[-1]
    m = gy.shape[-2] * gy.shape[-1]
    g = b.reshape(b.convert(gy, cd), (planes, m))
    i = b.reshape(indices, (planes, m, 1))
    plane = b.iota((planes, m, 1), 0)
    where = b.concatenate([plane, i], 2)
    gi = b.scatter(b.constant(0, cd, (planes, hw)), where, g, [], [0, 1], [0, 1], 2,
                   combine=lambda bb, old, new: bb.add(old, new))
    return b.convert(b.reshape(gi, out.shape), out.dtype)


# -- average pooling ----------------------------------------------------------------------------------
def _avg_divisor(b, shape, lead, size, k, s, p, n_out, count_include_pad, divisor_override, cd):
    """CPU's divide factor per output position, broadcast to `shape`, in compute dtype `cd`."""
    if divisor_override is not None:
        return b.constant(divisor_override, cd, shape)
    per_dim = []
    for i in range(2):
        start = _starts(b, n_out[i], s[i], p[i])
        end = _clip(b, b.add(start, b.constant(k[i], torch.int64, start.shape)), hi=size[i] + p[i])
        if not count_include_pad:
            start, end = _clip(b, start, lo=0), _clip(b, end, hi=size[i])
        per_dim.append(_grid(b, shape, lead, i, b.subtract(end, start)))
    div = b.multiply(per_dim[0], per_dim[1])
    div = _clip(b, div, lo=1)  # windows with no input element give 0 (their sum is 0)
    return b.convert(div, cd)


def _avg_args(kernel_size, stride, padding):
    k = _pair(kernel_size)
    return k, _pair(stride, k), _pair(padding)


@register("avg_pool2d")
def avg_pool2d(ctx, x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    b = ctx.b
    out = ctx.out[0]
    if not (out.dtype.is_floating_point or out.dtype == torch.int64):
        _not_implemented("avg_pool2d", out.dtype)
    cd = compute_dtype(out.dtype)
    k, s, p = _avg_args(kernel_size, stride, padding)
    lead = x.rank - 2
    size, n_out = x.shape[-2:], out.shape[-2:]
    hi = [max(0, (o - 1) * st + kk - n - pp) for o, st, kk, n, pp in zip(n_out, s, k, size, p)]
    xc = b.convert(x, cd)
    zero = b.constant(0, cd)
    xp = b.pad(xc, zero, [0] * lead + p, [0] * lead + hi)
    total = b.reduce_window([xp], [zero], [1] * lead + k, [1] * lead + s, [(0, 0)] * x.rank,
                            lambda bb, a, e: bb.add(a, e))[0]
    total = b.slice(total, [0] * x.rank, list(out.shape))
    div = _avg_divisor(b, out.shape, lead, size, k, s, p, n_out, count_include_pad, divisor_override, cd)
    return b.convert(b.divide(total, div), out.dtype)


@register("avg_pool2d_backward")
def avg_pool2d_backward(ctx, gy, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override=None):
    b = ctx.b
    out = ctx.out[0]
    cd = compute_dtype(out.dtype)
    k, s, p = _avg_args(kernel_size, stride, padding)
    lead = x.rank - 2
    size, n_out = x.shape[-2:], gy.shape[-2:]
    g = b.divide(b.convert(gy, cd),
                 _avg_divisor(b, gy.shape, lead, size, k, s, p, n_out, count_include_pad, divisor_override, cd))
    # Each window position (kh, kw) sends g to padded-input rows kh + o*s: an interior-padded copy.
    full = [max(n + 2 * pp, (o - 1) * st + kk) for n, pp, o, st, kk in zip(size, p, n_out, s, k)]
    zero = b.constant(0, cd)
    acc = None
    for kh in range(k[0]):
        for kw in range(k[1]):
            lo = [kh, kw]
            hi = [f - (l + (o - 1) * st + 1) for f, l, o, st in zip(full, lo, n_out, s)]
            part = b.pad(g, zero, [0] * lead + lo, [0] * lead + hi, [0] * lead + [st - 1 for st in s])
            acc = part if acc is None else b.add(acc, part)
    gi = b.slice(acc, [0] * lead + p, list(x.shape[:lead]) + [pp + n for pp, n in zip(p, size)])
    return b.convert(gi, out.dtype)


# -- adaptive average pooling -----------------------------------------------------------------------
def _window_matrix(b, n_out, n_in):
    """(n_out, n_in) 0/1 matrix of adaptive windows [floor(i*n/o), ceil((i+1)*n/o)), and its row sums."""
    i = b.iota((n_out, n_in), 0)
    j = b.iota((n_out, n_in), 1)
    c = lambda v: b.constant(v, torch.int64, (n_out, n_in))  # noqa: E731
    start = b.divide(b.multiply(i, c(n_in)), c(n_out))
    end = b.divide(b.add(b.multiply(b.add(i, c(1)), c(n_in)), c(n_out - 1)), c(n_out))
    inside = b.and_(b.compare(j, start, "GE"), b.compare(j, end, "LT"))
    ones = b.convert(inside, torch.float32)
    counts = b.subtract(end, start)
    return ones, b.slice(counts, [0, 0], [n_out, 1])


def _adaptive(b, x, ph, pw, cd, transpose=False):
    """x @ windows over its last two dims: window sums (x at input size), or with `transpose` the
    spreading of per-window values back to input positions (x at output size)."""
    lead = x.rank - 2
    m = 0 if transpose else 1
    t = dot(b, x, pw, ([], []), ([x.rank - 1], [m]), cd)   # (..., rows, W')
    t = dot(b, t, ph, ([], []), ([lead], [m]), cd)          # (..., W', H')
    return b.transpose(t, list(range(lead)) + [lead + 1, lead])


@register("_adaptive_avg_pool2d")
def adaptive_avg_pool2d(ctx, x, output_size):
    b = ctx.b
    out = ctx.out[0]
    if not out.dtype.is_floating_point:
        _not_implemented("adaptive_avg_pool2d", out.dtype)
    cd = compute_dtype(out.dtype)
    lead = x.rank - 2
    (H, W), (OH, OW) = x.shape[-2:], out.shape[-2:]
    (ph, ch), (pw, cw) = _window_matrix(b, OH, H), _window_matrix(b, OW, W)
    total = _adaptive(b, b.convert(x, cd), ph, pw, cd)
    div = b.multiply(b.broadcast_in_dim(b.reshape(ch, (OH,)), out.shape, [lead]),
                     b.broadcast_in_dim(b.reshape(cw, (OW,)), out.shape, [lead + 1]))
    return b.convert(b.divide(total, b.convert(div, cd)), out.dtype)


@register("_adaptive_avg_pool2d_backward")
def adaptive_avg_pool2d_backward(ctx, gy, x):
    b = ctx.b
    out = ctx.out[0]
    cd = compute_dtype(out.dtype)
    lead = x.rank - 2
    (H, W), (OH, OW) = x.shape[-2:], gy.shape[-2:]
    (ph, ch), (pw, cw) = _window_matrix(b, OH, H), _window_matrix(b, OW, W)
    div = b.multiply(b.broadcast_in_dim(b.reshape(ch, (OH,)), gy.shape, [lead]),
                     b.broadcast_in_dim(b.reshape(cw, (OW,)), gy.shape, [lead + 1]))
    g = b.divide(b.convert(gy, cd), b.convert(div, cd))
    return b.convert(_adaptive(b, g, ph, pw, cd, transpose=True), out.dtype)
