"""Softmax, log-softmax and losses (nll, mse, binary cross entropy) with their backward ops.
cross_entropy is PyTorch's composite of log_softmax and nll_loss. Half-precision math runs in
float32; out-of-range targets raise IndexError before anything runs, as on CPU (StableHLO would
silently ignore them)."""
from __future__ import annotations

import math

import torch
from torch._prims_common import canonicalize_dim

from .elementwise import compute_dtype
from .helpers.checks import meta_result, scalar_type_name
from .reduction import reduce_max, reduce_sum
from .registry import IndexBound, host_kernel, register

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


def _math_dtype(out):
    """Half precision in float32; an integer or complex result only for no elements (CPU refuses
    them otherwise: the dtype probe, eager/kernel.py) computes in float32."""
    return compute_dtype(out) if out.is_floating_point else torch.float32


def _check_softmax_dim(x, dim, half_to_float=False):
    """CPU's IndexError for a dim out of range (PyTorch's meta of _softmax does not check it)."""
    canonicalize_dim(max(x.dim(), 1), dim)


@register("_softmax", check=_check_softmax_dim, check_per_key=True)
def softmax(ctx, x, dim, half_to_float=False):
    b = ctx.b
    out = ctx.out[0].dtype
    xv = _as_rank1(b, b.convert(x, _math_dtype(out)))
    d = dim % xv.rank
    shifted, s = _softmax_parts(b, xv, d)
    r = b.divide(b.exp(shifted), _keepdim_bcast(b, s, xv, [d]))
    return b.reshape(b.convert(r, out), ctx.out[0].shape)


@register("_log_softmax")
def log_softmax(ctx, x, dim, half_to_float=False):
    b = ctx.b
    out = ctx.out[0].dtype
    xv = _as_rank1(b, b.convert(x, _math_dtype(out)))
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
def _target_bounds(x, target, weight, reduction, ignore_index, *rest):
    classes = x.shape[1] if x.dim() >= 2 else x.shape[0]
    return [IndexBound(target, classes, IndexError, "Target {value} is out of bounds.", ignore=ignore_index)]


def _byte_target(target, nd: bool):
    """CPU's nll_loss takes a uint8 target (ATen/native/LossNLL.cpp: Long or Byte), its 2-d form
    only Long ("expected scalar type Long but found Byte"); PyTorch's meta kernels (the
    decomposition's gather) refuse uint8 for both and take int32. CPU's errors; the target to give
    the meta kernels."""
    if target.dtype not in (torch.int64, torch.uint8):
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {scalar_type_name(target.dtype)}")
    if target.dtype != torch.uint8:
        return target
    if nd:
        raise RuntimeError("expected scalar type Long but found Byte")
    return torch.empty_strided(target.shape, target.stride(), dtype=torch.int64, device="meta")


def _nll_forward_meta(x, target, weight, reduction, ignore_index):
    # (one meta for both overloads: the 2-d form is the one with 4-d inputs, F.nll_loss's reshape)
    op = torch.ops.aten.nll_loss2d_forward if x.dim() == 4 else torch.ops.aten.nll_loss_forward
    return meta_result(op, x, _byte_target(target, x.dim() == 4), weight, reduction, ignore_index)


def _nll_backward_meta(grad, x, target, weight, reduction, ignore_index, total_weight):
    op = torch.ops.aten.nll_loss2d_backward if x.dim() == 4 else torch.ops.aten.nll_loss_backward
    return meta_result(op, grad, x, _byte_target(target, x.dim() == 4), weight, reduction, ignore_index, total_weight)


def _nll_parts(b, x, target, weight, ignore_index, cd):
    """(class mask: each target's class, false for ignored targets; per-target weight with ignored
    targets zeroed; class dim). An ignored target selects nothing, as CPU's kernels skip it: where
    every target is ignored, the mean's total weight is 0, and a gradient of 0 / 0 there would be
    NaN in the ignored class's column (CPU: 0)."""
    cdim = 1 if x.rank >= 2 else 0
    other = [i for i in range(x.rank) if i != cdim]
    target = b.convert(target, torch.int64)  # (a uint8 target never equals a negative ignore_index)
    valid = b.compare(target, b.constant(ignore_index, torch.int64, target.shape), "NE")
    mask = b.and_(b.compare(b.iota(x.shape, cdim, torch.int64), b.broadcast_in_dim(target, x.shape, other), "EQ"),
                  b.broadcast_in_dim(valid, x.shape, other))
    if weight is None:
        wt = b.constant(1, cd, target.shape)
    else:
        wfull = b.broadcast_in_dim(b.convert(weight, cd), x.shape, [cdim])
        wt = reduce_sum(b, b.select(mask, wfull, b.zeros_like(wfull)), [cdim])
    wt = b.select(valid, wt, b.zeros_like(wt))
    return mask, wt, cdim


