"""Reductions: sum, mean, prod, amax/amin, max/min (with indices), argmax/argmin, var/std, any/all,
logsumexp, vector norms and cumulative sums. Result dtypes and shapes come from the meta kernels;
half-precision inputs accumulate in float32 as PyTorch's CPU kernels do; max/min propagate NaN and
return the index of the first maximum (or first NaN), as on CPU."""
from __future__ import annotations

import math
import warnings

import torch

from .elementwise import compute_dtype
from .builder import Value
from .helpers import arith, bounded
from .helpers.checks import meta_result
from .registry import register


def reduce_dims(dim, rank, empty_means_all=True):
    """Normalized, sorted dims; None (and [] unless empty_means_all=False) mean every dim."""
    if dim is None:
        return list(range(rank))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return list(range(rank)) if empty_means_all else []
    return sorted({d % max(rank, 1) for d in dim if rank > 0})


def _lowest(dtype):
    if dtype.is_floating_point:
        return -math.inf
    if dtype == torch.bool:
        return False
    return torch.iinfo(dtype).min


def _highest(dtype):
    if dtype.is_floating_point:
        return math.inf
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def reduce_sum(b, x, dims):
    """Sum over dims in x's dtype (bool sums as logical or)."""
    fn = "or_" if x.dtype == torch.bool else "add"
    return b.reduce([x], [b.constant(0, x.dtype)], dims, lambda s, a, e: getattr(s, fn)(a, e))[0]


def reduce_max(b, x, dims, is_max=True):
    """NaN-propagating max (or min) over dims: XLA's maximum/minimum propagate NaN (on TPU; the CPU
    and CUDA plugins are told to, plugins.own_xla_flag), so the reduction body is the bare op —
    an explicit is-NaN select there made libtpu 0.0.52's fusion pass crash on attention's softmax."""
    name = "maximum" if is_max else "minimum"
    init = b.constant(_lowest(x.dtype) if is_max else _highest(x.dtype), x.dtype)
    return b.reduce([x], [init], dims, lambda s, a, e: s.binary(name, a, e))[0]


def _keep(ctx, r, i=0):
    return ctx.b.reshape(r, ctx.out[i].shape)


@register("sum.dim_IntList")
def sum_dim(ctx, x, dim=None, keepdim=False, dtype=None):
    b = ctx.b
    out = ctx.out[0].dtype
    acc = compute_dtype(out)
    return _keep(ctx, b.convert(reduce_sum(b, b.convert(x, acc), reduce_dims(dim, x.rank)), out))


@register("sum")
def sum_all(ctx, x, dtype=None):
    return sum_dim(ctx, x, None)


def count(x, dims):
    return math.prod(x.shape[d] for d in dims)


def count_value(b, x, dims, dtype):
    """The number of elements over `dims` of x as a `dtype` scalar Value: a constant, or, in a
    bucketed graph (x.sizes), the product of the true sizes passed at launch."""
    sizes = getattr(x, "sizes", None)
    if not sizes or all(sizes[d] is None for d in dims):
        return b.constant(count(x, dims), dtype)
    n = b.constant(1, dtype)
    for d in dims:
        n = b.multiply(n, b.constant(x.shape[d], dtype) if sizes[d] is None else b.convert(sizes[d], dtype))
    return n


@register("mean.dim")
def mean_dim(ctx, x, dim=None, keepdim=False, dtype=None):
    b = ctx.b
    out = ctx.out[0].dtype
    acc = compute_dtype(out)
    dims = reduce_dims(dim, x.rank)
    s = reduce_sum(b, b.convert(x, acc), dims)
    return _keep(ctx, b.convert(b.divide(s, b.broadcast_to(count_value(b, x, dims, s.dtype), s.shape)), out))


@register("mean")
def mean_all(ctx, x, dtype=None):
    return mean_dim(ctx, x, None)


@register("prod.dim_int")
def prod_dim(ctx, x, dim=None, keepdim=False, dtype=None):
    b = ctx.b
    out = ctx.out[0].dtype
    acc = compute_dtype(out)
    xv = b.convert(x, acc)
    fn = "and_" if acc == torch.bool else "multiply"
    r = b.reduce([xv], [b.constant(1, acc)], reduce_dims(dim, x.rank), lambda s, a, e: getattr(s, fn)(a, e))[0]
    return _keep(ctx, b.convert(r, out))


