"""Batch, layer and group normalization with their backward ops. Statistics are computed in
float32 for half-precision inputs (as PyTorch's CPU kernels do); variance is biased for
normalization and unbiased for the running variance.

native_batch_norm updates running_mean/running_var in place although its schema does not say so;
the generic kernel only writes schema-marked arguments, so native_batch_norm (and
_native_batch_norm_legit, whose outputs mix fresh and written tensors) get small Python kernels that
run the functional lowering and copy the new running statistics back."""
from __future__ import annotations

import torch
from torch._prims_common import suggest_memory_format

from .elementwise import compute_dtype
from .reduction import reduce_sum
from .registry import host_kernel, in_format, register


def _chan(b, v, x, cd):
    """A per-channel (dim 1) vector broadcast to x's shape."""
    return b.broadcast_in_dim(b.convert(v, cd), x.shape, [1])


def _bcast_reduced(b, r, x, dims):
    keep = [1 if i in dims else d for i, d in enumerate(x.shape)]
    return b.broadcast_to(b.reshape(r, keep), x.shape)


def _mean(b, x, dims):
    s = reduce_sum(b, x, dims)
    n = 1
    for d in dims:
        n *= x.shape[d]
    return b.divide(s, b.full_like(s, n))


def _standardize(b, x, dims, eps):
    """(x - mean) * rsqrt(biased var + eps) over `dims`, with the mean, that rsqrt and the var
    (reduced shapes): the core shared by batch, layer and group norm."""
    mean = _mean(b, x, dims)
    centered = b.subtract(x, _bcast_reduced(b, mean, x, dims))
    var = _mean(b, b.multiply(centered, centered), dims)
    rstd = b.rsqrt(b.add(var, b.full_like(var, eps)))
    return b.multiply(centered, _bcast_reduced(b, rstd, x, dims)), mean, rstd, var


def _affine(b, y, w, bias, x, cd, bcast):
    if w is not None:
        y = b.multiply(y, bcast(b, w, x, cd))
    if bias is not None:
        y = b.add(y, bcast(b, bias, x, cd))
    return y


# -- batch norm --------------------------------------------------------------------------------------
def _bn_dims(x):
    return [0] + list(range(2, x.rank))


def _bn_train(ctx, x, w, bias, eps):
    """(out, mean, invstd, biased var, count) over all dims but the channel one."""
    b = ctx.b
    cd = compute_dtype(x.dtype)
    xv = b.convert(x, cd)
    y, mean, invstd, var = _standardize(b, xv, _bn_dims(x), eps)
    y = _affine(b, y, w, bias, xv, cd, _chan)
    n = xv.type.numel // max(x.shape[1], 1)
    return b.convert(y, ctx.out[0].dtype), mean, invstd, var, n


def _bn_eval(ctx, x, w, bias, rm, rv, eps):
    b = ctx.b
    cd = compute_dtype(x.dtype)
    xv = b.convert(x, cd)
    rvv = b.convert(rv, cd)
    invstd = b.rsqrt(b.add(rvv, b.full_like(rvv, eps)))
    y = b.multiply(b.subtract(xv, _chan(b, rm, xv, cd)), _chan(b, invstd, xv, cd))
    return b.convert(_affine(b, y, w, bias, xv, cd, _chan), ctx.out[0].dtype)


def _input_format(outs, x, *args):
    """CPU batch norm lays its output out as input.suggest_memory_format() (row-major for a permuted
    3-D input, where the meta kernel keeps the input's strides)."""
    return [in_format(o, suggest_memory_format(x)) for o in outs]


