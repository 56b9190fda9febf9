"""Reductions: sum, mean, prod, amax/amin, max/min (with indices), argmax/argmin, var/std, any/all,
logsumexp, vector norms and cumulative sums. Result dtypes and shapes come from the meta kernels;
half-precision inputs accumulate in float32 as PyTorch's CPU kernels do; max/min propagate NaN and
return the index of the first maximum (or first NaN), as on CPU."""
from __future__ import annotations

import math

import torch

from .elementwise import compute_dtype
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


def _nan_max(b, x, y, name):
    r = b.binary(name, x, y)
    if x.dtype.is_floating_point:
        r = b.select(b.is_nan(x), x, b.select(b.is_nan(y), y, r))
    return r


def reduce_max(b, x, dims, is_max=True):
    """NaN-propagating max (or min) over dims."""
    name = "maximum" if is_max else "minimum"
    init = b.constant(_lowest(x.dtype) if is_max else _highest(x.dtype), x.dtype)
    return b.reduce([x], [init], dims, lambda s, a, e: _nan_max(s, a, e, name))[0]


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


@register("mean.dim")
def mean_dim(ctx, x, dim=None, keepdim=False, dtype=None):
    b = ctx.b
    out = ctx.out[0].dtype
    acc = compute_dtype(out)
    dims = reduce_dims(dim, x.rank)
    s = reduce_sum(b, b.convert(x, acc), dims)
    return _keep(ctx, b.convert(b.divide(s, b.full_like(s, count(x, dims))), out))


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


@register("amax")
def amax(ctx, x, dim=(), keepdim=False):
    return _keep(ctx, reduce_max(ctx.b, x, reduce_dims(dim, x.rank), True))


@register("amin")
def amin(ctx, x, dim=(), keepdim=False):
    return _keep(ctx, reduce_max(ctx.b, x, reduce_dims(dim, x.rank), False))


def _check_nonempty(name):
    def check(x, *rest):
        if x.numel() == 0:
            raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                               f"Specify the reduction dim with the 'dim' argument.")
    return check


@register("max", check=_check_nonempty("max"))
def max_all(ctx, x):
    return _keep(ctx, reduce_max(ctx.b, x, list(range(x.rank)), True))


@register("min", check=_check_nonempty("min"))
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
        b = ctx.b
        if x.rank == 0:
            return x, b.constant(0, torch.int64)
        v, i = arg_reduce(b, x, dim % x.rank, is_max)
        return _keep(ctx, v, 0), _keep(ctx, i, 1)
    return lower


register("max.dim")(_max_dim(True))
register("min.dim")(_max_dim(False))


def _check_arg(name):
    def check(x, dim=None, keepdim=False):
        if x.dtype == torch.bool:  # the meta kernel accepts it, CPU does not
            raise RuntimeError(f"{name}(): does not support bool input")
        if dim is None and x.numel() == 0:
            raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.")
    return check


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


register("argmax", check=_check_arg("argmax"))(_argmax(True))
register("argmin", check=_check_arg("argmin"))(_argmax(False))


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


def var_of(ctx, x, dims, correction):
    """(variance, mean) over dims in the compute dtype; divisor max(0, N - correction) as on CPU."""
    b = ctx.b
    xv = b.convert(x, compute_dtype(x.dtype))
    n = count(x, dims)
    s = reduce_sum(b, xv, dims)
    mean = b.divide(s, b.full_like(s, n))
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
    dof = b.maximum(b.subtract(b.constant(n, ss.dtype), corr), b.constant(0, ss.dtype))
    var = b.divide(ss, b.broadcast_to(dof, ss.shape))
    return var, mean


def _check_var(x, *rest):
    if not (x.dtype.is_floating_point or x.dtype.is_complex):  # the meta kernel accepts ints
        raise RuntimeError("std and var only support floating point and complex dtypes")


@register("var.correction", check=_check_var)
def var(ctx, x, dim=None, correction=None, keepdim=False):
    v, _ = var_of(ctx, x, reduce_dims(dim, x.rank), correction)
    return _keep(ctx, v)