@register("prod")
def prod_all(ctx, x, dtype=None):
    return prod_dim(ctx, x, None)


def _amax_meta(name):
    """amax / amin's result with CPU's checks of an empty input (PyTorch's meta kernel raises its own
    "reducing over zero-size dimension ..." RuntimeError for both cases)."""
    def meta(x, dim=(), keepdim=False):
        dims = [dim] if isinstance(dim, int) else list(dim)
        if x.numel() == 0:
            if not dims:
                raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                                   f"Specify the reduction dim with the 'dim' argument.")
            for d in dims:
                if x.dim() and x.shape[d % x.dim()] == 0:
                    raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")  # as given
        return meta_result(getattr(torch.ops.aten, name), x, dim, keepdim)
    return meta


@register("amax", meta=_amax_meta("amax"))
def amax(ctx, x, dim=(), keepdim=False):
    return _keep(ctx, reduce_max(ctx.b, x, reduce_dims(dim, x.rank), True))


@register("amin", meta=_amax_meta("amin"))
def amin(ctx, x, dim=(), keepdim=False):
    return _keep(ctx, reduce_max(ctx.b, x, reduce_dims(dim, x.rank), False))


def _check_nonempty(name):
    def check(x, *rest):
        if x.numel() == 0:
            raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                               f"Specify the reduction dim with the 'dim' argument.")
    return check


@register("max", check=_check_nonempty("max"), check_per_key=True)
def max_all(ctx, x):
    return _keep(ctx, reduce_max(ctx.b, x, list(range(x.rank)), True))


@register("min", check=_check_nonempty("min"), check_per_key=True)
def min_all(ctx, x):
    return _keep(ctx, reduce_max(ctx.b, x, list(range(x.rank)), False))


def arg_reduce(b, x, dim, is_max):
    """(values, int64 indices) of the max/min along one dim: first occurrence, NaN wins (first NaN)."""
    idx = b.iota(x.shape, dim, torch.int64)
    direction = "GT" if is_max else "LT"

    def body(s, av, ai, bv, bi):
        if av.dtype.is_floating_point:
            an, bn = s.is_nan(av), s.is_nan(bv)
            strictly = s.or_(s.and_(an, s.not_(bn)),
                             s.and_(s.not_(s.or_(an, bn)), s.compare(av, bv, direction)))
            equal = s.or_(s.compare(av, bv, "EQ"), s.and_(an, bn))
        else:
            strictly = s.compare(av, bv, direction)
            equal = s.compare(av, bv, "EQ")
        pick_a = s.or_(strictly, s.and_(equal, s.compare(ai, bi, "LT")))
        return [s.select(pick_a, av, bv), s.select(pick_a, ai, bi)]

    init_v = b.constant(_lowest(x.dtype) if is_max else _highest(x.dtype), x.dtype)
    init_i = b.constant(torch.iinfo(torch.int64).max, torch.int64)
    v, i = b.reduce([x, idx], [init_v, init_i], [dim], body)
    return v, i


def _max_dim(is_max):
    def lower(ctx, x, dim, keepdim=False):
        name = "max" if is_max else "min"  # CPU's checks, in CPU's order
        if x.rank and x.shape[dim % x.rank] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {dim % x.rank} to have non-zero size.")
        if x.dtype.is_complex:
            raise RuntimeError(f"{name}(): does not support complex input")
        b = ctx.b
        if x.rank == 0:
            return x, b.constant(0, torch.int64)
        v, i = arg_reduce(b, x, dim % x.rank, is_max)
        return _keep(ctx, v, 0), _keep(ctx, i, 1)
    return lower


register("max.dim")(_max_dim(True))
register("min.dim")(_max_dim(False))