@register("_native_batch_norm_legit_functional", layout=_input_format)
def batch_norm_functional(ctx, x, w, bias, rm, rv, training, momentum, eps):
    b = ctx.b
    if not training:
        out = _bn_eval(ctx, x, w, bias, rm, rv, eps)
        empty = [b.constant(0, t.dtype, t.shape) for t in ctx.out[1:3]]
        return out, *empty, rm, rv
    out, mean, invstd, var, n = _bn_train(ctx, x, w, bias, eps)
    cd = mean.dtype
    keep = b.full_like(mean, 1 - momentum)
    mom = b.full_like(mean, momentum)
    new_rm = b.add(b.multiply(keep, b.convert(rm, cd)), b.multiply(mom, mean))
    unbiased = b.multiply(var, b.full_like(var, n / (n - 1) if n > 1 else float("inf")))
    new_rv = b.add(b.multiply(keep, b.convert(rv, cd)), b.multiply(mom, unbiased))
    return out, mean, invstd, new_rm, new_rv


@register("_native_batch_norm_legit.no_stats", layout=_input_format)
def batch_norm_no_stats(ctx, x, w, bias, training, momentum, eps):
    out, mean, invstd, _, _ = _bn_train(ctx, x, w, bias, eps)
    return out, mean, invstd


@register("_native_batch_norm_legit_no_training", layout=_input_format)
def batch_norm_no_training(ctx, x, w, bias, rm, rv, momentum, eps):
    b = ctx.b
    out = _bn_eval(ctx, x, w, bias, rm, rv, eps)
    return out, *[b.constant(0, t.dtype, t.shape) for t in ctx.out[1:3]]


@register("native_batch_norm_backward")
def batch_norm_backward(ctx, grad, x, w, rm, rv, save_mean, save_invstd, train, eps, output_mask):
    b = ctx.b
    cd = compute_dtype(x.dtype)
    xv, g = b.convert(x, cd), b.convert(grad, cd)
    dims = _bn_dims(x)
    if train:
        mean, invstd = b.convert(save_mean, cd), b.convert(save_invstd, cd)
    else:
        mean = b.convert(rm, cd)
        rvv = b.convert(rv, cd)
        invstd = b.rsqrt(b.add(rvv, b.full_like(rvv, eps)))
    xhat = b.multiply(b.subtract(xv, _chan(b, mean, xv, cd)), _chan(b, invstd, xv, cd))
    results = [None, None, None]
    if ctx.out[0] is not None:
        scale = _chan(b, invstd, xv, cd)
        if w is not None:
            scale = b.multiply(scale, _chan(b, w, xv, cd))
        if train:
            dg = b.subtract(b.subtract(g, _chan(b, _mean(b, g, dims), xv, cd)),
                            b.multiply(xhat, _chan(b, _mean(b, b.multiply(g, xhat), dims), xv, cd)))
        else:
            dg = g
        results[0] = b.multiply(dg, scale)
    if ctx.out[1] is not None:
        results[1] = reduce_sum(b, b.multiply(g, xhat), dims)
    if ctx.out[2] is not None:
        results[2] = reduce_sum(b, g, dims)
    return [None if r is None else b.convert(r, t.dtype) for r, t in zip(results, ctx.out)]


def _param_dtype(x, *params):
    """CPU's dtype of save_mean/save_invstd: float32 when any parameter is float32 with a
    half-precision input (mixed type), else the input's."""
    if any(p is not None and p.dtype != x.dtype for p in params):
        return torch.float32
    return x.dtype


def _native_batch_norm(x, w, bias, rm, rv, training, momentum, eps):
    aten = torch.ops.aten
    pdt = _param_dtype(x, w, bias, rm, rv)
    if training and rm is not None and rv is not None:
        out, mean, invstd, new_rm, new_rv = aten._native_batch_norm_legit_functional(
            x, w, bias, rm, rv, True, momentum, eps)
        rm.copy_(new_rm)
        rv.copy_(new_rv)
    elif training:
        out, mean, invstd = aten._native_batch_norm_legit.no_stats(x, w, bias, True, momentum, eps)
    else:
        out = aten._native_batch_norm_legit_no_training(x, w, bias, rm, rv, momentum, eps)[0]
        return out, x.new_empty((0,), dtype=pdt), x.new_empty((0,), dtype=pdt)
    return out, mean.to(pdt), invstd.to(pdt)


