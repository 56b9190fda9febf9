"""Resampling: upsample_nearest{1,2,3}d, _upsample_nearest_exact{1,2,3}d, upsample_linear1d,
upsample_bilinear2d, upsample_trilinear3d, upsample_bicubic2d, _upsample_{bilinear,bicubic}2d_aa and
their backward ops, built on the host tables of helpers/host_tables.py (which pooling shares).

Every one of these ops is separable: along each spatial dim, output position o reads a few input
positions idx[o][l] with weights w[o][l]. Those tables depend only on sizes, scales and
align_corners, so they are computed here on the host, with the arithmetic of PyTorch's CPU kernels
replayed in the same precision (float32 via struct round trips for float/half/bfloat16 inputs,
double for double; weights stored in the input dtype, as CPU stores them), and emitted as dense
constants. The program then only gathers and multiply-adds, innermost dim first, in the compute
dtype (float32 for half types), rounding once - the order in which CPU's kernel evaluates.

A backward op is the transpose map: for each input position, the output positions that read it
and their weights, again a host table; it is applied with the same gather + multiply-add.
"""
from __future__ import annotations

import itertools
import math

import torch

from .elementwise import compute_dtype
from .helpers import host_tables
from .helpers.checks import not_implemented
from .registry import NotLowered, register


# -- host arithmetic in the kernels' precision ---------------------------------------------------
# -- dense constants and the one-dim sparse linear map --------------------------------------------
# -- source index tables (CPU's area_pixel_* / nearest_* rules) --------------------------------------
def _scale(r, n_in, n_out, align_corners, scale):
    """area_pixel_compute_scale in the rounding `r` of the math type."""
    if align_corners:
        return r((n_in - 1) / (n_out - 1)) if n_out > 1 else 0.0
    if scale is not None and scale > 0:
        return r(1.0 / scale)
    return r(n_in / n_out)


def _source(r, scale, o, align_corners, cubic):
    """area_pixel_compute_source_index."""
    if align_corners:
        return r(scale * o)
    src = r(r(scale * r(o + 0.5)) - 0.5)
    return 0.0 if (not cubic and src < 0) else src


def nearest_table(n_in, n_out, scale, exact, dtype, vectorized=False):
    """Input index per output position for mode nearest / nearest-exact. CPU's vectorized
    (channels-last) kernels use float scales and their own special cases; the generic one the
    math type of the dtype."""
    if vectorized:
        s = host_tables.f32(1.0 / scale) if scale is not None and scale > 0 else host_tables.f32(n_in / n_out)
        if exact:
            return [min(math.floor(host_tables.f32((o + 0.5) * s)), n_in - 1) for o in range(n_out)]
        if n_out == n_in:
            return list(range(n_out))
        if n_out == 2 * n_in:
            return [o >> 1 for o in range(n_out)]
        return [min(math.floor(host_tables.f32(o * s)), n_in - 1) for o in range(n_out)]
    r = host_tables.opmath_round(dtype)
    s = _scale(r, n_in, n_out, False, scale)
    if exact:
        return [min(math.floor(host_tables.f32(_source(r, s, o, False, False) + 0.5)), n_in - 1) for o in range(n_out)]
    return [min(math.floor(host_tables.f32(r(s * o))), n_in - 1) for o in range(n_out)]


def vectorized_kernel(x, out_shape, n):
    """Whether CPU resamples with its vectorized channels-last kernel: 2-d when the input is
    channels-last with more than 3 channels or the output is small (H + W <= 128), 3-d only in the
    channels-last case."""
    if n == 1 or x.rank != n + 2:
        return False
    ex = getattr(x, "example", None)
    fmt = torch.channels_last if n == 2 else torch.channels_last_3d
    cl = isinstance(ex, torch.Tensor) and ex.dim() == n + 2 and ex.is_contiguous(memory_format=fmt) \
        and x.shape[1] > 3
    return cl or (n == 2 and out_shape[-2] + out_shape[-1] <= 128)