def _arg_meta(name):
    """argmax / argmin's result with CPU's checks in CPU's order (PyTorch's meta kernel accepts bool
    and complex, and calls an empty input's error a RuntimeError)."""
    def meta(x, dim=None, keepdim=False):
        if x.dtype == torch.bool:
            raise RuntimeError(f"{name}(): does not support bool input")
        if x.dtype.is_complex:
            raise RuntimeError(f"{name}(): does not support complex input")
        if dim is None and x.numel() == 0:
            raise IndexError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.")
        if dim is not None and x.dim() and x.shape[dim % x.dim()] == 0:  # (the meta's words lack the "()")
            raise IndexError(f"{name}(): Expected reduction dim {dim % x.dim()} to have non-zero size.")
        return meta_result(getattr(torch.ops.aten, name), x, dim, keepdim)
    return meta


def _argmax(is_max):
    def lower(ctx, x, dim=None, keepdim=False):
        b = ctx.b
        if x.rank == 0:
            return b.constant(0, torch.int64)
        if dim is None:
            x, d = b.reshape(x, [x.type.numel]), 0
        else:
            d = dim % x.rank
        return _keep(ctx, arg_reduce(b, x, d, is_max)[1])
    return lower


register("argmax", meta=_arg_meta("argmax"))(_argmax(True))
register("argmin", meta=_arg_meta("argmin"))(_argmax(False))


def _any_all(is_any):
    def lower(ctx, x, dim=None, keepdim=False):
        b = ctx.b
        dims = reduce_dims(dim, x.rank, empty_means_all=False) if isinstance(dim, (list, tuple)) \
            else reduce_dims(dim, x.rank)
        xv = b.convert(x, torch.bool)
        fn = "or_" if is_any else "and_"
        r = b.reduce([xv], [b.constant(not is_any, torch.bool)], dims, lambda s, a, e: getattr(s, fn)(a, e))[0]
        return _keep(ctx, b.convert(r, ctx.out[0].dtype))
    return lower


register("any.dim", "any.dims", "any")(_any_all(True))
register("all.dim", "all.dims", "all")(_any_all(False))


def var_of(ctx, x, dims, correction, fname):
    """(variance, mean) over dims in the compute dtype; divisor max(0, N - correction) as on CPU,
    with CPU's warning (ReduceOps.cpp, naming the op `fname`) where that is not positive. The warning
    is given when the program is built: for the call's correction, which the program reads at run time
    unless it is None or -1..1 (then the key fixes it); a later call with a correction of its own is not
    warned."""
    b = ctx.b
    xv = b.convert(x, compute_dtype(x.dtype))
    n = count(x, dims)
    c = 1 if correction is None else correction.example
    if isinstance(c, (int, float)) and n - c <= 0:
        warnings.warn(f"{fname}(): degrees of freedom is <= 0. Correction should be strictly less than the "
                      "reduction factor (input numel divided by output numel).", UserWarning, stacklevel=2)
    s = reduce_sum(b, xv, dims)
    # N: the true count in a bucketed graph (count_value), where `n` above is the bucket's
    mean = b.divide(s, b.broadcast_to(count_value(b, x, dims, s.dtype), s.shape))
    keep_shape = [1 if i in dims else d for i, d in enumerate(x.shape)]
    centered = b.subtract(xv, b.broadcast_to(b.reshape(mean, keep_shape), x.shape))
    if centered.dtype.is_complex:  # |c|^2, a real sum
        from .builder import TensorType
        rt = TensorType(centered.shape, torch.float64 if centered.dtype == torch.complex128 else torch.float32)
        re = b.op("stablehlo.real", [centered], [rt])[0]
        im = b.op("stablehlo.imag", [centered], [rt])[0]
        ss = reduce_sum(b, b.add(b.multiply(re, re), b.multiply(im, im)), dims)
    else:
        ss = reduce_sum(b, b.multiply(centered, centered), dims)
    # correction is a runtime Scalar (one program serves every value)
    corr = b.constant(1, ss.dtype) if correction is None else b.convert(correction, ss.dtype)
    dof = b.maximum(b.subtract(count_value(b, x, dims, ss.dtype), corr), b.constant(0, ss.dtype))
    var = b.divide(ss, b.broadcast_to(dof, ss.shape))
    return var, mean


def _check_var(x, *rest):
    if not (x.dtype.is_floating_point or x.dtype.is_complex):  # the meta kernel accepts ints
        raise RuntimeError("std and var only support floating point and complex dtypes")