def _native_batch_norm_legit(x, w, bias, rm, rv, training, momentum, eps):
    return _native_batch_norm(x, w, bias, rm, rv, training, momentum, eps)


def _batch_norm_with_update(x, w, bias, rm, rv, momentum, eps):
    """Training batch norm updating the running stats in place (what export and newer nn.BatchNorm
    paths call); the 4th result is CPU's empty uint8 reserve."""
    out, mean, invstd = _native_batch_norm(x, w, bias, rm, rv, True, momentum, eps)
    return out, mean, invstd, torch.empty(0, dtype=torch.uint8, device=x.device)


def _batch_norm_backward(grad, x, w, rm, rv, save_mean, save_var, update, eps, output_mask, reserve):
    return torch.ops.aten.native_batch_norm_backward(grad, x, w, rm, rv, save_mean, save_var, update, eps,
                                                     output_mask)


host_kernel("native_batch_norm", _native_batch_norm)
host_kernel("_native_batch_norm_legit", _native_batch_norm_legit)
host_kernel("_batch_norm_with_update", _batch_norm_with_update)
host_kernel("batch_norm_backward", _batch_norm_backward)


# -- SyncBatchNorm's ops --------------------------------------------------------------------------
# nn.SyncBatchNorm (torch/nn/modules/_functions.py) splits batch norm into per-rank statistics, a
# combination of every rank's, the normalization and a two-step backward. PyTorch has these ops for
# CUDA only (no CPU kernel for the fallback, no meta kernel); the semantics here are CUDA's
# (aten/src/ATen/native/cuda/Normalization.cu/.cuh): statistics in the accumulate type (float32 for
# half-precision inputs), biased variance, invstd = 1/sqrt(var + eps). The layout of a result only
# shows in its strides, which the meta kernels below give as CUDA does.
def _stats_meta(x, eps):
    c = (x.shape[1],)
    return x.new_empty(c, dtype=compute_dtype(x.dtype)), x.new_empty(c, dtype=compute_dtype(x.dtype))


def _elemt_meta(x, w, bias, mean, invstd, eps):
    return torch.empty_like(x)  # CUDA: empty_like(input), its layout kept


def _backward_reduce_meta(g, x, mean, invstd, w, input_g, weight_g, bias_g):
    """sum_dy, sum_dy_xmu in mean's dtype, grad_weight, grad_bias in weight's; undefined (None) where
    the flag is False, as CUDA leaves them."""
    c = (x.shape[1],)
    pdt = w.dtype if w is not None else mean.dtype
    return tuple(x.new_empty(c, dtype=dt) if on else None
                 for on, dt in ((input_g, mean.dtype), (input_g, mean.dtype), (weight_g, pdt), (bias_g, pdt)))


def _backward_elemt_meta(g, x, mean, invstd, w, sum_dy, sum_dy_xmu, count):
    """CUDA's channels-last kernel (both inputs channels-last) keeps the input's layout; the others
    give a row-major grad_input."""
    fmt = suggest_memory_format(x)
    if suggest_memory_format(g) != fmt:
        fmt = torch.contiguous_format
    return torch.empty_like(x, dtype=g.dtype, memory_format=fmt)


for _name, _meta in (("batch_norm_stats", _stats_meta), ("batch_norm_elemt", _elemt_meta),
                     ("batch_norm_backward_reduce", _backward_reduce_meta),
                     ("batch_norm_backward_elemt", _backward_elemt_meta)):
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{_name}", "Meta"):
        host_kernel(_name, _meta, "Meta")


@register("batch_norm_stats")
def batch_norm_stats(ctx, x, eps):
    """Per channel (dim 1): mean and 1/sqrt(biased var + eps) over all other dims; CUDA's InvStd
    gives 0, not inf, for a zero variance with eps = 0."""
    b = ctx.b
    xv = b.convert(x, compute_dtype(x.dtype))
    _, mean, invstd, var = _standardize(b, xv, _bn_dims(x), eps)
    if eps == 0:
        invstd = b.select(b.compare(var, b.zeros_like(var), "EQ"), b.zeros_like(var), invstd)
    return b.convert(mean, ctx.out[0].dtype), b.convert(invstd, ctx.out[1].dtype)


