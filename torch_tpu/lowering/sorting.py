"""Sorting, order statistics and searches: sort and topk (stable, NaN last), median / nanmedian (all
and along a dim), kthvalue, mode, searchsorted / bucketize, histc, histogram; and the kernels with
host-side logic: unique and unique_consecutive (the number of distinct values is read back, the rest
runs on the device), bincount (its length is data), equal (returns a python bool) and the
triangle-index factories.

CPU's choice of index among equal values is reproduced:
- median.dim / nanmedian.dim partition by (value, index), so the answer is the element at the
  median rank of a stable sort; a row of NaN only (nanmedian) is answered by libstdc++'s
  nth_element with an always-false comparator, whose pick depends on the row length alone and is
  computed here at trace time (`_nth_element_all_equal`).
- kthvalue runs Sedgewick's quickselect (median of three, Hoare partition); when the k-th value
  occurs more than once in a row the index is that of the element the algorithm leaves at k-1, so
  those rows replay the algorithm on the device in a stablehlo.while (`_quickselect_index`).
- mode sorts (value, index) pairs by value with std::sort and reports the last element of the
  most frequent run. Rows of up to 16 elements (std::sort's insertion-sort cut-off) are sorted the
  same way here, NaNs included; longer rows are sorted stably, which gives CPU's value when there
  is no NaN but the last occurrence as the index, where CPU's depends on introsort's partitions.
"""
from __future__ import annotations

import math

import torch

from .elementwise import compute_dtype
from .helpers.checks import scalar_type_name
from .reduction import arg_reduce, reduce_sum
from .registry import host_kernel, register


# -- sort and topk ---------------------------------------------------------------------------------
def _nan_last_less(descending):
    """Sort comparator on (value, index) pairs: NaN is the largest value, as on CPU."""
    def less(sb, a, c, i, j):
        if a.dtype.is_floating_point:
            if descending:
                return sb.or_(sb.compare(a, c, "GT"), sb.and_(sb.is_nan(a), sb.not_(sb.is_nan(c))))
            return sb.or_(sb.compare(a, c, "LT"), sb.and_(sb.not_(sb.is_nan(a)), sb.is_nan(c)))
        return sb.compare(a, c, "GT" if descending else "LT")
    return less


def _sort(b, x, dim, descending):
    """Stable sort along dim: (values, int64 indices)."""
    if x.rank == 0:
        return x, b.constant(0, torch.int64)
    d = dim % x.rank
    if x.type.numel == 0:
        return x, b.constant(0, torch.int64, x.shape)
    return tuple(b.sort([x, b.iota(x.shape, d)], d, _nan_last_less(descending), stable=True))


def _no_complex_order(name, x):
    if x.dtype.is_complex:  # as CPU (" Sort does not support complex dtypes on CPU"): no order on C
        raise RuntimeError(f"{name} does not support complex dtypes")


@register("sort.stable")
def sort(ctx, x, stable=None, dim=-1, descending=False):
    _no_complex_order("Sort", x)
    return _sort(ctx.b, x, dim, descending)


@register("sort")
def sort_default(ctx, x, dim=-1, descending=False):
    """sort.default, which compiled graphs call (eager reaches it through sort.stable): stable, as
    sort.stable(stable=False) is on tpu and on the CPU."""
    _no_complex_order("Sort", x)
    return _sort(ctx.b, x, dim, descending)


@register("topk")
def topk(ctx, x, k, dim=-1, largest=True, sorted=True):
    """The first k of a stable sort (largest first when largest=True); NaN counts as largest."""
    b = ctx.b
    if x.dtype == torch.bool:  # as CPU ("topk does not support bool dtypes on CPU")
        raise RuntimeError("topk does not support bool dtypes")
    _no_complex_order("topk", x)
    if ctx.out[0].numel == 0 or x.rank == 0:
        vals, idx = _sort(b, x, dim, largest)
        return (vals, idx) if ctx.out[0].numel else (b.constant(0, x.dtype, ctx.out[0].shape),
                                                      b.constant(0, torch.int64, ctx.out[1].shape))
    d = dim % x.rank
    vals, idx = _sort(b, x, d, largest)
    limit = list(x.shape)
    limit[d] = k
    return b.slice(vals, [0] * x.rank, limit), b.slice(idx, [0] * x.rank, limit)



# -- helpers ------------------------------------------------------------------------------------
def rows(b, x, dim):
    """x with `dim` moved last and the other dims flattened: a [B, N] Value (B, N >= 0)."""
    d = dim % x.rank
    perm = [i for i in range(x.rank) if i != d] + [d]
    lead = math.prod(x.shape[i] for i in perm[:-1])
    return b.reshape(b.transpose(x, perm), [lead, x.shape[d]])


def pick(b, m, k):
    """m[r, k[r]] for every row r of the [B, N] Value m; k is a [B] int64 Value."""
    n = m.shape[0]
    coords = b.concatenate([b.reshape(b.iota((n,), 0), [n, 1]), b.reshape(k, [n, 1])], 1)
    return b.gather(m, coords, offset_dims=[], collapsed=[0, 1], start_index_map=[0, 1], index_vector_dim=1,
                    slice_sizes=[1, 1], out_shape=(n,))


def _put(b, m, k, v):
    """m with m[r, k[r]] = v[r] for every row r."""
    n = m.shape[0]
    coords = b.concatenate([b.reshape(b.iota((n,), 0), [n, 1]), b.reshape(k, [n, 1])], 1)
    return b.scatter(m, coords, v, update_window_dims=[], inserted_window_dims=[0, 1],
                     scatter_dims_to_operand_dims=[0, 1], index_vector_dim=1)


def while_loop(b, inits, cond, body):
    """stablehlo.while over the values `inits`: cond(sb, *vals) -> i1 Value, body(sb, *vals) ->
    new vals. Regions see only the loop-carried values (constants are made inside)."""
    types = [v.type for v in inits]
    return b.op("stablehlo.while", inits, types, regions=[b.region(types, cond), b.region(types, body)])