@register("nll_loss_forward", "nll_loss2d_forward", bounds=_target_bounds, meta=_nll_forward_meta)
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


@register("nll_loss_backward", "nll_loss2d_backward", meta=_nll_backward_meta)
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


# -- multi-class margin losses (backward; the forwards are PyTorch decompositions) -----------------
def _rows2d(b, x):
    """x as [N, C] (a 1-D input is one row)."""
    return b.reshape(x, [1, x.shape[0]]) if x.rank == 1 else (b.reshape(x, [1, 1]) if x.rank == 0 else x)


def _scale_by_grad_output(b, r, grad, reduction, cd):
    """CPU's last step: per-row grad_output for reduction='none', else the scalar grad_output."""
    n = r.shape[0]
    g = b.convert(grad, cd)
    if reduction == _NONE and grad.rank > 0:
        return b.multiply(r, b.broadcast_in_dim(b.reshape(g, [n]), r.shape, [0]))
    return b.multiply(r, b.broadcast_to(b.reshape(g, []), r.shape))


# PyTorch has no meta kernels for these two (the eager front-end types results with them): the
# gradient has the input's shape and dtype.


def _like_input_meta(grad, x, *rest, **kw):
    return torch.empty_like(x)


host_kernel("multi_margin_loss_backward", _like_input_meta, "Meta")
host_kernel("multilabel_margin_loss_backward", _like_input_meta, "Meta")


@register("multi_margin_loss_backward")
def multi_margin_loss_backward(ctx, grad, x, target, p, margin, weight=None, reduction=_MEAN):
    """For j != y with z = margin - x[y] + x[j] > 0: g (p = 1) or 2 g z (p = 2), times weight[y];
    x[y] gets minus their sum. g = 1/C, or 1/(N C) for the mean."""
    b, out = ctx.b, ctx.out[0]
    if out.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    cd = compute_dtype(out.dtype)
    xv = _rows2d(b, b.convert(x, cd))
    n, c = xv.shape
    tgt = b.reshape(b.convert(target, torch.int64), [n])
    onehot = b.compare(b.iota((n, c), 1), b.broadcast_in_dim(tgt, (n, c), [0]), "EQ")
    xy = reduce_sum(b, b.select(onehot, xv, b.zeros_like(xv)), [1])
    z = b.add(b.subtract(b.broadcast_to(b.convert(margin, cd), (n, c)), b.broadcast_in_dim(xy, (n, c), [0])), xv)
    g = 1.0 / (n * c) if reduction == _MEAN else 1.0 / c
    gv = b.constant(g, cd, (n, c))
    two = b.multiply(b.multiply(gv, b.constant(2, cd, (n, c))), z)
    h = b.select(b.broadcast_to(b.compare(p, b.constant(1, p.dtype), "EQ"), (n, c)), gv, two)
    if weight is not None:
        w = b.reshape(b.convert(weight, cd), [c])
        wy = b.gather(w, b.reshape(tgt, [n, 1]), [], [0], [0], 1, [1], (n,))
        h = b.multiply(h, b.broadcast_in_dim(wy, (n, c), [0]))
    h = b.select(b.and_(b.compare(z, b.zeros_like(z), "GT"), b.not_(onehot)), h, b.zeros_like(h))
    total = reduce_sum(b, h, [1])
    r = b.select(onehot, b.broadcast_in_dim(b.negate(total), (n, c), [0]), h)
    r = _scale_by_grad_output(b, r, grad, reduction, cd)
    return b.convert(b.reshape(r, out.shape), out.dtype)