@register("batch_norm_elemt")
def batch_norm_elemt(ctx, x, w, bias, mean, invstd, eps):
    """((x - mean) * invstd) * weight + bias with the given statistics (eps is unused, as in CUDA)."""
    b = ctx.b
    cd = compute_dtype(x.dtype)
    xv = b.convert(x, cd)
    y = b.multiply(b.subtract(xv, _chan(b, mean, xv, cd)), _chan(b, invstd, xv, cd))
    return b.convert(_affine(b, y, w, bias, xv, cd, _chan), ctx.out[0].dtype)


@register("batch_norm_backward_reduce")
def batch_norm_backward_reduce(ctx, g, x, mean, invstd, w, input_g, weight_g, bias_g):
    """Per channel: sum_dy = sum(g), sum_dy_xmu = sum(g * (x - mean)); grad_weight = sum_dy_xmu *
    invstd, grad_bias = sum_dy (this rank's share; DDP all-reduces the parameter gradients)."""
    b = ctx.b
    cd = compute_dtype(x.dtype)
    xv, gv = b.convert(x, cd), b.convert(g, cd)
    dims = _bn_dims(x)
    sum_dy = reduce_sum(b, gv, dims)
    sum_dy_xmu = reduce_sum(b, b.multiply(gv, b.subtract(xv, _chan(b, mean, xv, cd))), dims)
    grad_w = b.multiply(sum_dy_xmu, b.convert(invstd, cd))
    return [None if t is None else b.convert(v, t.dtype)
            for v, t in zip((sum_dy, sum_dy_xmu, grad_w, sum_dy), ctx.out)]


@register("batch_norm_backward_elemt")
def batch_norm_backward_elemt(ctx, g, x, mean, invstd, w, sum_dy, sum_dy_xmu, count):
    """grad_input = (g - sum_dy / n - (x - mean) * invstd^2 * sum_dy_xmu / n) * weight * invstd, with
    sum_dy, sum_dy_xmu all-reduced over the ranks and n the sum of the per-rank counts."""
    b = ctx.b
    cd = compute_dtype(x.dtype)
    xv, gv = b.convert(x, cd), b.convert(g, cd)
    cnt = b.convert(count, torch.int64 if not count.dtype.is_floating_point else cd)
    n = b.convert(reduce_sum(b, cnt, list(range(count.rank))), cd)
    c = x.shape[1]
    norm = b.broadcast_to(b.divide(b.constant(1, cd), n), (c,))
    s = b.convert(invstd, cd)
    mean_dy = b.multiply(b.convert(sum_dy, cd), norm)
    proj = b.multiply(b.multiply(s, s), b.multiply(b.convert(sum_dy_xmu, cd), norm))
    scale = s if w is None else b.multiply(s, b.convert(w, cd))
    gi = b.subtract(b.subtract(gv, _chan(b, mean_dy, xv, cd)),
                    b.multiply(b.subtract(xv, _chan(b, mean, xv, cd)), _chan(b, proj, xv, cd)))
    return b.convert(b.multiply(gi, _chan(b, scale, xv, cd)), ctx.out[0].dtype)