def _count_nan(b, m):
    """Number of NaNs in each row of [B, N] (int64; zeros for non-float dtypes)."""
    if not m.dtype.is_floating_point:
        return b.constant(0, torch.int64, m.shape[:1])
    return reduce_sum(b, b.convert(b.is_nan(m), torch.int64), [1])


def _i64(b, v, shape):
    return b.constant(v, torch.int64, shape)


def _nth_element_all_equal(n):
    """Position (in the input) of the element libstdc++'s std::nth_element leaves first when every
    comparison is false (a nanmedian row of NaN only): introselect swaps the middle element to the
    front, then its unguarded partition swaps pairs from both ends inwards and keeps the half that
    holds position 0, until at most 3 elements remain (insertion sort moves nothing then)."""
    a = list(range(n))
    first, last = 0, n
    while last - first > 3:
        mid = first + (last - first) // 2
        a[first], a[mid] = a[mid], a[first]
        lo, hi = first + 1, last
        while True:
            hi -= 1
            if not lo < hi:
                break
            a[lo], a[hi] = a[hi], a[lo]
            lo += 1
        if lo <= 0:
            first = lo
        else:
            last = lo
    return a[0]


def _trivial(ctx, x, dim):
    """(values, indices) of an order statistic along dim that needs no sort: a 0-dim input is its own
    answer at index 0, an empty one gives empty (or zero-filled) results; None otherwise."""
    b = ctx.b
    if x.rank == 0:
        return x, b.constant(0, torch.int64)
    if ctx.out[0].numel == 0 or x.shape[dim % x.rank] == 0:
        return tuple(b.constant(0, t.dtype, t.shape) for t in ctx.out)
    return None