@register("var.correction", check=_check_var, check_per_key=True)
def var(ctx, x, dim=None, correction=None, keepdim=False):
    v, _ = var_of(ctx, x, reduce_dims(dim, x.rank), correction, "var")
    return _keep(ctx, v)


@register("std.correction", check=_check_var, check_per_key=True)
def std(ctx, x, dim=None, correction=None, keepdim=False):
    v, _ = var_of(ctx, x, reduce_dims(dim, x.rank), correction, "std")
    return _keep(ctx, ctx.b.sqrt(v))


@register("var_mean.correction", check=_check_var, check_per_key=True)
def var_mean(ctx, x, dim=None, correction=None, keepdim=False):
    v, m = var_of(ctx, x, reduce_dims(dim, x.rank), correction, "var_mean")
    return _keep(ctx, v, 0), _keep(ctx, m, 1)


@register("std_mean.correction", check=_check_var, check_per_key=True)
def std_mean(ctx, x, dim=None, correction=None, keepdim=False):
    v, m = var_of(ctx, x, reduce_dims(dim, x.rank), correction, "std_mean")
    return _keep(ctx, ctx.b.sqrt(v), 0), _keep(ctx, m, 1)


@register("logsumexp")
def logsumexp(ctx, x, dim, keepdim=False):
    b = ctx.b
    cd = compute_dtype(ctx.out[0].dtype)
    xv = b.convert(x, cd)
    dims = reduce_dims(dim, x.rank)
    # Complex input shifts by the largest real part (PyTorch's reference logsumexp does the same).
    re = b.unary("real", xv, cd.to_real()) if cd.is_complex else xv
    m = reduce_max(b, re, dims, True)
    # An infinite max would give inf - inf = nan: shift by 0 instead (CPU does the same).
    m = b.select(b.compare(b.abs(m), b.full_like(m, math.inf), "EQ"), b.zeros_like(m), m)
    keep_shape = [1 if i in dims else d for i, d in enumerate(x.shape)]
    if cd.is_complex:
        m = b.convert(m, cd)
    shifted = b.subtract(xv, b.broadcast_to(b.reshape(m, keep_shape), x.shape))
    r = b.add(b.log(reduce_sum(b, b.exp(shifted), dims)), m)
    return _keep(ctx, b.convert(r, ctx.out[0].dtype))


@register("linalg_vector_norm")
def vector_norm(ctx, x, ord=2, dim=None, keepdim=False, dtype=None):
    """ord is a runtime Scalar (programs are shared across its values): every case is computed
    and the one for ord is selected."""
    b = ctx.b
    out = ctx.out[0].dtype
    cd = compute_dtype(out)
    dims = reduce_dims(dim, x.rank)
    if x.dtype.is_complex:  # the modulus, not the real part
        from .builder import TensorType
        real = torch.float64 if x.dtype == torch.complex128 else torch.float32
        a = b.convert(b.op("stablehlo.abs", [x], [TensorType(x.shape, real)])[0], cd)
    else:
        a = b.abs(b.convert(x, cd))
    p = b.convert(ord, cd)
    pb = b.broadcast_to(p, a.shape)
    zero = b.zeros_like(a)
    general = reduce_sum(b, b.power(a, pb), dims)
    pr = b.broadcast_to(p, general.shape)
    general = b.power(general, b.divide(b.full_like(general, 1), pr))
    two = b.sqrt(reduce_sum(b, b.multiply(a, a), dims))
    one = reduce_sum(b, a, dims)
    nonzero = reduce_sum(b, b.convert(b.compare(a, zero, "NE"), cd), dims)
    mx = reduce_max(b, a, dims, True)
    mn = reduce_max(b, a, dims, False)
    r = general
    for val, res in ((2, two), (1, one), (0, nonzero), (math.inf, mx), (-math.inf, mn)):
        r = b.select(b.compare(pr, b.full_like(pr, val), "EQ"), res, r)
    return _keep(ctx, b.convert(r, out))


def _scan_window(x, dim):
    """(window, padding) of a reduce_window that computes an inclusive scan of x along dim: each
    output reads its whole prefix (window = dim size, that size - 1 padding before)."""
    d, n = dim % x.rank, max(x.shape[dim % x.rank], 1)
    window = [1] * x.rank
    window[d] = n
    padding = [(0, 0)] * x.rank
    padding[d] = (n - 1, 0)
    return window, padding