def _gather_stats_with_counts(x, mean, invstd, rm, rv, momentum, eps, counts):
    """Global mean and invstd from each rank's (mean [W, C], invstd [W, C], counts [W]), and the
    running statistics updated in place (unbiased variance), as CUDA's
    batch_norm_reduce_statistics_kernel does. Written with tpu ops rather than as one lowering: the
    running statistics are written though the schema does not mark them, and no functional ATen
    twin exists to lower (native_batch_norm has _native_batch_norm_legit_functional). Ranks with a
    zero count (empty inputs) are left out instead of turning the result into nan."""
    cd = compute_dtype(mean.dtype)
    m, s = mean.to(cd), invstd.to(cd)
    c = counts.to(cd).reshape(-1, 1)
    zero = c.new_zeros(())
    valid = c > 0
    n = c.sum()
    avg = torch.where(valid, c * m, zero).sum(0) / n
    var = s.reciprocal().square() - eps  # each rank's biased variance: its stats' eps taken out again
    var_n = torch.where(valid, c * (var + (m - avg).square()), zero).sum(0)
    out_invstd = (var_n / n + eps).rsqrt()
    if rm is not None:
        rm.copy_(rm.to(cd) * (1 - momentum) + avg * momentum)
    if rv is not None:
        rv.copy_(rv.to(cd) * (1 - momentum) + var_n / (n - 1) * momentum)
    return avg, out_invstd


def _gather_stats(x, mean, invstd, rm, rv, momentum, eps, count):
    """The same with one count for every rank (CUDA expands it to a counts tensor)."""
    counts = torch.full((mean.shape[0],), count, dtype=rm.dtype if rm is not None else x.dtype, device=x.device)
    return _gather_stats_with_counts(x, mean, invstd, rm, rv, momentum, eps, counts)


host_kernel("batch_norm_gather_stats_with_counts", _gather_stats_with_counts)
host_kernel("batch_norm_gather_stats", _gather_stats)


# -- layer norm --------------------------------------------------------------------------------------
def _trailing(b, v, x, cd):
    return b.broadcast_to(b.convert(v, cd), x.shape)


@register("native_layer_norm")
def layer_norm(ctx, x, normalized_shape, w, bias, eps):
    b = ctx.b
    cd = compute_dtype(x.dtype)
    xv = b.convert(x, cd)
    dims = list(range(x.rank - len(normalized_shape), x.rank))
    y, mean, rstd, _ = _standardize(b, xv, dims, eps)
    y = _affine(b, y, w, bias, xv, cd, _trailing)
    return (b.convert(y, ctx.out[0].dtype), b.reshape(b.convert(mean, ctx.out[1].dtype), ctx.out[1].shape),
            b.reshape(b.convert(rstd, ctx.out[2].dtype), ctx.out[2].shape))


@register("native_layer_norm_backward")
def layer_norm_backward(ctx, grad, x, normalized_shape, mean, rstd, w, bias, output_mask):
    b = ctx.b
    cd = compute_dtype(x.dtype)
    xv, g = b.convert(x, cd), b.convert(grad, cd)
    axis = x.rank - len(normalized_shape)
    dims, outer = list(range(axis, x.rank)), list(range(axis))
    rs = b.broadcast_to(b.convert(rstd, cd), x.shape)
    xhat = b.multiply(b.subtract(xv, b.broadcast_to(b.convert(mean, cd), x.shape)), rs)
    results = [None, None, None]
    if ctx.out[0] is not None:
        gw = g if w is None else b.multiply(g, _trailing(b, w, xv, cd))
        dx = b.subtract(b.subtract(gw, _bcast_reduced(b, _mean(b, gw, dims), xv, dims)),
                        b.multiply(xhat, _bcast_reduced(b, _mean(b, b.multiply(gw, xhat), dims), xv, dims)))
        results[0] = b.multiply(dx, rs)
    if ctx.out[1] is not None:
        results[1] = reduce_sum(b, b.multiply(g, xhat), outer)
    if ctx.out[2] is not None:
        results[2] = reduce_sum(b, g, outer)
    return [None if r is None else b.reshape(b.convert(r, t.dtype), t.shape) for r, t in zip(results, ctx.out)]