def _multilabel_pairs(b, x, target, cd, is_target=None):
    """x as [N, C], the clamped targets, is_target [N, C] (bool), and z[t, k, d] = 1 - x[t, target[t, k]]
    + x[t, d] with `act` marking the terms CPU sums: k before the row's first -1, d not a target,
    z > 0."""
    xv = _rows2d(b, b.convert(x, cd))
    n, c = xv.shape
    tgt = b.reshape(b.convert(target, torch.int64), [n, c])
    neg = b.convert(b.compare(tgt, b.zeros_like(tgt), "LT"), torch.int64)
    seen_neg = b.reduce_window([neg], [b.constant(0, torch.int64)], [1, c], [1, 1], [(0, 0), (c - 1, 0)],
                               lambda s, u, v: s.maximum(u, v))[0]
    valid = b.compare(seen_neg, b.zeros_like(seen_neg), "EQ")  # [n, k]
    safe = b.clamp(b.constant(0, torch.int64), tgt, b.constant(c - 1, torch.int64))
    shape3 = (n, c, c)  # (t, k, d)
    hit = b.and_(b.compare(b.broadcast_in_dim(safe, shape3, [0, 1]), b.iota(shape3, 2), "EQ"),
                 b.broadcast_in_dim(valid, shape3, [0, 1]))
    ist = b.reduce([hit], [b.constant(False, torch.bool)], [1], lambda s, u, v: s.or_(u, v))[0]
    if is_target is not None:  # the backward uses the forward's marks, as CPU
        ist = b.compare(b.reshape(b.convert(is_target, cd), [n, c]), b.constant(0, cd, (n, c)), "NE")
    xy = b.gather(xv, b.concatenate([b.reshape(b.iota((n, c), 0), [n, c, 1]), b.reshape(safe, [n, c, 1])], 2),
                  [], [0, 1], [0, 1], 2, [1, 1], (n, c))  # x[t, target[t, k]]
    z = b.add(b.subtract(b.constant(1, cd, shape3), b.broadcast_in_dim(xy, shape3, [0, 1])),
              b.broadcast_in_dim(xv, shape3, [0, 2]))
    act = b.and_(b.compare(z, b.zeros_like(z), "GT"),
                 b.and_(b.broadcast_in_dim(valid, shape3, [0, 1]), b.not_(b.broadcast_in_dim(ist, shape3, [0, 2]))))
    return xv, hit, ist, z, act


def _multilabel_forward_meta(x, target, reduction):
    """CPU's shape checks (LossMultiLabelMargin.cpp's multilabel_margin_loss_shape_check: an empty
    class dimension gave NaN here) and result shapes (PyTorch's meta kernel gives a 1-D input's
    unreduced loss shape [1], CPU [])."""
    sizes = str(list(x.shape))  # as c10 prints an IntArrayRef: [2, 0]
    if not ((x.dim() == 2 and x.shape[1] != 0) or (x.dim() == 1 and x.shape[0] != 0) or x.dim() == 0):
        raise RuntimeError(f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {sizes}")
    if x.dim() <= 1:
        ok = target.dim() <= 1 and target.numel() == (x.shape[0] if x.dim() else 1)
    else:
        ok = target.dim() == 2 and tuple(target.shape) == tuple(x.shape)
    if not ok:
        raise RuntimeError(f"inconsistent target size: {list(target.shape)} for input of size: {sizes}")
    out = (x.shape[0],) if reduction == _NONE and x.dim() == 2 else ()
    return x.new_empty(out), x.new_empty(x.shape)


host_kernel("multilabel_margin_loss_forward", _multilabel_forward_meta, "Meta")


@register("multilabel_margin_loss_forward")
def multilabel_margin_loss_forward(ctx, x, target, reduction):
    """Per row: sum over its targets y (before the first -1) and non-targets j of
    max(0, 1 - x[y] + x[j]), divided by C; is_target marks the targets. (PyTorch's decomposition
    of this op does not match CPU.)"""
    b = ctx.b
    out, it = ctx.out
    cd = compute_dtype(out.dtype)
    if it.numel == 0:
        return b.constant(math.nan if reduction == _MEAN else 0, out.dtype, out.shape), \
            b.constant(0, it.dtype, it.shape)
    xv, hit, ist, z, act = _multilabel_pairs(b, x, target, cd)
    n, c = xv.shape
    per = b.divide(reduce_sum(b, b.select(act, z, b.zeros_like(z)), [1, 2]), b.constant(c, cd, (n,)))
    r = _reduce(b, per, reduction)
    return b.convert(b.reshape(r, out.shape), out.dtype), b.reshape(b.convert(ist, it.dtype), it.shape)


@register("multilabel_margin_loss_backward")
def multilabel_margin_loss_backward(ctx, grad, x, target, reduction, is_target):
    """For each target label y (those before the first -1) and each non-target j with
    z = 1 - x[y] + x[j] > 0: x[j] gets +g and x[y] gets -g (g = 1/C, or 1/(N C) for the mean)."""
    b, out = ctx.b, ctx.out[0]
    if out.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    cd = compute_dtype(out.dtype)
    xv, hit, ist, z, act = _multilabel_pairs(b, x, target, cd, is_target)
    n, c = xv.shape
    shape3 = (n, c, c)
    actf = b.convert(act, cd)
    plus = reduce_sum(b, actf, [1])        # per d: how many (target, d) terms are active
    per_k = reduce_sum(b, actf, [2])       # per target k: how many d are active
    minus = reduce_sum(b, b.multiply(b.convert(hit, cd), b.broadcast_in_dim(per_k, shape3, [0, 1])), [1])
    g = 1.0 / (n * c) if reduction == _MEAN else 1.0 / c
    r = b.multiply(b.subtract(plus, minus), b.constant(g, cd, (n, c)))
    r = _scale_by_grad_output(b, r, grad, reduction, cd)
    return b.convert(b.reshape(r, out.shape), out.dtype)