def _cumulative(op):
    def lower(ctx, x, dim, dtype=None):
        b = ctx.b
        out = ctx.out[0].dtype
        acc = compute_dtype(out)
        xv = b.convert(x, acc)
        if x.rank == 0:
            return b.convert(xv, out)
        window, padding = _scan_window(x, dim)
        identity = 0 if op == "add" else 1
        xv = bounded.filled(b, Value(xv.name, xv.type, None, x.sizes), identity)  # a bucketed graph's padding
        r = b.reduce_window([xv], [b.constant(identity, acc)], window, [1] * x.rank, padding,
                            lambda s, a, e: s.binary(op, a, e))[0]
        return b.convert(r, out)
    return lower


register("cumsum")(_cumulative("add"))
register("cumprod")(_cumulative("multiply"))


def _log_add_exp(s, x, y):
    """log(exp(x) + exp(y)) as CPU's logcumsumexp step: the larger plus log1p(exp(smaller - larger));
    equal infinities give themselves (-inf stays -inf), NaN propagates. Complex numbers are ordered
    by real part; two +inf real parts give log(exp(x) + exp(y))."""
    if not x.dtype.is_complex:
        mx, mn = s.maximum(x, y), s.minimum(x, y)
        r = s.add(s.unary("log_plus_one", s.exp(s.subtract(mn, mx))), mx)
        inf_tie = s.and_(s.compare(mn, mx, "EQ"), s.compare(s.abs(mn), s.constant(math.inf, x.dtype), "EQ"))
        r = s.select(inf_tie, mn, r)
        return s.select(s.is_nan(x), x, s.select(s.is_nan(y), y, r))
    from .builder import TensorType
    real = torch.float64 if x.dtype == torch.complex128 else torch.float32
    re = lambda v: s.op("stablehlo.real", [v], [TensorType((), real)])[0]  # noqa: E731
    im = lambda v: s.op("stablehlo.imag", [v], [TensorType((), real)])[0]  # noqa: E731
    y_big = s.compare(re(y), re(x), "GT")
    mx, mn = s.select(y_big, y, x), s.select(y_big, x, y)
    r = s.add(s.unary("log_plus_one", s.exp(s.subtract(mn, mx))), mx)
    rmn, rmx = re(mn), re(mx)
    inf = s.constant(math.inf, real)
    tie = s.compare(rmn, rmx, "EQ")
    r = s.select(s.and_(tie, s.compare(rmn, s.negate(inf), "EQ")), mn, r)
    r = s.select(s.and_(tie, s.compare(rmn, inf, "EQ")), s.log(s.add(s.exp(mn), s.exp(mx))), r)
    nan = s.or_(s.or_(s.is_nan(re(x)), s.is_nan(im(x))), s.or_(s.is_nan(re(y)), s.is_nan(im(y))))
    return s.select(nan, s.constant(complex(math.nan, math.nan), x.dtype), r)


@register("logcumsumexp")
def logcumsumexp(ctx, x, dim):
    """Running log-sum-exp along dim (a reduce_window of the log-add-exp step, -inf the identity),
    accumulated in CPU's accumulation type (float32 -> float64, half -> float32, complex64 ->
    complex128) and rounded once per element, as CPU's scan does."""
    b = ctx.b
    out = ctx.out[0].dtype
    cd = {torch.float32: torch.float64, torch.complex64: torch.complex128}.get(out, compute_dtype(out))
    xv = b.convert(x, cd)
    if x.rank == 0 or x.type.numel == 0:
        return b.convert(xv, out)
    window, padding = _scan_window(x, dim)
    init = b.constant(complex(-math.inf, 0) if cd.is_complex else -math.inf, cd)
    r = b.reduce_window([xv], [init], window, [1] * x.rank, padding, lambda s, a, e: _log_add_exp(s, a, e))[0]
    return b.convert(r, out)