def linear_table(n_in, n_out, align_corners, scale, dtype, stored=True):
    """(idx, w) of shape (n_out, 2) for linear modes; weights rounded to the input dtype when
    `stored` (the generic forward kernel), else kept in the math type."""
    r = host_tables.opmath_round(dtype)
    rs = host_tables.store_round(dtype) if stored else r
    s = _scale(r, n_in, n_out, align_corners, scale)
    idx, w = [], []
    for o in range(n_out):
        if n_in == n_out:
            idx.append([o, o])
            w.append([1.0, 0.0])
            continue
        real = _source(r, s, o, align_corners, False)
        i0 = min(math.floor(host_tables.f32(real)), n_in - 1)
        l1 = rs(min(max(r(real - i0), 0.0), 1.0))
        idx.append([i0, i0 + (1 if i0 < n_in - 1 else 0)])
        w.append([rs(r(1.0 - l1)), l1])
    return idx, w


def _linear_vectorized(b, x, tables, cd, out_dtype):
    """CPU's channels-last linear kernel: the taps of all dims gathered at once, each weighted by
    the product of its per-dim weights (math type, outer dim first) and summed in tap order."""
    n = len(tables)
    lead = x.rank - n
    r = host_tables.opmath_round(out_dtype)
    y = b.convert(x, cd)
    for d in reversed(range(n)):  # (.., m_d, 2, ..) per dim
        y = host_tables.take(b, y, lead + d, tables[d][0])
    acc = None
    out_shape = [s for i, s in enumerate(y.shape) if i < lead or (i - lead) % 2 == 0]
    for combo in itertools.product(range(2), repeat=n):
        # weight table over the output positions: product of the dims' weights, in dim order
        def weight(d, os):
            return tables[d][1][os[d]][combo[d]]
        wt = _product_table(r, [len(t[0]) for t in tables], weight)
        start = [0] * y.rank
        limit = list(y.shape)
        for d, c in enumerate(combo):
            start[lead + 2 * d + 1], limit[lead + 2 * d + 1] = c, c + 1
        v = b.reshape(b.slice(y, start, limit), out_shape)
        wtab = host_tables.const_table(b, wt, cd)
        t = b.multiply(v, b.broadcast_in_dim(wtab, tuple(out_shape), list(range(lead, lead + n))))
        acc = t if acc is None else b.add(acc, t)
    return b.convert(acc, out_dtype)


def _product_table(r, sizes, weight):
    """Nested list over output positions of prod_d weight(d, positions), multiplied left to right."""
    def build(prefix):
        if len(prefix) == len(sizes):
            v = weight(0, prefix)
            for d in range(1, len(sizes)):
                v = r(v * weight(d, prefix))
            return v
        return [build(prefix + [i]) for i in range(sizes[len(prefix)])]
    return build([])


def _cubic_conv1(r, x, A):
    """((A + 2) x - (A + 3)) x x + 1, for |x| <= 1, step by step in rounding r."""
    return r(r(r(r(r((A + 2) * x) - (A + 3)) * x) * x) + 1)


def _cubic_conv2(r, x, A):
    """((A x - 5A) x + 8A) x - 4A, for 1 < |x| < 2."""
    return r(r(r(r(r(r(A * x) - 5 * A) * x) + 8 * A) * x) - 4 * A)


def _cubic_coeffs(r, t):
    """Weights of taps -1, 0, 1, 2 at fraction t (A = -0.75, as OpenCV)."""
    A = -0.75
    x2 = r(1.0 - t)
    return [_cubic_conv2(r, r(t + 1.0), A), _cubic_conv1(r, t, A), _cubic_conv1(r, x2, A),
            _cubic_conv2(r, r(x2 + 1.0), A)]