@register("std.correction", check=_check_var)
def std(ctx, x, dim=None, correction=None, keepdim=False):
    v, _ = var_of(ctx, x, reduce_dims(dim, x.rank), correction)
    return _keep(ctx, ctx.b.sqrt(v))


@register("var_mean.correction", check=_check_var)
def var_mean(ctx, x, dim=None, correction=None, keepdim=False):
    v, m = var_of(ctx, x, reduce_dims(dim, x.rank), correction)
    return _keep(ctx, v, 0), _keep(ctx, m, 1)


@register("std_mean.correction", check=_check_var)
def std_mean(ctx, x, dim=None, correction=None, keepdim=False):
    v, m = var_of(ctx, x, reduce_dims(dim, x.rank), correction)
    return _keep(ctx, ctx.b.sqrt(v), 0), _keep(ctx, m, 1)


@register("logsumexp")
def logsumexp(ctx, x, dim, keepdim=False):
    b = ctx.b
    cd = compute_dtype(ctx.out[0].dtype)
    xv = b.convert(x, cd)
    dims = reduce_dims(dim, x.rank)
    m = reduce_max(b, xv, dims, True)
    # An infinite max would give inf - inf = nan: shift by 0 instead (CPU does the same).
    m = b.select(b.compare(b.abs(m), b.full_like(m, math.inf), "EQ"), b.zeros_like(m), m)
    keep_shape = [1 if i in dims else d for i, d in enumerate(x.shape)]
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


def _cumulative(op):
    def lower(ctx, x, dim, dtype=None):
        b = ctx.b
        out = ctx.out[0].dtype
        acc = compute_dtype(out)
        xv = b.convert(x, acc)
        if x.rank == 0:
            return b.convert(xv, out)
        d = dim % x.rank
        n = x.shape[d]
        window = [1] * x.rank
        window[d] = max(n, 1)
        padding = [(0, 0)] * x.rank
        padding[d] = (max(n, 1) - 1, 0)
        init = b.constant(0 if op == "add" else 1, acc)
        r = b.reduce_window([xv], [init], window, [1] * x.rank, padding,
                            lambda s, a, e: s.binary(op, a, e))[0]
        return b.convert(r, out)
    return lower


register("cumsum")(_cumulative("add"))
register("cumprod")(_cumulative("multiply"))


def _cum_extreme(is_max):
    """cummax/cummin with CPU's choice of index: the latest position holding the running extreme,
    and once a NaN is seen it is the extreme (the latest NaN's position). One reduce_window of
    (value, index) pairs ordered by (is NaN, value (reversed for min), index)."""
    def lower(ctx, x, dim):
        b = ctx.b
        if x.rank == 0:
            return x, b.constant(0, torch.int64)
        if ctx.out[0].numel == 0:
            return b.constant(0, x.dtype, x.shape), b.constant(0, torch.int64, x.shape)
        d = dim % x.rank
        n = x.shape[d]
        window = [1] * x.rank
        window[d] = n
        padding = [(0, 0)] * x.rank
        padding[d] = (n - 1, 0)
        idx = b.iota(x.shape, d)
        init_v = b.constant(_lowest(x.dtype) if is_max else _highest(x.dtype), x.dtype)
        init_i = b.constant(-1, torch.int64)

        def body(s, va, ia, vb, ib):
            better = s.compare(vb, va, "GT" if is_max else "LT")
            tie = s.compare(vb, va, "EQ")
            if x.dtype.is_floating_point:
                na, nb = s.is_nan(va), s.is_nan(vb)
                better = s.or_(s.and_(nb, s.not_(na)), s.and_(s.not_(na), better))
                tie = s.or_(s.and_(na, nb), tie)
            take_b = s.or_(better, s.and_(tie, s.compare(ib, ia, "GT")))
            return [s.select(take_b, vb, va), s.select(take_b, ib, ia)]
        v, i = b.reduce_window([x, idx], [init_v, init_i], window, [1] * x.rank, padding, body)
        return v, i
    return lower


register("cummax")(_cum_extreme(True))
register("cummin")(_cum_extreme(False))