# -- median / nanmedian -------------------------------------------------------------------------
def _median_all(ignore_nan):
    def lower(ctx, x):
        b = ctx.b
        n = x.type.numel
        if n == 0:  # CPU answers NaN (cast to the type: its minimum for integers)
            return b.constant(math.nan if x.dtype.is_floating_point else torch.iinfo(x.dtype).min, x.dtype)
        flat = b.reshape(x, [1, n])
        sv, _ = _sort(b, flat, 1, False)  # NaN last
        nnan = _count_nan(b, flat)
        if ignore_nan:  # (non-NaN count - 1) / 2, truncated as in C++ (0 for a NaN-only input)
            k = b.divide(b.maximum(b.subtract(_i64(b, n - 1, (1,)), nnan), _i64(b, 0, (1,))), _i64(b, 2, (1,)))
            return b.reshape(pick(b, sv, k), [])
        v = pick(b, sv, _i64(b, (n - 1) // 2, (1,)))
        if x.dtype.is_floating_point:
            v = b.select(b.compare(nnan, _i64(b, 0, (1,)), "GT"), b.constant(math.nan, x.dtype, (1,)), v)
        return b.reshape(v, [])
    return lower


register("median")(_median_all(False))
register("nanmedian")(_median_all(True))


def _check_reduced_dim(name):
    """CPU's error for a reduced dim of size 0."""
    def check(x, *args, **kw):
        dim = kw.get("dim", args[1] if name == "kthvalue" and len(args) > 1 else
                     (args[0] if name != "kthvalue" and args else -1))
        d = dim % x.dim() if x.dim() else 0
        if x.dim() and x.shape[d] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")
        if name == "kthvalue":
            k = args[0]
            if not 0 < k <= (x.shape[d] if x.dim() else 1):
                raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {d}")
    return check


def _median_dim(ignore_nan):
    """median: a row holding NaN answers its first NaN; else the element of rank (N-1)/2 in the
    stable order. nanmedian: rank (non-NaN count - 1)/2 among the non-NaN values."""
    def lower(ctx, x, dim, keepdim=False):
        b = ctx.b
        done = _trivial(ctx, x, dim)
        if done is not None:
            return done
        m = rows(b, x, dim)
        nb, n = m.shape
        sv, si = _sort(b, m, 1, False)
        nnan = _count_nan(b, m)
        if ignore_nan:
            k = b.divide(b.maximum(b.subtract(_i64(b, n - 1, (nb,)), nnan), _i64(b, 0, (nb,))), _i64(b, 2, (nb,)))
        else:  # the first NaN sits right after the non-NaN values in the stable order
            k = b.select(b.compare(nnan, _i64(b, 0, (nb,)), "GT"), b.subtract(_i64(b, n, (nb,)), nnan),
                         _i64(b, (n - 1) // 2, (nb,)))
        v, i = pick(b, sv, k), pick(b, si, k)
        if ignore_nan and x.dtype.is_floating_point:
            all_nan = b.compare(nnan, _i64(b, n, (nb,)), "EQ")
            i = b.select(all_nan, _i64(b, _nth_element_all_equal(n), (nb,)), i)
        return v, i
    return lower


register("median.dim", check=_check_reduced_dim("median"), check_per_key=True)(_median_dim(False))
register("nanmedian.dim", check=_check_reduced_dim("median"), check_per_key=True)(_median_dim(True))


# -- kthvalue -----------------------------------------------------------------------------------
def _gt_or_nan(s, x, y):
    """quickselect's order: x > y, NaN above everything."""
    r = s.compare(x, y, "GT")
    if x.dtype.is_floating_point:
        r = s.or_(r, s.and_(s.is_nan(x), s.not_(s.is_nan(y))))
    return r


def _quickselect_index(b, m, k, active):
    """Index CPU's quickselect (Sedgewick's, as in kthvalue) leaves at position k of each row of the
    [B, N] Value m, for the rows where `active`; others get 0. One loop step advances every row by
    one step of the algorithm: START (pick the median-of-three pivot, or finish a 1-2 element
    range), INC (i++ while piv > a[i]), DEC (j-- while a[j] > piv; then swap or close the pass)."""
    nb, n = m.shape
    START, INC, DEC, DONE = 0, 1, 2, 3
    vec = (nb,)
    ph0 = b.select(active, b.constant(START, torch.int32, vec), b.constant(DONE, torch.int32, vec))
    inits = [m, b.iota((nb, n), 1), _i64(b, 0, vec), _i64(b, n - 1, vec), _i64(b, 0, vec), _i64(b, 0, vec),
             b.constant(0, m.dtype, vec), ph0]

    def cond(s, a, ix, lo, hi, i, j, piv, ph):
        busy = s.compare(ph, s.constant(DONE, torch.int32, vec), "NE")
        return s.reduce([busy], [s.constant(False, torch.bool)], [0], lambda r, p, q: r.or_(p, q))[0]

    def body(s, a, ix, lo, hi, i, j, piv, ph):
        def c(v):
            return _i64(s, v, vec)

        def is_(p):
            return s.compare(ph, s.constant(p, torch.int32, vec), "EQ")

        def swap(a, ix, p, q, mask):
            q = s.select(mask, q, p)  # rows not swapping exchange p with itself
            ap, aq, ip, iq = pick(s, a, p), pick(s, a, q), pick(s, ix, p), pick(s, ix, q)
            a = _put(s, _put(s, a, p, aq), q, ap)
            ix = _put(s, _put(s, ix, p, iq), q, ip)
            return a, ix

        st, inc, dec = is_(START), is_(INC), is_(DEC)
        one = s.and_(st, s.compare(hi, lo, "LE"))
        two = s.and_(st, s.compare(hi, s.add(lo, c(1)), "EQ"))
        big = s.and_(st, s.compare(hi, s.add(lo, c(1)), "GT"))
        # reads of this step, before any swap
        lo1 = s.add(lo, c(1))
        two_sw = s.and_(two, _gt_or_nan(s, pick(s, a, lo), pick(s, a, hi)))
        i_next = s.add(i, c(1))
        inc_go = _gt_or_nan(s, piv, pick(s, a, s.select(inc, i_next, lo)))
        j_next = s.subtract(j, c(1))
        dec_go = _gt_or_nan(s, pick(s, a, s.select(dec, j_next, lo)), piv)
        dec_stop = s.and_(dec, s.not_(dec_go))
        brk = s.and_(dec_stop, s.compare(j_next, i, "LT"))
        # first swap: the pivot candidate to L+1 (big), the pair (two), the partition step (dec)
        mid = s.binary("shift_right_arithmetic", s.add(lo, hi), c(1))
        p1 = s.select(big, mid, s.select(two, lo, s.select(brk, lo, i)))
        q1 = s.select(big, lo1, s.select(two, hi, j_next))
        a, ix = swap(a, ix, p1, q1, s.or_(big, s.or_(two_sw, dec_stop)))
        # median of three: a[L] <= ... ordering of a[L+1], a[L], a[R]
        a, ix = swap(a, ix, lo1, hi, s.and_(big, _gt_or_nan(s, pick(s, a, lo1), pick(s, a, hi))))
        a, ix = swap(a, ix, lo, hi, s.and_(big, _gt_or_nan(s, pick(s, a, lo), pick(s, a, hi))))
        a, ix = swap(a, ix, lo1, lo, s.and_(big, _gt_or_nan(s, pick(s, a, lo1), pick(s, a, lo))))
        piv = s.select(big, pick(s, a, lo), piv)
        i = s.select(big, lo1, s.select(inc, i_next, i))
        j = s.select(big, hi, s.select(dec, j_next, j))
        kk = c(k)
        new_lo = s.select(s.and_(brk, s.compare(j_next, kk, "LE")), i, lo)
        new_hi = s.select(s.and_(brk, s.compare(j_next, kk, "GE")), s.subtract(j_next, c(1)), hi)
        phase = ph
        phase = s.select(s.or_(one, two), s.constant(DONE, torch.int32, vec), phase)
        phase = s.select(big, s.constant(INC, torch.int32, vec), phase)
        phase = s.select(s.and_(inc, s.not_(inc_go)), s.constant(DEC, torch.int32, vec), phase)
        phase = s.select(dec_stop, s.select(brk, s.constant(START, torch.int32, vec),
                                            s.constant(INC, torch.int32, vec)), phase)
        return [a, ix, new_lo, new_hi, i, j, piv, phase]

    out = while_loop(b, inits, cond, body)
    return pick(b, out[1], _i64(b, k, vec))


def _prepare_kthvalue(x, k, dim=-1, keepdim=False):
    """CPU reports an empty reduced dim before a bad k (the meta kernel the other way round)."""
    _check_reduced_dim("kthvalue")(x, k, dim, keepdim)
    return [x, k, dim, keepdim]


@register("kthvalue", prepare=_prepare_kthvalue)
def kthvalue(ctx, x, k, dim=-1, keepdim=False):
    """The value of rank k-1 in the stable order (NaN last); its index from the sort when the value
    is unique in its row, else from replaying CPU's quickselect on that row."""
    b = ctx.b
    done = _trivial(ctx, x, dim)
    if done is not None:
        return done
    m = rows(b, x, dim)
    nb, n = m.shape
    sv, si = _sort(b, m, 1, False)
    kk = _i64(b, k - 1, (nb,))
    v, i = pick(b, sv, kk), pick(b, si, kk)
    vb = b.broadcast_in_dim(v, m.shape, [0])
    same = b.compare(m, vb, "EQ")
    if x.dtype.is_floating_point:
        same = b.or_(same, b.and_(b.is_nan(m), b.is_nan(vb)))
    ties = b.compare(reduce_sum(b, b.convert(same, torch.int64), [1]), _i64(b, 1, (nb,)), "GT")
    i = b.select(ties, _quickselect_index(b, m, k - 1, ties), i)
    return v, i


# -- mode ---------------------------------------------------------------------------------------
def _insertion_sort(b, a, ix):
    """libstdc++'s __insertion_sort of the rows of (a, ix) by `a[p] < a[q]`, unrolled over the
    (static) row length: element i goes to the front if it is below a[0], else just after the
    nearest element on its left it is not below. With NaN (never below, nothing below it) this is
    what CPU's std::sort does to rows of up to 16 elements."""
    nb, n = a.shape
    pos = b.iota((nb, n), 1)
    for i in range(1, n):
        val = b.slice(a, [0, i], [nb, i + 1])
        vi = b.slice(ix, [0, i], [nb, i + 1])
        vb = b.broadcast_in_dim(b.reshape(val, [nb]), (nb, n), [0])
        front = b.compare(b.reshape(val, [nb]), b.reshape(b.slice(a, [0, 0], [nb, 1]), [nb]), "LT")
        stop = b.and_(b.not_(b.compare(vb, a, "LT")), b.compare(pos, _i64(b, i, (nb, n)), "LT"))
        last_stop = b.reduce([b.select(stop, pos, _i64(b, -1, (nb, n)))], [_i64(b, -1, ())], [1],
                             lambda s, p, q: s.maximum(p, q))[0]
        at = b.select(front, _i64(b, 0, (nb,)), b.add(last_stop, _i64(b, 1, (nb,))))
        at = b.broadcast_in_dim(at, (nb, n), [0])
        before = b.compare(pos, at, "LT")
        here = b.compare(pos, at, "EQ")
        moved = b.and_(b.compare(pos, at, "GT"), b.compare(pos, _i64(b, i, (nb, n)), "LE"))
        res = []
        for arr, v in ((a, val), (ix, vi)):
            shifted = b.concatenate([b.slice(arr, [0, 0], [nb, 1]), b.slice(arr, [0, 0], [nb, n - 1])], 1)
            res.append(b.select(before, arr, b.select(here, b.broadcast_in_dim(b.reshape(v, [nb]), (nb, n), [0]),
                                                      b.select(moved, shifted, arr))))
        a, ix = res
    return a, ix


@register("mode", check=_check_reduced_dim("mode"), check_per_key=True)
def mode(ctx, x, dim=-1, keepdim=False):
    """CPU sorts (value, index) pairs by value and, over the runs of equal values (`!=` splits,
    so every NaN is a run of its own), reports the first longest run's value and the index of its
    last element. Rows of up to 16 elements are sorted exactly as std::sort does (insertion sort);
    longer rows are sorted stably (NaN last), which gives CPU's value whenever there is no NaN,
    and the last occurrence as the index."""
    b = ctx.b
    done = _trivial(ctx, x, dim)
    if done is not None:
        return done
    m = rows(b, x, dim)
    nb, n = m.shape
    if n <= 16:
        sv, si = _insertion_sort(b, m, b.iota((nb, n), 1))
    else:
        sv, si = _sort(b, m, 1, False)
    pos = b.iota((nb, n), 1)
    if n > 1:
        head, tail = b.slice(sv, [0, 0], [nb, n - 1]), b.slice(sv, [0, 1], [nb, n])
        differ = b.compare(head, tail, "NE")  # between p and p+1
        f = b.constant(True, torch.bool, (nb, 1))
        ends = b.concatenate([differ, f], 1)
        starts = b.concatenate([f, differ], 1)
    else:
        ends = starts = b.constant(True, torch.bool, (nb, n))
    first = b.select(starts, pos, _i64(b, 0, (nb, n)))
    run_start = b.reduce_window([first], [_i64(b, 0, ())], [1, n], [1, 1], [(0, 0), (n - 1, 0)],
                                lambda s, p, q: s.maximum(p, q))[0]
    freq = b.select(ends, b.add(b.subtract(pos, run_start), _i64(b, 1, (nb, n))), _i64(b, 0, (nb, n)))
    _, best = arg_reduce(b, freq, 1, True)
    return pick(b, sv, best), pick(b, si, best)


# -- searchsorted / bucketize --------------------------------------------------------------------
def _search(b, ss, vals, right, sorter, out_dtype):
    """CPU's binary search, step for step (so that NaNs, which break monotonicity, land where they
    do on CPU): start/end per value, mid = start + (end - start) / 2, go right while
    !(ss[mid] >= v) (left) or !(ss[mid] > v) (right). ss: [R, M] (R = 1: shared by all values),
    vals: [R, K], sorter: [R, M] int64 or None. Returns [R, K] in out_dtype."""
    r, mlen = ss.shape
    k = vals.shape[1]
    shape = (r, k)
    start, end = _i64(b, 0, shape), _i64(b, mlen, shape)
    if mlen == 0 or k == 0:
        return b.convert(start, out_dtype)
    row = b.reshape(b.iota(shape, 0), shape + (1,))

    def at(m, col):
        coords = b.concatenate([row, b.reshape(col, shape + (1,))], 2)
        return b.gather(m, coords, offset_dims=[], collapsed=[0, 1], start_index_map=[0, 1], index_vector_dim=2,
                        slice_sizes=[1, 1], out_shape=shape)
    for _ in range(mlen.bit_length()):  # each step at least halves end - start
        live = b.compare(start, end, "LT")
        mid = b.add(start, b.divide(b.subtract(end, start), _i64(b, 2, shape)))
        col = b.minimum(mid, _i64(b, mlen - 1, shape))
        if sorter is not None:
            col = b.clamp(_i64(b, 0, ()), at(sorter, col), _i64(b, mlen - 1, ()))
        mv = at(ss, col)
        go = b.not_(b.compare(mv, vals, "GT" if right else "GE"))
        start = b.select(b.and_(live, go), b.add(mid, _i64(b, 1, shape)), start)
        end = b.select(b.and_(live, b.not_(go)), mid, end)
    return b.convert(start, out_dtype)


def _check_searchsorted(ss, vals, out_int32=False, right=False, side=None, sorter=None):
    if side is not None and side not in ("left", "right"):
        raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
    if side == "left" and right:
        raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of left "
                           "while right was True")
    if sorter is not None and sorter.numel():
        h = sorter.detach().cpu()
        if bool(((h < 0) | (h >= ss.shape[-1])).any()):
            raise RuntimeError("torch.searchsorted(): sorter index out of range")


def _searchsorted(ctx, ss, vals, out_int32, right, side, sorter, common):
    b = ctx.b
    out = ctx.out[0]
    right = bool(right) or side == "right"
    ssv, v = b.convert(ss, common), b.convert(vals, common)
    mlen = ss.shape[-1] if ss.rank else 1
    if ss.rank <= 1:
        ss2 = b.reshape(ssv, [1, mlen])
        v2 = b.reshape(v, [1, v.type.numel])
        so = None if sorter is None else b.reshape(b.convert(sorter, torch.int64), [1, mlen])
    else:
        nr = ss.type.numel // mlen if mlen else math.prod(ss.shape[:-1])
        ss2 = b.reshape(ssv, [nr, mlen])
        v2 = b.reshape(v, [nr, v.type.numel // nr if nr else 0])
        so = None if sorter is None else b.reshape(b.convert(sorter, torch.int64), [nr, mlen])
    if out.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    return b.reshape(_search(b, ss2, v2, right, so, out.dtype), out.shape)


@register("searchsorted.Tensor", check=_check_searchsorted)
def searchsorted(ctx, ss, vals, out_int32=False, right=False, side=None, sorter=None):
    """Both tensors compared in their promoted dtype (torch.promote_types, as CPU)."""
    common = torch.promote_types(ss.dtype, vals.dtype)
    return _searchsorted(ctx, ss, vals, out_int32, right, side, sorter, common)


@register("searchsorted.Scalar", check=_check_searchsorted)
def searchsorted_scalar(ctx, ss, val, out_int32=False, right=False, side=None, sorter=None):
    """A Scalar value promotes as a wrapped number (a float into an int sequence gives float)."""
    return _searchsorted(ctx, ss, val, out_int32, right, side, sorter, ctx.promote(ss, val))


@register("bucketize.Tensor")
def bucketize(ctx, x, boundaries, out_int32=False, right=False):
    return _searchsorted(ctx, boundaries, x, out_int32, right, None, None,
                         torch.promote_types(x.dtype, boundaries.dtype))


@register("bucketize.Scalar")
def bucketize_scalar(ctx, x, boundaries, out_int32=False, right=False):
    return _searchsorted(ctx, boundaries, x, out_int32, right, None, None, ctx.promote(boundaries, x))


# -- isin ---------------------------------------------------------------------------------------
# Up to this many element/test pairs, isin compares every pair; past it, it searches the sorted test
# elements (n log m). Both give the same booleans; the cut-off only bounds the compare's memory.
_ISIN_PAIRS = 1 << 22


def _isin_meta(elements, test, assume_unique=False, invert=False):
    """A bool result of elements' shape; Bool and complex inputs refused with CPU's message (PyTorch's
    meta kernel prints the dtype as Python does)."""
    for v in (elements, test):
        dt = v.dtype if isinstance(v, torch.Tensor) else torch.tensor(v).dtype
        if dt == torch.bool or dt.is_complex:
            raise RuntimeError(f"Unsupported input type encountered for isin(): {scalar_type_name(dt)}")
    like = elements if isinstance(elements, torch.Tensor) else test
    return torch.empty(elements.shape if isinstance(elements, torch.Tensor) else (), dtype=torch.bool,
                       device=like.device)


def _isin(ctx, elements, test, invert):
    """CPU's isin: equality in the promoted dtype (so NaN is in nothing); `assume_unique` changes
    nothing but speed on CPU and is ignored."""
    b, out = ctx.b, ctx.out[0]
    common = ctx.promote(elements, test)
    n, m = math.prod(elements.shape), math.prod(test.shape)
    if n == 0 or m == 0:
        return b.constant(bool(invert) and n > 0, torch.bool, out.shape)
    e = b.reshape(b.convert(elements, common), [n, 1])
    t = b.reshape(b.convert(test, common), [1, m])
    if n * m <= _ISIN_PAIRS:
        eq = b.compare(b.broadcast_to(e, (n, m)), b.broadcast_to(t, (n, m)), "EQ")
        found = b.reduce([eq], [b.constant(False, torch.bool)], [1], lambda bb, acc, x: bb.or_(acc, x))[0]
    else:
        ts = b.sort([t, b.iota((1, m), 1)], 1, _nan_last_less(False), stable=False)[0]
        keys = ts  # NaNs (sorted last) searched as +inf, so the search stays monotonic; never equal
        if common.is_floating_point:
            keys = b.select(b.is_nan(ts), b.constant(math.inf, common, (1, m)), ts)
        at = _search(b, keys, b.reshape(e, [1, n]), False, None, torch.int64)
        col = b.minimum(at, _i64(b, m - 1, (1, n)))
        near = b.gather(b.reshape(ts, [m]), b.reshape(col, [n, 1]), offset_dims=[], collapsed=[0],
                        start_index_map=[0], index_vector_dim=1, slice_sizes=[1], out_shape=(n,))
        found = b.compare(near, b.reshape(e, [n]), "EQ")
    if invert:
        found = b.not_(found)
    return b.reshape(found, out.shape)


@register("isin.Tensor_Tensor", meta=_isin_meta)
def isin(ctx, elements, test_elements, assume_unique=False, invert=False):
    return _isin(ctx, elements, test_elements, invert)


@register("isin.Tensor_Scalar", meta=_isin_meta)
def isin_tensor_scalar(ctx, elements, test_element, assume_unique=False, invert=False):
    return _isin(ctx, elements, test_element, invert)


@register("isin.Scalar_Tensor", meta=_isin_meta)
def isin_scalar_tensor(ctx, element, test_elements, assume_unique=False, invert=False):
    return _isin(ctx, element, test_elements, invert)


# -- histc --------------------------------------------------------------------------------------
def _histc_range(x, lo, hi):
    """CPU's outer edges (as doubles): the data's min and max when min == max, widened by 1 on
    each side if still equal; errors as CPU's."""
    if lo == hi and x.numel() > 0:
        lo, hi = float(x.detach().min().cpu()), float(x.detach().max().cpu())  # a host sync
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if math.isinf(lo) or math.isinf(hi) or math.isnan(lo) or math.isnan(hi):
        fmt = lambda v: ("-nan" if math.isnan(v) else f"{v:g}")  # noqa: E731
        raise RuntimeError(f"torch.histc: range of [{fmt(lo)}, {fmt(hi)}] is not finite")
    if not lo < hi:
        raise RuntimeError("torch.histc: max must be larger than min")


def _check_histc(x, bins=100, lo=0, hi=0):
    if x.dtype == torch.bool or x.dtype.is_complex:
        raise NotImplementedError(f"\"histogram_cpu\" not implemented for '{str(x.dtype)[6:].capitalize()}'")
    if bins <= 0:
        raise RuntimeError(f"torch.histc(): bins must be > 0, but got {bins} for dimension 0")
    _histc_range(x, float(lo), float(hi))


@register("histc", check=_check_histc, cpu_dtypes=False)  # integers counted, as CUDA
def histc(ctx, x, bins=100, lo=0, hi=0):
    """Edges from min/max (or the data's extrema when equal); an element e in [left, right] goes to
    bin trunc((e - left) * bins / (right - left)) computed op by op in the input dtype (as CPU's
    scalar_t arithmetic), the right edge into the last bin; NaN and outside values are dropped.

    Integer inputs are counted as CUDA counts them (CPU raises "not implemented" for them; MoE
    routers such as transformers' count experts with histc on int32 on accelerators): the edges are
    min/max truncated to the input dtype, and the bin is computed in int64 with integer division."""
    b = ctx.b
    out = ctx.out[0]
    dt = x.dtype
    integral = not dt.is_floating_point
    cd = torch.int64 if integral else compute_dtype(dt)
    n = x.type.numel
    if n == 0:
        return b.constant(0, dt, out.shape)

    def rnd(v):  # one scalar_t operation's rounding (CUDA's integer bins are int64 arithmetic)
        return v if integral else b.convert(b.convert(v, dt), cd)

    def edge(v):  # the edges are scalar_t: an integer input's are truncated (Scalar::to<scalar_t>)
        return b.convert(b.convert(v, dt), cd) if integral else b.convert(v, cd)
    flat = b.convert(b.reshape(x, [n]), cd)
    lo_v = edge(lo) if lo is not None else b.constant(0, cd)
    hi_v = edge(hi) if hi is not None else b.constant(0, cd)
    same = b.compare(lo_v, hi_v, "EQ")
    from .reduction import reduce_max
    mn, mx = reduce_max(b, flat, [0], False), reduce_max(b, flat, [0], True)
    left, right = b.select(same, mn, lo_v), b.select(same, mx, hi_v)
    same = b.compare(left, right, "EQ")
    one = b.constant(1, cd)
    left = rnd(b.select(same, b.subtract(left, one), left))
    right = rnd(b.select(same, b.add(right, one), right))
    lb, rb = b.broadcast_to(left, (n,)), b.broadcast_to(right, (n,))
    keep = b.and_(b.compare(flat, lb, "GE"), b.compare(flat, rb, "LE"))
    pos = rnd(b.multiply(rnd(b.subtract(flat, lb)), b.constant(bins, cd, (n,))))
    pos = rnd(b.divide(pos, rnd(b.subtract(rb, lb))))
    idx = b.convert(b.select(keep, pos, b.zeros_like(pos)), torch.int64)
    idx = b.minimum(idx, _i64(b, bins - 1, (n,)))
    idx = b.select(keep, idx, _i64(b, bins, (n,)))  # out of range: dropped by the scatter
    counts = b.scatter(b.constant(0, cd, (bins,)), b.reshape(idx, [n, 1]), b.convert(keep, cd), [], [0], [0], 1,
                       lambda s, p, q: s.add(p, q))
    return b.convert(counts, dt)


# -- kernels with host-side logic --------------------------------------------------------------
def equal(a, b):
    """torch.equal: same shape and every element equal (after promotion; NaN is unequal), computed
    on the device; the one bool is read back (a host sync, the op returns a python bool)."""
    if a.device != b.device:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{a.device} and {b.device}!")
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return bool(torch.ops.aten.all.default(torch.ops.aten.eq.Tensor(a, b)).item())


host_kernel("equal", equal)


def bincount(x, weights=None, minlength=0):
    """Counts (or summed weights) of each value of a 1-D non-negative integer tensor; the length
    max(x) + 1 (at least minlength) is data: x's max is read back first (a host sync), then a
    scatter-add on the device builds the result."""
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        names = {torch.bool: "Bool", torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
                 torch.bfloat16: "BFloat16", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}
        raise NotImplementedError(f"\"bincount_cpu\" not implemented for '{names.get(x.dtype, x.dtype)}'")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if x.dim() != 1:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != x.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    idx = x.long()
    if x.numel():
        lo, hi = torch.ops.aten.aminmax.default(idx)
        lo, hi = int(lo.item()), int(hi.item())
        if lo < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        size = max(minlength, hi + 1)
    else:
        size = minlength
    if weights is None:
        dt, src = torch.int64, torch.ones(x.shape, dtype=torch.int64, device=x.device)
    else:
        dt = torch.float32 if weights.dtype == torch.float32 else torch.float64
        src = weights.to(dt)
    out = torch.zeros(size, dtype=dt, device=x.device)
    return out.scatter_add_(0, idx, src) if x.numel() else out


host_kernel("bincount", bincount)


def _triangle_indices(upper):
    def kernel(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
        """The (2, count) coordinates of the triangle in row-major order: the mask built and
        compacted on the device (nonzero_static); the count is known from the arguments."""
        if row < 0:
            raise RuntimeError(f"row must be non-negative, got{row}")
        if col < 0:
            raise RuntimeError(f"col must be non-negative, got{col}")
        dtype = torch.int64 if dtype is None else dtype
        count = sum(max(0, min(col, col - (r + offset))) if upper else max(0, min(col, r + offset + 1))
                    for r in range(row))
        mask = torch.ones((row, col), dtype=torch.bool, device=device)
        mask = torch.ops.aten.triu.default(mask, offset) if upper else torch.ops.aten.tril.default(mask, offset)
        idx = torch.ops.aten.nonzero_static.default(mask, size=count, fill_value=-1)
        return idx.t().contiguous().to(dtype)
    return kernel


host_kernel("triu_indices", _triangle_indices(True))
host_kernel("tril_indices", _triangle_indices(False))


# -- unique (data-dependent length: the number of distinct values is read back) ----------------
def _runs(keys, sorted_idx, n, return_inverse, return_counts, inverse_shape):
    """(first position of each run, inverse, counts) of the run flags `keys` ([n] bool, True where
    a new run starts); only the run count crosses to the host."""
    dev = keys.device
    count = int(keys.sum().item())  # the data-dependent size: a host sync
    starts = torch.ops.aten.nonzero_static.default(keys, size=count, fill_value=-1).reshape(-1)
    inverse = counts = torch.empty(0, dtype=torch.int64, device=dev)
    if return_inverse:
        gid = torch.cumsum(keys.long(), 0) - 1
        if sorted_idx is not None:
            gid = torch.zeros(n, dtype=torch.int64, device=dev).scatter_(0, sorted_idx, gid)
        inverse = gid.reshape(inverse_shape)
    if return_counts:
        ends = torch.cat([starts[1:], torch.full((1,), n, dtype=torch.int64, device=dev)]) if count else starts
        counts = ends - starts
    return starts, inverse, counts


def _run_starts(v):
    """True at position 0 and wherever v[p] != v[p - 1] along dim 0 (any element of a slice)."""
    if v.shape[0] == 0:
        return torch.zeros(0, dtype=torch.bool, device=v.device)
    differ = torch.ne(v[1:], v[:-1])
    if differ.dim() > 1:
        differ = differ.flatten(1).any(1)
    return torch.cat([torch.ones(1, dtype=torch.bool, device=v.device), differ])


def unique2(x, sorted=True, return_inverse=False, return_counts=False):
    """torch.unique without dim: always sorted (as CPU), NaNs each distinct (NaN last); a stable
    sort, run starts, compaction (nonzero_static) on the device."""
    n = x.numel()
    flat = x.reshape(-1)
    if n == 0:
        empty = torch.empty(0, dtype=torch.int64, device=x.device)
        return flat.clone(), (empty.reshape(x.shape) if return_inverse else empty), empty
    sv, si = torch.sort(flat, stable=True)
    starts, inverse, counts = _runs(_run_starts(sv), si, n, return_inverse, return_counts, x.shape)
    return sv.index_select(0, starts), inverse, counts


host_kernel("_unique2", unique2)


def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    """One element (or slice along dim) per run of equal neighbours."""
    if dim is None:
        v, ishape = x.reshape(-1), x.shape
    else:
        d = dim % max(x.dim(), 1)
        v, ishape = x.movedim(d, 0), (x.shape[d] if x.dim() else 1,)
        return_inverse = return_counts = True  # CPU's unique_dim_consecutive computes both
    n = v.shape[0] if v.dim() else 1
    if v.numel() == 0 and dim is None:
        empty = torch.empty(0, dtype=torch.int64, device=x.device)
        return v.clone(), (empty.reshape(x.shape) if return_inverse else empty), empty
    starts, inverse, counts = _runs(_run_starts(v), None, n, return_inverse, return_counts, ishape)
    out = v.index_select(0, starts)
    return (out if dim is None else out.movedim(0, d)), inverse, counts


host_kernel("unique_consecutive", unique_consecutive)


# -- histogram ----------------------------------------------------------------------------------
def _histogram_counts(b, flat, edges, nb, weight, density, local_search):
    """CPU's histogram of the [n] Value flat over the [nb + 1] edges: elements outside
    [edges[0], edges[-1]] (and NaN) dropped; the bin is upper_bound(edges, e) - 1, the last edge in
    the last bin. local_search: the guess trunc((e - left) * nb / (right - left)) refined by
    upper_bound over edges[guess - 1 : guess + 2] (bin_ct, edges from linspace); otherwise
    upper_bound over all edges (a bins tensor)."""
    dt = flat.dtype
    n = flat.shape[0]
    ne = nb + 1
    left = b.broadcast_to(b.slice(edges, [0], [1]), (n,))
    right = b.broadcast_to(b.slice(edges, [nb], [ne]), (n,))
    keep = b.and_(b.compare(flat, left, "GE"), b.compare(flat, right, "LE"))
    le = b.compare(b.broadcast_in_dim(edges, (n, ne), [1]), b.broadcast_in_dim(flat, (n, ne), [0]), "LE")
    q = b.iota((n, ne), 1)
    if local_search:
        guess = b.divide(b.multiply(b.subtract(flat, left), b.constant(nb, dt, (n,))), b.subtract(right, left))
        guess = b.convert(b.select(keep, guess, b.zeros_like(guess)), torch.int64)
        lo = b.maximum(b.subtract(guess, _i64(b, 1, (n,))), _i64(b, 0, (n,)))
        hi = b.minimum(b.add(guess, _i64(b, 2, (n,))), _i64(b, ne, (n,)))
        inside = b.and_(b.compare(q, b.broadcast_in_dim(lo, (n, ne), [0]), "GE"),
                        b.compare(q, b.broadcast_in_dim(hi, (n, ne), [0]), "LT"))
        cnt = reduce_sum(b, b.convert(b.and_(le, inside), torch.int64), [1])
        pos = b.subtract(b.add(lo, cnt), _i64(b, 1, (n,)))
    else:
        pos = b.subtract(reduce_sum(b, b.convert(le, torch.int64), [1]), _i64(b, 1, (n,)))
    pos = b.clamp(_i64(b, 0, ()), pos, _i64(b, nb - 1, ()))
    pos = b.select(keep, pos, _i64(b, nb, (n,)))  # dropped by the scatter
    w = b.constant(1, dt, (n,)) if weight is None else b.reshape(b.convert(weight, dt), [n])
    hist = b.scatter(b.constant(0, dt, (nb,)), b.reshape(pos, [n, 1]), w, [], [0], [0], 1,
                     lambda s, p, c: s.add(p, c))
    if density:
        total = reduce_sum(b, hist, [0])
        widths = b.subtract(b.slice(edges, [1], [ne]), b.slice(edges, [0], [nb]))
        hist = b.divide(b.divide(hist, b.broadcast_to(total, (nb,))), widths)
    return hist


def _linspace(b, start, end, steps, dt):
    """CPU's linspace of float Values start, end (0-dim, dtype dt): start + step * i for the first
    half, end - step * (steps - 1 - i) for the rest."""
    shape = (steps,)
    s, e = b.broadcast_to(start, shape), b.broadcast_to(end, shape)
    step = b.divide(b.subtract(e, s), b.constant(steps - 1, dt, shape))
    i = b.iota(shape, 0, dt)
    lo = b.add(s, b.multiply(step, i))
    hi = b.subtract(e, b.multiply(step, b.subtract(b.constant(steps - 1, dt, shape), i)))
    return b.select(b.compare(b.iota(shape, 0), _i64(b, steps // 2, shape), "LT"), lo, hi)


def _check_histogram(x, bins=100, range=None, weight=None, density=False):
    if range is not None:
        lo, hi = float(range[0]), float(range[1])
    elif x.numel():
        lo, hi = float(x.detach().min().cpu()), float(x.detach().max().cpu())  # a host sync
    else:
        return
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise RuntimeError(f"torch.histogramdd: dimension 0's range [{lo:g}, {hi:g}] is not finite")
    if lo > hi:
        raise RuntimeError(f"torch.histogramdd: min should not exceed max, but got min {lo:g} max {hi:g} for "
                           f"dimension 0")


# PyTorch has no meta kernels for histogram (the eager front-end types results with them).
def _histogram_meta(x, bins=100, *, range=None, weight=None, density=False):
    nb = bins if isinstance(bins, int) else bins.numel() - 1
    return x.new_empty((nb,)), x.new_empty((nb + 1,))


host_kernel("histogram.bin_ct", _histogram_meta, "Meta")
host_kernel("histogram.bins_tensor", _histogram_meta, "Meta")


@register("histogram.bin_ct", check=_check_histogram)
def histogram_bin_ct(ctx, x, bins=100, range=None, weight=None, density=False):
    """Edges: linspace over `range`, or the data's [min, max] ([0, 1] for no data), widened by 1/2
    each side when empty, in x's dtype."""
    b = ctx.b
    dt = x.dtype
    n = x.type.numel
    flat = b.reshape(x, [n])
    if range is not None:
        lo, hi = b.constant(float(range[0]), torch.float64), b.constant(float(range[1]), torch.float64)
    elif n:
        from .reduction import reduce_max
        lo = b.convert(reduce_max(b, flat, [0], False), torch.float64)
        hi = b.convert(reduce_max(b, flat, [0], True), torch.float64)
    else:
        lo, hi = b.constant(0.0, torch.float64), b.constant(1.0, torch.float64)
    same = b.compare(lo, hi, "EQ")
    half = b.constant(0.5, torch.float64)
    lo = b.convert(b.select(same, b.subtract(lo, half), lo), dt)
    hi = b.convert(b.select(same, b.add(hi, half), hi), dt)
    edges = _linspace(b, lo, hi, bins + 1, dt)
    if n == 0:
        return b.constant(0, dt, (bins,)), edges
    return _histogram_counts(b, flat, edges, bins, weight, density, True), edges


def _check_histogram_bins(x, bins, weight=None, density=False):
    if bins.dtype != x.dtype:
        raise RuntimeError("torch.histogramdd: input tensor and bins tensors should have the same dtype, but got "
                           f"input {x.dtype} and bins {bins.dtype}")
    if bins.dim() != 1:
        raise RuntimeError(f"torch.histogramdd: bins tensor should have one dimension, but got {bins.dim()} "
                           f"dimensions in the bins tensor for dimension 0")
    if bins.numel() == 0:
        raise RuntimeError("torch.histogramdd: bins tensor should have at least 1 element, but got 0 elements "
                           "in the bins tensor for dimension 0")


@register("histogram.bins_tensor", check=_check_histogram_bins, check_per_key=True)
def histogram_bins_tensor(ctx, x, bins, weight=None, density=False):
    b = ctx.b
    dt = x.dtype
    n = x.type.numel
    nb = bins.type.numel - 1
    edges = b.convert(bins, dt)
    if n == 0 or nb == 0:
        return b.constant(0, dt, (nb,)), edges
    return _histogram_counts(b, b.reshape(x, [n]), edges, nb, weight, density, False), edges