def cubic_table(n_in, n_out, align_corners, scale, dtype, stored=True):
    """(idx, w) of shape (n_out, 4): taps floor(src) - 1 .. + 2 clamped to the input (edge values
    repeat), cubic convolution weights with A = -0.75."""
    r = host_tables.opmath_round(dtype)
    rs = host_tables.store_round(dtype) if stored else r
    s = _scale(r, n_in, n_out, align_corners, scale)
    idx, w = [], []
    for o in range(n_out):
        real = _source(r, s, o, align_corners, True)
        i = min(math.floor(host_tables.f32(real)), n_in - 1)
        t = min(max(r(real - i), 0.0), 1.0)
        idx.append([min(max(i + j - 1, 0), n_in - 1) for j in range(4)])
        w.append([rs(c) for c in _cubic_coeffs(r, t)])
    return idx, w


def _aa_filter(r, cubic):
    """The antialias filters: triangle, or Keys' cubic with a = -0.5 (as PIL)."""
    def linear(x):
        x = abs(x)
        return r(1.0 - x) if x < 1.0 else 0.0

    def keys(x):
        x = abs(x)
        if x < 1.0:
            return _cubic_conv1(r, x, -0.5)
        if x < 2.0:
            return _cubic_conv2(r, x, -0.5)
        return 0.0
    return keys if cubic else linear


def aa_table(n_in, n_out, align_corners, scale, dtype, cubic):
    """(idx, w) ragged tables of the antialiased (PIL-style) filters: each output averages the
    input positions within `support` of its center with normalized filter weights. Computed in the
    input's dtype (float or double), as CPU does."""
    r = host_tables.opmath_round(dtype)
    s = _scale(r, n_in, n_out, align_corners, scale)
    interp = 4 if cubic else 2
    support = r((interp * 0.5) * s) if s >= 1.0 else interp * 0.5
    max_size = math.ceil(support) * 2 + 1
    filt = _aa_filter(r, cubic)
    invscale = r(1.0 / s) if s >= 1.0 else 1.0
    idx, w = [], []
    for o in range(n_out):
        center = r(s * (o + 0.5))
        xmin = max(int(r(center - support) + 0.5), 0)
        xsize = min(max(min(int(r(center + support) + 0.5), n_in) - xmin, 0), max_size)
        ws = [filt(r((r(j + xmin - center) + 0.5) * invscale)) for j in range(xsize)]
        total = 0.0
        for v in ws:
            total = r(total + v)
        if total != 0.0:
            ws = [r(v / total) for v in ws]
        idx.append([xmin + j for j in range(xsize)])
        w.append(ws)
    return idx, w


# -- the lowerings ----------------------------------------------------------------------------------
def _check_float(name, dt, allow_uint8=False):
    if not (dt.is_floating_point or (allow_uint8 and dt == torch.uint8)):
        not_implemented(name, dt)


def _resample(b, x, n_spatial, tables, cd, out_dtype):
    """Applies one (idx, w) map per spatial dim, innermost (last) dim first, in dtype cd."""
    y = x if cd is None else b.convert(x, cd)
    for d in reversed(range(n_spatial)):
        idx, w = tables[d]
        y = host_tables.linear_map(b, y, y.rank - n_spatial + d, idx, w)
    return b.convert(y, out_dtype)


def _scales_list(n, scales):
    return list(scales) if scales else [None] * n


def _nearest(n, exact):
    name = ("_upsample_nearest_exact" if exact else "upsample_nearest") + f"{n}d"

    def forward(ctx, x, output_size, *scales):
        out = ctx.out[0]
        _check_float(name, out.dtype, allow_uint8=True)
        sc = _scales_list(n, scales)
        vec = vectorized_kernel(x, out.shape, n)
        tables = [(nearest_table(x.shape[-n + d], out.shape[-n + d], sc[d], exact, out.dtype, vec), None)
                  for d in range(n)]
        y = x
        for d in reversed(range(n)):
            y = host_tables.take(ctx.b, y, y.rank - n + d, tables[d][0])
        return y

    def backward(ctx, gy, output_size, input_size, *scales):
        out = ctx.out[0]
        sc = _scales_list(n, scales)
        cd = compute_dtype(out.dtype)
        tables = []
        for d in range(n):
            n_in = input_size[-n + d]
            tab = [[i] for i in nearest_table(n_in, output_size[d], sc[d], exact, out.dtype)]
            tables.append((host_tables.transpose_map(tab, None, n_in)[0], None))
        return _resample(ctx.b, gy, n, tables, cd, out.dtype)

    register(name)(forward)
    register(name + "_backward")(backward)