# -- group norm --------------------------------------------------------------------------------------
def _grouped(b, v, n, group, cd):
    """(N, C, *) -> (N, group, C/group * HxW)."""
    return b.reshape(b.convert(v, cd), [n, group, v.type.numel // max(n * group, 1)])


def _per_channel(b, v, n, c, hxw, cd):
    """A (C,) vector broadcast to (N, C, HxW)."""
    return b.broadcast_in_dim(b.convert(v, cd), (n, c, hxw), [1])


@register("native_group_norm")
def group_norm(ctx, x, w, bias, N, C, HxW, group, eps):
    b = ctx.b
    cd = compute_dtype(x.dtype)
    xg = _grouped(b, x, N, group, cd)
    xhat, mean, rstd, _ = _standardize(b, xg, [2], eps)
    y = b.reshape(xhat, [N, C, HxW])
    if w is not None:
        y = b.multiply(y, _per_channel(b, w, N, C, HxW, cd))
    if bias is not None:
        y = b.add(y, _per_channel(b, bias, N, C, HxW, cd))
    return (b.reshape(b.convert(y, ctx.out[0].dtype), ctx.out[0].shape), b.convert(mean, ctx.out[1].dtype),
            b.convert(rstd, ctx.out[2].dtype))


@register("native_group_norm_backward")
def group_norm_backward(ctx, grad, x, mean, rstd, w, N, C, HxW, group, output_mask):
    b = ctx.b
    cd = compute_dtype(x.dtype)
    shape3 = (N, C, HxW)
    xv, g = b.reshape(b.convert(x, cd), shape3), b.reshape(b.convert(grad, cd), shape3)
    cpg = C // group if group else 0

    def per_group(v):  # (N, group) -> (N, C, HxW)
        v = b.broadcast_in_dim(b.convert(v, cd), (N, group, cpg, HxW), [0, 1])
        return b.reshape(v, shape3)

    rs = per_group(rstd)
    xhat = b.multiply(b.subtract(xv, per_group(mean)), rs)
    results = [None, None, None]
    if ctx.out[0] is not None:
        gw = g if w is None else b.multiply(g, _per_channel(b, w, N, C, HxW, cd))
        gg, xg = _grouped(b, gw, N, group, cd), _grouped(b, xhat, N, group, cd)
        m1 = b.reshape(_bcast_reduced(b, _mean(b, gg, [2]), gg, [2]), shape3)
        m2 = b.reshape(_bcast_reduced(b, _mean(b, b.multiply(gg, xg), [2]), gg, [2]), shape3)
        results[0] = b.multiply(b.subtract(b.subtract(gw, m1), b.multiply(xhat, m2)), rs)
    if ctx.out[1] is not None:
        results[1] = reduce_sum(b, b.multiply(g, xhat), [0, 2])
    if ctx.out[2] is not None:
        results[2] = reduce_sum(b, g, [0, 2])
    return [None if r is None else b.reshape(b.convert(r, t.dtype), t.shape) for r, t in zip(results, ctx.out)]


def _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    """aten::_weight_norm_interface_backward on tpu tensors (weight_norm's backward, dim first or last),
    as CPU's fused kernel computes it per slice of `dim`, in float32 for half inputs: with
    s = sum(grad_w * v) over the other dims, grad_g = s / norm and
    grad_v = g / norm * (grad_w - v * s / norm^2). grad_w, saved_v: the weight's shape; saved_g,
    saved_norms: 1 in every dim but `dim`. (grad_v in v's dtype, grad_g in g's.)"""
    nd = saved_v.dim()
    if not (dim == 0 or dim == nd - 1):  # CPU's kernel asserts it (weight_norm takes another path then)
        raise RuntimeError("_weight_norm_interface_backward: fused kernels can only be applied for first or "
                           f"last dim, got dim {dim} of a {nd}-d weight")
    cd = torch.float32 if saved_v.dtype in (torch.float16, torch.bfloat16) else saved_v.dtype
    gw, v, g, n = (t.to(cd) for t in (grad_w, saved_v, saved_g, saved_norms))
    others = [d for d in range(nd) if d != dim]
    s = (gw * v).sum(dim=others, keepdim=True)
    grad_g = s / n
    grad_v = (g / n) * (gw - v * (s / (n * n)))
    return grad_v.to(saved_v.dtype), grad_g.to(saved_g.dtype)


host_kernel("_weight_norm_interface_backward", _weight_norm_interface_backward)
