"""Softmax, log-softmax and losses (nll, mse, binary cross entropy) with their backward ops.
cross_entropy is PyTorch's composite of log_softmax and nll_loss. Half-precision math runs in
float32; out-of-range targets raise IndexError before anything runs, as on CPU (StableHLO would
silently ignore them)."""
from __future__ import annotations

import torch

from .elementwise import compute_dtype
from .reduction import reduce_max, reduce_sum
from .registry import register

_NONE, _MEAN, _SUM = 0, 1, 2


def _keepdim_bcast(b, r, x, dims):
    """r (x reduced over dims) broadcast back to x's shape."""
    keep = [1 if i in dims else d for i, d in enumerate(x.shape)]
    return b.broadcast_to(b.reshape(r, keep), x.shape)


def _softmax_parts(b, x, dim):
    """(x - max, sum(exp(x - max))) along dim, in the compute dtype."""
    m = reduce_max(b, x, [dim], True)
    # A row of -inf only gives -inf - -inf = nan, as on CPU.
    shifted = b.subtract(x, _keepdim_bcast(b, m, x, [dim]))
    return shifted, reduce_sum(b, b.exp(shifted), [dim])


def _as_rank1(b, x):
    return b.reshape(x, [1]) if x.rank == 0 else x


@register("_softmax")
def softmax(ctx, x, dim, half_to_float=False):
    b = ctx.b
    out = ctx.out[0].dtype
    xv = _as_rank1(b, b.convert(x, compute_dtype(out)))
    d = dim % xv.rank
    shifted, s = _softmax_parts(b, xv, d)
    r = b.divide(b.exp(shifted), _keepdim_bcast(b, s, xv, [d]))
    return b.reshape(b.convert(r, out), ctx.out[0].shape)


@register("_log_softmax")
def log_softmax(ctx, x, dim, half_to_float=False):
    b = ctx.b
    out = ctx.out[0].dtype
    xv = _as_rank1(b, b.convert(x, compute_dtype(out)))
    d = dim % xv.rank
    shifted, s = _softmax_parts(b, xv, d)
    r = b.subtract(shifted, _keepdim_bcast(b, b.log(s), xv, [d]))
    return b.reshape(b.convert(r, out), ctx.out[0].shape)


@register("_softmax_backward_data")
def softmax_backward(ctx, grad, output, dim, input_dtype):
    b = ctx.b
    out = ctx.out[0].dtype
    cd = compute_dtype(out)
    g, y = _as_rank1(b, b.convert(grad, cd)), _as_rank1(b, b.convert(output, cd))
    d = dim % g.rank
    gy = b.multiply(g, y)
    r = b.subtract(gy, b.multiply(y, _keepdim_bcast(b, reduce_sum(b, gy, [d]), g, [d])))
    return b.reshape(b.convert(r, out), ctx.out[0].shape)


@register("_log_softmax_backward_data")
def log_softmax_backward(ctx, grad, output, dim, input_dtype):
    b = ctx.b
    out = ctx.out[0].dtype
    cd = compute_dtype(out)
    g, y = _as_rank1(b, b.convert(grad, cd)), _as_rank1(b, b.convert(output, cd))
    d = dim % g.rank
    r = b.subtract(g, b.multiply(b.exp(y), _keepdim_bcast(b, reduce_sum(b, g, [d]), g, [d])))
    return b.reshape(b.convert(r, out), ctx.out[0].shape)


# -- nll_loss ---------------------------------------------------------------------------------------
def _check_targets(x, target, weight, reduction, ignore_index, *rest):
    if target.numel() == 0:
        return
    classes = x.shape[1] if x.dim() >= 2 else x.shape[0]
    t = target.cpu()
    bad = (t != ignore_index) & ((t < 0) | (t >= classes))
    if bool(bad.any()):
        raise IndexError(f"Target {int(t[bad][0])} is out of bounds.")


def _nll_parts(b, x, target, weight, ignore_index, cd):
    """(class mask, per-target weight with ignored targets zeroed, class dim)."""
    cdim = 1 if x.rank >= 2 else 0
    other = [i for i in range(x.rank) if i != cdim]
    mask = b.compare(b.iota(x.shape, cdim, torch.int64),
                     b.broadcast_in_dim(b.convert(target, torch.int64), x.shape, other), "EQ")
    valid = b.compare(target, b.constant(ignore_index, target.dtype, target.shape), "NE")
    if weight is None:
        wt = b.constant(1, cd, target.shape)
    else:
        wfull = b.broadcast_in_dim(b.convert(weight, cd), x.shape, [cdim])
        wt = reduce_sum(b, b.select(mask, wfull, b.zeros_like(wfull)), [cdim])
    wt = b.select(valid, wt, b.zeros_like(wt))
    return mask, wt, cdim