for _n in (1, 2, 3):
    _nearest(_n, False)
    _nearest(_n, True)


def _interp(name, n, table_fn):
    """Registers `name` and `name`_backward for a separable filter given by table_fn(n_in, n_out,
    align_corners, scale, dtype, stored)."""
    def forward(ctx, x, output_size, align_corners, *scales):
        out = ctx.out[0]
        if out.dtype == torch.uint8 and n == 2:
            # CPU's uint8 2-d path works in int16 fixed point with its own rounding: not matched here.
            raise NotLowered(f"{name} of uint8 runs on the CPU kernel")
        _check_float(name, out.dtype)
        sc = _scales_list(n, scales)
        if table_fn is linear_table and vectorized_kernel(x, out.shape, n):
            tables = [linear_table(x.shape[-n + d], out.shape[-n + d], align_corners, sc[d], out.dtype, False)
                      for d in range(n)]
            return _linear_vectorized(ctx.b, x, tables, compute_dtype(out.dtype), out.dtype)
        tables = [table_fn(x.shape[-n + d], out.shape[-n + d], align_corners, sc[d], out.dtype, True)
                  for d in range(n)]
        return _resample(ctx.b, x, n, tables, compute_dtype(out.dtype), out.dtype)

    def backward(ctx, gy, output_size, input_size, align_corners, *scales):
        out = ctx.out[0]
        sc = _scales_list(n, scales)
        tables = []
        for d in range(n):
            n_in = input_size[-n + d]
            idx, w = table_fn(n_in, output_size[d], align_corners, sc[d], out.dtype, False)
            tables.append(host_tables.transpose_map(idx, w, n_in))
        return _resample(ctx.b, gy, n, tables, compute_dtype(out.dtype), out.dtype)

    register(name)(forward)
    register(name + "_backward")(backward)


_interp("upsample_linear1d", 1, linear_table)
_interp("upsample_bilinear2d", 2, linear_table)
_interp("upsample_trilinear3d", 3, linear_table)
_interp("upsample_bicubic2d", 2, cubic_table)
_interp("_upsample_bilinear2d_aa", 2,
        lambda i, o, ac, s, dt, stored: aa_table(i, o, ac, s, dt, cubic=False))
_interp("_upsample_bicubic2d_aa", 2,
        lambda i, o, ac, s, dt, stored: aa_table(i, o, ac, s, dt, cubic=True))


# -- grid sampling --------------------------------------------------------------------------------
# grid_sampler_{2,3}d read the input at data-dependent points: each output point is a few taps
# (integer input positions, a weight, an in-bounds flag) gathered from the input with its channels
# as one slice; the backward scatter-adds the weighted gradient to the same taps (input) and
# contracts the tap values with the weights' derivatives (grid). Modes (CPU's enums):
# interpolation 0 bilinear, 1 nearest, 2 bicubic; padding 0 zeros, 1 border, 2 reflection.
class _Coord:
    """A source coordinate along one spatial dim and d(coordinate)/d(grid value)."""

    def __init__(self, c, mult):
        self.c, self.mult = c, mult


def _unnormalize(b, g, size, align_corners):
    """[-1, 1] -> pixel coordinate: corners' centers (align_corners) or corners' edges."""
    cd = g.dtype
    k = lambda v: b.constant(v, cd, g.shape)  # noqa: E731
    if align_corners:
        return _Coord(b.multiply(b.divide(b.add(g, k(1)), k(2)), k(size - 1)), k((size - 1) / 2))
    return _Coord(b.divide(b.subtract(b.multiply(b.add(g, k(1)), k(size)), k(1)), k(2)), k(size / 2))