@register("addbmm")
def addbmm(ctx, self, x, y, beta=None, alpha=None):
    """beta * self + alpha * sum_b x[b] @ y[b]: one dot_general contracting the batch and inner dims."""
    from .linalg import dot
    out = ctx.out[0]
    if out.dtype == torch.bool:
        raise NotImplementedError("\"addbmm_impl_cpu_\" not implemented for 'Bool'")
    if x.shape[0] == 0 or x.shape[2] == 0:
        prod = ctx.b.constant(0, compute_dtype(out.dtype), out.shape)
    else:
        prod = dot(ctx.b, x, y, ([], []), ([0, 2], [0, 1]), out.dtype)
    return arith.add_scaled(ctx, self, prod, beta, alpha)


def _cum_extreme(is_max):
    """cummax/cummin with CPU's choice of index: the latest position holding the running extreme,
    and once a NaN is seen it is the extreme (the latest NaN's position). Two single-operand
    reduce_windows: the running extreme (XLA's maximum / minimum propagate NaN, plugins.own_xla_flag),
    then the running latest position where x reaches it (x equals it, or x is NaN). A variadic
    reduce_window of (value, index) pairs failed XLA:CPU's compiler from about 100 x 100 elements
    (a RET_CHECK in its reduce-window rewrite)."""
    def lower(ctx, x, dim):
        b = ctx.b
        if x.rank == 0:
            return x, b.constant(0, torch.int64)
        if ctx.out[0].numel == 0:
            return b.constant(0, x.dtype, x.shape), b.constant(0, torch.int64, x.shape)
        d = dim % x.rank
        window, padding = _scan_window(x, d)
        xv = b.convert(x, torch.uint8) if x.dtype == torch.bool else x
        init_v = b.constant(_lowest(xv.dtype) if is_max else _highest(xv.dtype), xv.dtype)
        pick = "maximum" if is_max else "minimum"
        v = b.reduce_window([xv], [init_v], window, [1] * x.rank, padding,
                            lambda s, a, e: [getattr(s, pick)(a, e)])[0]
        reached = b.compare(xv, v, "EQ")
        if x.dtype.is_floating_point:
            reached = b.or_(reached, b.is_nan(xv))
        where = b.select(reached, b.iota(x.shape, d), b.constant(-1, torch.int64, x.shape))
        i = b.reduce_window([where], [b.constant(-1, torch.int64)], window, [1] * x.rank, padding,
                            lambda s, a, e: [s.maximum(a, e)])[0]
        return b.convert(v, x.dtype), i
    return lower


register("cummax")(_cum_extreme(True))
register("cummin")(_cum_extreme(False))


def _check_hash(x, dim=(), keepdim=False, mode=0):
    if mode != 0:
        raise RuntimeError(f"hash_tensor: mode {mode} is not supported")
    if x.numel() == 0 and not dim:
        raise RuntimeError("hash_tensor: Expected reduction dim to be specified for input.numel() == 0. Specify the "
                           "reduction dim with the 'dim' argument.")


@register("hash_tensor", check=_check_hash, check_per_key=True)
def hash_tensor(ctx, x, dim=(), keepdim=False, mode=0):
    """mode 0: XOR of the 64-bit patterns of the elements (floats as float64, integers and bool
    sign-extended to int64), as a uint64 reduction over dims."""
    b = ctx.b
    if x.dtype.is_floating_point:
        bits = b.bitcast_convert(b.convert(x, torch.float64), torch.uint64)
    else:
        bits = b.bitcast_convert(b.convert(x, torch.int64), torch.uint64)
    r = b.reduce([bits], [b.constant(0, torch.uint64)], reduce_dims(dim, x.rank), lambda s, p, q: s.xor(p, q))[0]
    return _keep(ctx, r)


# -- distances: cdist / pdist ---------------------------------------------------------------------
def _pair_diffs(b, x1, x2, batch):
    """x1 [..., P, M], x2 [..., R, M] broadcast to the batch dims: (x1_i - x2_j) as [*batch, P, R, M]."""
    p, m = x1.shape[-2:]
    r = x2.shape[-2]
    nb = len(batch)
    full = tuple(batch) + (p, r, m)
    a = b.broadcast_in_dim(b.broadcast_to(x1, tuple(batch) + (p, m)), full, list(range(nb)) + [nb, nb + 2])
    c = b.broadcast_in_dim(b.broadcast_to(x2, tuple(batch) + (r, m)), full, list(range(nb)) + [nb + 1, nb + 2])
    return b.subtract(a, c)