@register("nll_loss_forward", "nll_loss2d_forward", check=_check_targets)
def nll_loss_forward(ctx, x, target, weight, reduction, ignore_index):
    b = ctx.b
    out = ctx.out[0].dtype
    cd = compute_dtype(out)
    xv = b.convert(x, cd)
    mask, wt, cdim = _nll_parts(b, xv, target, weight, ignore_index, cd)
    picked = reduce_sum(b, b.select(mask, xv, b.zeros_like(xv)), [cdim])
    loss = b.select(b.compare(wt, b.zeros_like(wt), "EQ"), b.zeros_like(wt), b.negate(b.multiply(picked, wt)))
    all_dims = list(range(wt.rank))
    total = reduce_sum(b, wt, all_dims)
    if reduction == _NONE:
        return b.convert(loss, out), b.convert(b.zeros_like(total), ctx.out[1].dtype)
    s = reduce_sum(b, loss, all_dims)
    if reduction == _MEAN:
        s = b.divide(s, total)
    return b.convert(s, out), b.convert(total, ctx.out[1].dtype)


@register("nll_loss_backward", "nll_loss2d_backward")
def nll_loss_backward(ctx, grad, x, target, weight, reduction, ignore_index, total_weight):
    b = ctx.b
    out = ctx.out[0].dtype
    cd = compute_dtype(out)
    xv = b.convert(x, cd)
    mask, wt, cdim = _nll_parts(b, xv, target, weight, ignore_index, cd)
    g = b.convert(grad, cd)
    if reduction == _NONE:
        g = b.broadcast_to(g, wt.shape) if g.rank == 0 else g
    else:
        if reduction == _MEAN:
            g = b.divide(g, b.convert(total_weight, cd))
        g = b.broadcast_to(g, wt.shape)
    per = b.negate(b.multiply(wt, g))
    other = [i for i in range(x.rank) if i != cdim]
    per = b.broadcast_in_dim(per, x.shape, other)
    return b.convert(b.select(mask, per, b.zeros_like(per)), out)


# -- mse / binary cross entropy -----------------------------------------------------------------------
def _reduce(b, r, reduction):
    if reduction == _NONE:
        return r
    s = reduce_sum(b, r, list(range(r.rank)))
    if reduction == _MEAN:
        s = b.divide(s, b.constant(r.type.numel, s.dtype))
    return s


def _pair(ctx, x, y, cd):
    b = ctx.b
    shape = tuple(torch.broadcast_shapes(x.shape, y.shape))
    return b.broadcast_to(b.convert(x, cd), shape), b.broadcast_to(b.convert(y, cd), shape)


@register("mse_loss")
def mse_loss(ctx, x, target, reduction=_MEAN):
    b = ctx.b
    out = ctx.out[0].dtype
    xv, tv = _pair(ctx, x, target, compute_dtype(out))
    d = b.subtract(xv, tv)
    return b.convert(_reduce(b, b.multiply(d, d), reduction), out)


@register("mse_loss_backward")
def mse_loss_backward(ctx, grad, x, target, reduction):
    b = ctx.b
    out = ctx.out[0].dtype
    cd = compute_dtype(out)
    xv, tv = _pair(ctx, x, target, cd)
    scale = 2.0 / xv.type.numel if reduction == _MEAN and xv.type.numel else 2.0
    g = b.broadcast_to(b.convert(grad, cd), xv.shape)
    r = b.multiply(b.multiply(b.full_like(xv, scale), b.subtract(xv, tv)), g)
    return b.convert(r, out)


def _check_bce(x, target, weight=None, reduction=_MEAN):
    if x.numel() and not bool(((x >= 0) & (x <= 1)).all().cpu()):
        raise RuntimeError("all elements of input should be between 0 and 1")


def _bce_weight(b, weight, shape, cd):
    return None if weight is None else b.broadcast_to(b.convert(weight, cd), shape)


@register("binary_cross_entropy", check=_check_bce)
def binary_cross_entropy(ctx, x, target, weight=None, reduction=_MEAN):
    b = ctx.b
    out = ctx.out[0].dtype
    cd = compute_dtype(out)
    xv, tv = _pair(ctx, x, target, cd)
    one = b.full_like(xv, 1)
    floor = b.full_like(xv, -100)  # PyTorch clamps the logs at -100
    lx = b.maximum(b.log(xv), floor)
    l1x = b.maximum(b.log(b.subtract(one, xv)), floor)
    loss = b.negate(b.add(b.multiply(tv, lx), b.multiply(b.subtract(one, tv), l1x)))
    w = _bce_weight(b, weight, xv.shape, cd)
    if w is not None:
        loss = b.multiply(loss, w)
    return b.convert(_reduce(b, loss, reduction), out)


@register("binary_cross_entropy_backward")
def binary_cross_entropy_backward(ctx, grad, x, target, weight=None, reduction=_MEAN):
    b = ctx.b
    out = ctx.out[0].dtype
    cd = compute_dtype(out)
    xv, tv = _pair(ctx, x, target, cd)
    one = b.full_like(xv, 1)
    denom = b.maximum(b.multiply(b.subtract(one, xv), xv), b.full_like(xv, 1e-12))
    r = b.divide(b.subtract(xv, tv), denom)
    g = b.broadcast_to(b.convert(grad, cd), xv.shape)
    if reduction == _MEAN and xv.type.numel:
        g = b.divide(g, b.full_like(g, xv.type.numel))
    r = b.multiply(r, g)
    w = _bce_weight(b, weight, xv.shape, cd)
    if w is not None:
        r = b.multiply(r, w)
    return b.convert(r, out)