def _clip_coord(b, c: _Coord, size):
    """Clamps into [0, size - 1]; the derivative is 0 where clamped (and at the bounds, as CPU)."""
    x = c.c
    k = lambda v: b.constant(v, x.dtype, x.shape)  # noqa: E731
    inside = b.and_(b.compare(x, k(0), "GT"), b.compare(x, k(size - 1), "LT"))
    clipped = b.minimum(k(size - 1), b.maximum(x, k(0)))
    return _Coord(clipped, b.select(inside, c.mult, k(0)))


def _reflect_coord(b, c: _Coord, twice_low, twice_high):
    """Reflects into [low, high] (mirror images of the input), tracking the derivative's sign."""
    x = c.c
    k = lambda v: b.constant(v, x.dtype, x.shape)  # noqa: E731
    if twice_low == twice_high:
        return _Coord(k(0), k(0))
    lo, span = twice_low / 2, (twice_high - twice_low) / 2
    d = b.subtract(x, k(lo))
    neg = b.compare(d, k(0), "LT")
    d = b.abs(d)
    extra = b.remainder(d, k(span))
    flips = b.unary("floor", b.divide(d, k(span)))
    even = b.compare(b.remainder(flips, k(2)), k(0), "EQ")
    sign = b.select(neg, k(-1), k(1))
    out = b.select(even, b.add(extra, k(lo)), b.add(b.subtract(k(span), extra), k(lo)))
    return _Coord(out, b.multiply(c.mult, b.select(even, sign, b.negate(sign))))


def _pad_coord(b, c: _Coord, size, padding_mode, align_corners):
    """compute_coordinates: border clamps, reflection mirrors then clamps, zeros leaves as is."""
    if padding_mode == 1:
        return _clip_coord(b, c, size)
    if padding_mode == 2:
        c = _reflect_coord(b, c, 0, 2 * (size - 1)) if align_corners else _reflect_coord(b, c, -1, 2 * size - 1)
        return _clip_coord(b, c, size)
    return c


def _cubic_weights(b, t, derivative=False):
    """Cubic convolution weights (A = -0.75) of taps -1..2 at fraction t, or their d/dt."""
    A = -0.75
    k = lambda v: b.constant(v, t.dtype, t.shape)  # noqa: E731

    def poly(x, coeffs):  # Horner: coeffs from the highest power
        acc = k(coeffs[0])
        for cf in coeffs[1:]:
            acc = b.add(b.multiply(acc, x), k(cf))
        return acc
    near = [A + 2, -(A + 3), 0, 1]          # |x| <= 1
    far = [A, -5 * A, 8 * A, -4 * A]        # 1 < |x| < 2
    if derivative:
        near = [3 * near[0], 2 * near[1], near[2]]
        far = [3 * far[0], 2 * far[1], far[2]]
    one = k(1)
    xs = [b.add(t, one), t, b.subtract(one, t), b.subtract(k(2), t)]   # distances to the 4 taps
    ws = [poly(xs[0], far), poly(xs[1], near), poly(xs[2], near), poly(xs[3], far)]
    if derivative:  # d/dt of w(|tap - t|): taps 0 and 1 lie below t, 2 and 3 above
        ws = [ws[0], ws[1], b.negate(ws[2]), b.negate(ws[3])]
    return ws