def _p_norm_last(b, diff, p):
    """CPU's distance of each difference vector (last dim): count of nonzeros (p = 0), sum |d|
    (1), sqrt of the sum of squares (2), max |d| (inf), else (sum |d|^p)^(1/p). p is a python
    float: a distinct program per p (it selects the formula, as on CPU)."""
    a = b.abs(diff)
    last = diff.rank - 1
    if p == 0:
        return reduce_sum(b, b.convert(b.compare(a, b.zeros_like(a), "NE"), a.dtype), [last])
    if p == 1:
        return reduce_sum(b, a, [last])
    if p == 2:
        return b.sqrt(reduce_sum(b, b.multiply(a, a), [last]))
    if math.isinf(p):
        return reduce_max(b, a, [last], True)
    s = reduce_sum(b, b.power(a, b.full_like(a, p)), [last])
    return b.power(s, b.full_like(s, 1.0 / p))


def _euclidean_mm(b, x1, x2, batch, out_dtype):
    """CPU's matrix-product form for p = 2: sqrt(clamp_min(|a|^2 - 2 a.b + |b|^2, 0)) computed as
    [-2a, |a|^2, 1] . [b, 1, |b|^2]."""
    from .linalg import dot
    nb = len(batch)
    x1 = b.broadcast_to(x1, tuple(batch) + x1.shape[-2:])
    x2 = b.broadcast_to(x2, tuple(batch) + x2.shape[-2:])
    n1 = reduce_sum(b, b.multiply(x1, x1), [nb + 1])
    n2 = reduce_sum(b, b.multiply(x2, x2), [nb + 1])
    n1 = b.reshape(n1, n1.shape + (1,))
    n2 = b.reshape(n2, n2.shape + (1,))
    a = b.concatenate([b.multiply(x1, b.full_like(x1, -2)), n1, b.full_like(n1, 1)], nb + 1)
    c = b.concatenate([x2, b.full_like(n2, 1), n2], nb + 1)
    r = dot(b, a, c, (list(range(nb)), list(range(nb))), ([nb + 1], [nb + 1]), out_dtype)
    return b.sqrt(b.maximum(r, b.zeros_like(r)))


def _check_cdist(x1, x2, p, compute_mode=None):
    if not x1.dtype.is_floating_point:
        raise RuntimeError(f"cdist only supports floating-point dtypes, X1 got: {x1.dtype}")
    if p < 0:
        raise RuntimeError("cdist only supports non-negative p values")


@register("_cdist_forward", check=_check_cdist, check_per_key=True)
def cdist_forward(ctx, x1, x2, p, compute_mode=None):
    b, out = ctx.b, ctx.out[0]
    if out.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    batch = out.shape[:-2]
    cd = compute_dtype(out.dtype)
    x1, x2 = b.convert(x1, cd), b.convert(x2, cd)
    if x1.shape[-1] == 0:
        return b.constant(0, out.dtype, out.shape)
    mode = compute_mode or 0
    if p == 2 and (mode == 1 or (mode == 0 and (x1.shape[-2] > 25 or x2.shape[-2] > 25))):
        return b.convert(_euclidean_mm(b, x1, x2, batch, cd), out.dtype)
    return b.convert(_p_norm_last(b, _pair_diffs(b, x1, x2, batch), p), out.dtype)


def _dist_grad(b, diff, dist, grad, p):
    """d dist / d x1 times grad, per element of diff [..., P, R, M] (dist, grad: [..., P, R]), CPU's
    formulas (a zero distance gives zero)."""
    shape = diff.shape
    dims = list(range(diff.rank - 1))
    d = b.broadcast_in_dim(dist, shape, dims)
    g = b.broadcast_in_dim(grad, shape, dims)
    zero = b.zeros_like(diff)
    sign = b.unary("sign", diff)
    a = b.abs(diff)
    if p == 0:
        return zero
    if p == 1:
        return b.multiply(sign, g)
    if p == 2:
        r = b.divide(b.multiply(g, diff), d)
    elif math.isinf(p):
        r = b.multiply(b.multiply(g, sign), b.convert(b.compare(a, d, "EQ"), diff.dtype))
    elif p < 2:
        r = b.divide(b.multiply(b.multiply(sign, b.power(a, b.full_like(a, p - 1))), g),
                     b.power(d, b.full_like(d, p - 1)))
        if p < 1:
            r = b.select(b.compare(diff, zero, "EQ"), zero, r)
    else:
        r = b.divide(b.multiply(b.multiply(diff, b.power(a, b.full_like(a, p - 2))), g),
                     b.power(d, b.full_like(d, p - 1)))
    return b.select(b.compare(d, zero, "EQ"), zero, r)