def _grid_taps(b, grid, sizes, mode, padding_mode, align_corners):
    """Per spatial dim (outermost first): a list of (index Value f, weight Value, d weight / d grid
    Value or None) taps, and the in-bounds flags; Values have the grid's point shape (N, *O)."""
    n = len(sizes)
    per_dim = []
    pts = grid.shape[:-1]
    for s, size in enumerate(sizes):
        comp = n - 1 - s  # grid[..., 0] is x (the last dim)
        g = b.reshape(_component(b, grid, comp), pts)
        k = lambda v, g=g: b.constant(v, g.dtype, g.shape)  # noqa: E731
        c = _unnormalize(b, g, size, align_corners)
        taps = []
        if mode == 2:  # bicubic: taps around the unpadded coordinate, each tap then padded
            i0 = b.unary("floor", c.c)
            t = b.subtract(c.c, i0)
            ws, dws = _cubic_weights(b, t), _cubic_weights(b, t, derivative=True)
            for j in range(4):
                pos = _pad_coord(b, _Coord(b.add(i0, k(j - 1)), k(0)), size, padding_mode, align_corners).c
                taps.append((pos, ws[j], b.multiply(dws[j], c.mult)))
        else:
            c = _pad_coord(b, c, size, padding_mode, align_corners)
            if mode == 1:
                taps.append((b.unary("round_nearest_even", c.c), k(1), None))
            else:
                i0 = b.unary("floor", c.c)
                i1 = b.add(i0, k(1))
                taps.append((i0, b.subtract(i1, c.c), b.negate(c.mult)))
                taps.append((i1, b.subtract(c.c, i0), c.mult))
        per_dim.append(taps)
    return per_dim


def _component(b, grid, comp):
    start = [0] * grid.rank
    start[-1] = comp
    limit = list(grid.shape)
    limit[-1] = comp + 1
    return b.slice(grid, start, limit)


def _tap_index(b, pos, size):
    """Float tap position -> (clamped i64 index, in-bounds flag)."""
    lo = b.compare(pos, b.constant(0, pos.dtype, pos.shape), "GE")
    hi = b.compare(pos, b.constant(size, pos.dtype, pos.shape), "LT")
    ok = b.and_(lo, hi)
    safe = b.select(ok, pos, b.constant(0, pos.dtype, pos.shape))
    return b.convert(safe, torch.int64), ok


def _combine(b, per_dim, sizes):
    """All tap combinations (outer dim major, as CPU): (gather index (N, *O, n+1) with the batch
    position first, weight, in-bounds flag, per-dim weight derivatives) per tap."""
    pts = per_dim[0][0][1].shape
    batch = b.iota(pts, 0)
    out = []
    for combo in itertools.product(*[range(len(t)) for t in per_dim]):
        taps = [per_dim[d][j] for d, j in enumerate(combo)]
        idx, ok = [batch], None
        for d, (pos, _, _) in enumerate(taps):
            i, okd = _tap_index(b, pos, sizes[d])
            idx.append(i)
            ok = okd if ok is None else b.and_(ok, okd)
        w = None
        for d in reversed(range(len(taps))):  # x weight first, as CPU multiplies
            w = taps[d][1] if w is None else b.multiply(w, taps[d][1])
        dws = []
        for d in range(len(taps)):
            if taps[d][2] is None:
                dws.append(None)
                continue
            dw = taps[d][2]
            for e in range(len(taps)):
                if e != d:
                    dw = b.multiply(dw, taps[e][1])
            dws.append(dw)
        where = b.concatenate([b.reshape(v, tuple(pts) + (1,)) for v in idx], len(pts))
        out.append((where, w, ok, dws))
    return out


def _channels_last(b, x):
    return b.transpose(x, [0] + list(range(2, x.rank)) + [1])


def _gather_taps(b, xl, where):
    """xl (N, *S, C) at points `where` (N, *O, 1+n): (N, *O, C)."""
    nsp = xl.rank - 2
    pts = where.shape[:-1]
    C = xl.shape[-1]
    return b.gather(xl, where, [len(pts)], list(range(nsp + 1)), list(range(nsp + 1)), len(pts),
                    [1] * (nsp + 1) + [C], tuple(pts) + (C,))


def _grid_check(name, x, mode):
    if not x.dtype.is_floating_point:
        not_implemented(name, x.dtype)


def _grid_sampler(ctx, x, grid, interpolation_mode, padding_mode, align_corners):
    """grid_sampler_{2,3}d: sum over taps of weight * input (in-bounds taps only)."""
    b = ctx.b
    out = ctx.out[0]
    n = x.rank - 2
    _grid_check(f"grid_sampler_{n}d_cpu", out, interpolation_mode)
    if out.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    cd = compute_dtype(out.dtype)
    xl = _channels_last(b, b.convert(x, cd))
    if xl.type.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    g = b.convert(grid, cd)
    sizes = list(x.shape[2:])
    taps = _combine(b, _grid_taps(b, g, sizes, interpolation_mode, padding_mode, align_corners), sizes)
    acc = None
    for where, w, ok, _ in taps:
        v = _gather_taps(b, xl, where)
        okc = b.broadcast_in_dim(ok, v.shape, list(range(v.rank - 1)))
        term = b.select(okc, b.multiply(v, b.broadcast_in_dim(w, v.shape, list(range(v.rank - 1)))), b.zeros_like(v))
        acc = term if acc is None else b.add(acc, term)
    return b.convert(b.transpose(acc, [0, acc.rank - 1] + list(range(1, acc.rank - 1))), out.dtype)


def _grid_sampler_backward(ctx, gy, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    """(grad_input, grad_grid): the weighted gradient scatter-added to each in-bounds tap; the tap
    values contracted with the gradient and the weights' derivatives along each grid component."""
    b = ctx.b
    n = x.rank - 2
    cd = compute_dtype(x.dtype)
    sizes = list(x.shape[2:])
    gi_t, gg_t = ctx.out
    xl = _channels_last(b, b.convert(x, cd))
    gl = _channels_last(b, b.convert(gy, cd))                       # (N, *O, C)
    g = b.convert(grid, cd)
    empty = gl.type.numel == 0 or xl.type.numel == 0
    taps = None if empty else _combine(
        b, _grid_taps(b, g, sizes, interpolation_mode, padding_mode, align_corners), sizes)
    gi = gg = None
    if gi_t is not None:
        if empty:
            gi = b.constant(0, gi_t.dtype, gi_t.shape)
        else:
            acc = b.constant(0, cd, xl.shape)
            nsp = n
            for where, w, ok, _ in taps:
                wb = b.broadcast_in_dim(b.select(ok, w, b.zeros_like(w)), gl.shape, list(range(gl.rank - 1)))
                upd = b.select(b.broadcast_in_dim(ok, gl.shape, list(range(gl.rank - 1))),
                               b.multiply(gl, wb), b.zeros_like(gl))
                acc = b.scatter(acc, where, upd, [gl.rank - 1], list(range(nsp + 1)), list(range(nsp + 1)),
                                where.rank - 1, combine=lambda bb, old, new: bb.add(old, new))
            gi = b.transpose(acc, [0, acc.rank - 1] + list(range(1, acc.rank - 1)))
            gi = b.convert(gi, gi_t.dtype)
    if gg_t is not None:
        if empty or interpolation_mode == 1:
            gg = b.constant(0, gg_t.dtype, gg_t.shape)
        else:
            comps = [None] * n
            for where, w, ok, dws in taps:
                v = _gather_taps(b, xl, where)
                gv = b.reduce([b.multiply(v, gl)], [b.constant(0, cd)], [v.rank - 1],
                              lambda bb, a, e: bb.add(a, e))[0]        # (N, *O)
                gv = b.select(ok, gv, b.zeros_like(gv))
                for d in range(n):
                    t = b.multiply(gv, dws[d])
                    comps[d] = t if comps[d] is None else b.add(comps[d], t)
            pts = g.shape[:-1]
            parts = [b.reshape(comps[n - 1 - c], tuple(pts) + (1,)) for c in range(n)]  # x, y, z order
            gg = b.convert(b.concatenate(parts, len(pts)), gg_t.dtype)
    return gi, gg


register("grid_sampler_2d")(_grid_sampler)
register("grid_sampler_3d")(_grid_sampler)
register("grid_sampler_2d_backward")(_grid_sampler_backward)
register("grid_sampler_3d_backward")(_grid_sampler_backward)