@register("_cdist_backward")
def cdist_backward(ctx, grad, x1, x2, p, cdist):
    """Gradient for x1 (expanded to the batch dims): sum over x2's rows of grad * d dist / d x1."""
    b, out = ctx.b, ctx.out[0]
    if out.numel == 0 or x2.shape[-2] == 0:
        return b.constant(0, out.dtype, out.shape)
    cd = compute_dtype(out.dtype)
    batch = out.shape[:-2]
    diff = _pair_diffs(b, b.convert(x1, cd), b.convert(x2, cd), batch)
    full = tuple(batch) + diff.shape[-3:-1]
    g = _dist_grad(b, diff, b.broadcast_to(b.convert(cdist, cd), full), b.broadcast_to(b.convert(grad, cd), full), p)
    return b.convert(reduce_sum(b, g, [diff.rank - 2]), out.dtype)


def _upper_pairs(b, n):
    """Flat positions i * n + j of the pairs i < j in row-major order (pdist's order), [n(n-1)/2]."""
    k = n * (n - 1) // 2
    pos = b.iota((n * n,), 0)
    i = b.divide(pos, b.constant(n, torch.int64, (n * n,)))
    j = b.remainder(pos, b.constant(n, torch.int64, (n * n,)))
    key = b.convert(b.compare(j, i, "LE"), torch.int32)  # pairs first, in order (stable sort)
    _, spos = b.sort([key, pos], 0, lambda s, a0, a1, p0, p1: s.compare(a0, a1, "LT"), stable=True)
    return b.slice(spos, [0], [k])


def _check_pdist(x, p=2):
    if x.dim() != 2:
        raise RuntimeError(f"pdist only supports 2D tensors, got: {x.dim()}D")
    if not x.dtype.is_floating_point:
        raise RuntimeError("pdist only supports floating-point dtypes")
    if p < 0:
        raise RuntimeError("pdist only supports non-negative p values")


@register("_pdist_forward", check=_check_pdist, check_per_key=True)
def pdist_forward(ctx, x, p=2):
    b, out = ctx.b, ctx.out[0]
    n = x.shape[0]
    if out.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    cd = compute_dtype(out.dtype)
    xv = b.convert(x, cd)
    d = b.reshape(_p_norm_last(b, _pair_diffs(b, xv, xv, ()), p), [n * n])
    k = out.numel
    picked = b.gather(d, b.reshape(_upper_pairs(b, n), [k, 1]), [], [0], [0], 1, [1], (k,))
    return b.convert(picked, out.dtype)


@register("_pdist_backward")
def pdist_backward(ctx, grad, x, p, pdist):
    """The pairs' grads and distances scattered into symmetric [n, n] matrices (zero diagonal), then
    cdist's backward of x against itself."""
    b, out = ctx.b, ctx.out[0]
    n = x.shape[0]
    k = n * (n - 1) // 2
    if out.numel == 0 or k == 0:
        return b.constant(0, out.dtype, out.shape)
    cd = compute_dtype(out.dtype)
    idx = b.reshape(_upper_pairs(b, n), [k, 1])

    def sym(v):
        m = b.scatter(b.constant(0, cd, (n * n,)), idx, b.reshape(b.convert(v, cd), [k]), [], [0], [0], 1)
        m = b.reshape(m, [n, n])
        return b.add(m, b.transpose(m, [1, 0]))
    xv = b.convert(x, cd)
    diff = _pair_diffs(b, xv, xv, ())
    g = _dist_grad(b, diff, sym(pdist), sym(grad), p)
    return b.convert(reduce_sum(b, g, [1]), out.dtype)
