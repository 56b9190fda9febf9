"""convolution and convolution_backward, any spatial rank, grouped, dilated, strided and transposed.

Everything is one stablehlo.convolution: a transposed convolution is a convolution of the
stride-dilated input with the spatially flipped kernel; grad_input of a convolution is a transposed
convolution of grad_output (and the reverse); grad_weight contracts over the batch with the batch
and feature roles swapped (batch_group_count splits the channels by group). Half precision is
computed in float32 and rounded once, as on CPU.
"""
from __future__ import annotations

import torch
from torch._prims_common import suggest_memory_format

from .builder import TensorType, i64_array
from .elementwise import compute_dtype
from .helpers.checks import scalar_type_name
from .precision import precision_config
from .registry import in_format, register


def _conv(b, lhs, rhs, dims, strides, padding, lhs_dil, rhs_dil, fgc=1, bgc=1):
    """stablehlo.convolution; `dims` = (lhs, rhs, out) layouts as letter strings over b/f/o/i and
    spatial positions, e.g. ("bf01", "oi01", "bf01"). Negative padding is applied by slicing."""
    n = len(strides)
    lo = [max(p, 0) for p, _ in padding]
    hi = [max(p, 0) for _, p in padding]
    sp = [lhs.shape[dims[0].index(str(k))] for k in range(n)]
    ks = [rhs.shape[dims[1].index(str(k))] for k in range(n)]
    out_sp = [((s - 1) * ld + 1 + l + h - ((k - 1) * rd + 1)) // st + 1
              for s, k, l, h, ld, rd, st in zip(sp, ks, lo, hi, lhs_dil, rhs_dil, strides)]
    batch = lhs.shape[dims[0].index("b")] // bgc
    feat = rhs.shape[dims[1].index("o")]
    shape = []
    for c in dims[2]:
        shape.append(batch if c == "b" else feat if c == "f" else out_sp[int(c)])
    layout = lambda s: "[" + ", ".join(s) + "]"  # noqa: E731
    pad = ", ".join(f"[{l}, {h}]" for l, h in zip(lo, hi))
    attrs = {"dimension_numbers": f"#stablehlo.conv<{layout(dims[0])}x{layout(dims[1])}->{layout(dims[2])}>",
             "window_strides": i64_array(strides),
             "padding": f"dense<[{pad}]> : tensor<{n}x2xi64>" if n else "dense<> : tensor<0x2xi64>",
             "lhs_dilation": i64_array(lhs_dil), "rhs_dilation": i64_array(rhs_dil),
             "feature_group_count": f"{fgc} : i64", "batch_group_count": f"{bgc} : i64"}
    if precision_config(lhs.dtype):
        attrs["precision_config"] = precision_config(lhs.dtype)
    r = b.op("stablehlo.convolution", [lhs, rhs], [TensorType(tuple(shape), lhs.dtype)], attrs)[0]
    if any(p < 0 for pp in padding for p in pp):  # only when the window stride is 1 (transposed)
        start = [0] * r.rank
        limit = list(r.shape)
        for k in range(n):
            d = dims[2].index(str(k))
            start[d] = lo[k] - padding[k][0]
            limit[d] = start[d] + out_sp[k] - (lo[k] - padding[k][0]) - (hi[k] - padding[k][1])
        r = b.slice(r, start, limit)
    return r


def _layouts(n):
    """The spatial letters of a layout string: "01" for 2-D."""
    return "".join(str(k) for k in range(n))


def _forward(b, x, w, stride, padding, dilation, groups):
    """Plain convolution, x (N, C, *S), w (O, C/g, *K)."""
    sp = _layouts(len(stride))
    return _conv(b, x, w, ("bf" + sp, "oi" + sp, "bf" + sp), stride, [(p, p) for p in padding],
                 [1] * len(stride), dilation, fgc=groups)


def _transposed(b, x, w, stride, padding, dilation, groups, out_sizes):
    """Transposed convolution, x (N, C, *S), w (C, O/g, *K), spatial output sizes `out_sizes`."""
    n = len(stride)
    sp = _layouts(n)
    c, og = w.shape[0], w.shape[1]
    ks = w.shape[2:]
    # (C, O/g, K) -> (O, C/g, K): swap in/out features within each group, flip the window.
    wg = b.reshape(w, (groups, c // groups, og, *ks))
    wg = b.transpose(wg, [0, 2, 1, *range(3, 3 + n)])
    wt = b.reshape(wg, (groups * og, c // groups, *ks))
    if n:
        wt = b.reverse(wt, list(range(2, 2 + n)))
    pads = []
    for k in range(n):
        lo = dilation[k] * (ks[k] - 1) - padding[k]
        full = (x.shape[2 + k] - 1) * stride[k] + 1 + 2 * lo - dilation[k] * (ks[k] - 1)
        pads.append((lo, lo + out_sizes[k] - full))
    return _conv(b, x, wt, ("bf" + sp, "oi" + sp, "bf" + sp), [1] * n, pads, stride, dilation, fgc=groups)


def _grad_weight(b, x, gy, ksize, stride, padding, dilation, groups):
    """d(conv(x, w))/dw for w (O, C/g, *K): contracts x (N, C, *S) with gy (N, O, *P) over N and P."""
    n = len(stride)
    sp = _layouts(n)
    pads = []
    for k in range(n):
        # window positions k*dilation over x padded by `padding`: the high side ends at the last
        # element the output reads (slicing off what strides skip).
        need = (ksize[k] - 1) * dilation[k] + (gy.shape[2 + k] - 1) * stride[k] + 1
        hi = need - x.shape[2 + k] - padding[k]
        if hi < 0:
            lim = list(x.shape)
            lim[2 + k] += hi
            x = b.slice(x, [0] * x.rank, lim)
            hi = 0
        pads.append((padding[k], hi))
    return _conv(b, x, gy, ("fb" + sp, "io" + sp, "fb" + sp), dilation, pads, [1] * n, stride, bgc=groups)


def _bias(b, x, cd):
    dims = [d for d in range(x.rank) if d != 1]
    zero = b.constant(0, cd)
    return b.reduce([b.convert(x, cd)], [zero], dims, lambda bb, a, e: bb.add(a, e))[0]


def _validate(x, w, groups, transposed):
    """CPU's argument checks that PyTorch's meta kernel of convolution leaves out."""
    if w.dtype != x.dtype:
        raise RuntimeError(f"expected scalar type {scalar_type_name(x.dtype)} but found {scalar_type_name(w.dtype)}")
    xs, ws = list(x.shape), list(w.shape)
    if x.rank == w.rank - 1:
        xs = [1] + xs
    if ws[0] % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
                           f"but got weight of size [{ws}] instead")
    want = ws[0] if transposed else ws[1] * groups
    if xs[1] != want:
        head = "transposed=1" if transposed else f"groups={groups}"
        raise RuntimeError(f"Given {head}, weight of size {ws}, expected input{list(x.shape)} to have {want} "
                           f"channels, but got {xs[1]} channels instead")


def _check(dt, transposed):
    if dt == torch.bool:
        name = "slow_conv_transpose2d_out_cpu" if transposed else "slow_conv2d_cpu"
        raise NotImplementedError(f'"{name}" not implemented for \'Bool\'')


def _conv_format(x, w):
    """CPU convolution (forward and backward) lays its results out channels-last when the input or
    the weight is (their suggest_memory_format), else row-major; the meta kernel does not."""
    fmts = {suggest_memory_format(x), suggest_memory_format(w)}
    for cl in (torch.channels_last, torch.channels_last_3d):
        if cl in fmts:
            return cl
    return torch.contiguous_format


@register("convolution", layout=lambda outs, x, w, *args: [in_format(o, _conv_format(x, w)) for o in outs])
def convolution(ctx, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    b = ctx.b
    out = ctx.out[0]
    _validate(x, w, groups, transposed)
    _check(out.dtype, transposed)
    cd = compute_dtype(out.dtype)
    unbatched = x.rank == w.rank - 1
    xc, wc = b.convert(x, cd), b.convert(w, cd)
    if unbatched:
        xc = b.reshape(xc, (1, *xc.shape))
    n = w.rank - 2
    expand = lambda v: list(v) * n if len(v) == 1 else list(v)  # noqa: E731
    stride, padding, dilation = expand(stride), expand(padding), expand(dilation)
    if transposed:
        r = _transposed(b, xc, wc, stride, padding, dilation, groups, out.shape[-n:] if n else [])
    else:
        r = _forward(b, xc, wc, stride, padding, dilation, groups)
    if bias is not None:
        r = b.add(r, b.broadcast_in_dim(b.convert(bias, cd), r.shape, [1]))
    return b.convert(b.reshape(r, out.shape), out.dtype)


@register("convolution_backward",
          layout=lambda outs, gy, x, w, *args: [in_format(o, _conv_format(x, w)) for o in outs])
def convolution_backward(ctx, gy, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding,
                         groups, output_mask):
    b = ctx.b
    n = w.rank - 2
    dt = (ctx.out[0] or ctx.out[1] or ctx.out[2] or TensorType((), x.dtype)).dtype
    _check(dt, transposed)
    cd = compute_dtype(dt)
    expand = lambda v: list(v) * n if len(v) == 1 else list(v)  # noqa: E731
    stride, padding, dilation = expand(stride), expand(padding), expand(dilation)
    gyc, xc, wc = b.convert(gy, cd), b.convert(x, cd), b.convert(w, cd)
    ks = w.shape[2:]
    gi = gw = gb = None
    if output_mask[0]:
        if transposed:
            r = _forward(b, gyc, wc, stride, padding, dilation, groups)
            r = b.slice(r, [0] * r.rank, list(x.shape))
        else:
            r = _transposed(b, gyc, wc, stride, padding, dilation, groups, x.shape[2:])
        gi = b.convert(r, ctx.out[0].dtype)
    if output_mask[1]:
        r = (_grad_weight(b, gyc, xc, ks, stride, padding, dilation, groups) if transposed
             else _grad_weight(b, xc, gyc, ks, stride, padding, dilation, groups))
        gw = b.convert(r, ctx.out[1].dtype)
    if output_mask[2]:
        gb = b.convert(_bias(b, gy, cd), ctx.out[2].dtype)
    return gi, gw, gb


@register("col2im")
def col2im(ctx, cols, output_size, kernel_size, dilation, padding, stride):
    """nn.functional.fold: (N, C*kh*kw, L) columns -> (N, C, H, W), overlapping patches summed.
    Each kernel offset (i, j) is one block of columns, spread into a padded canvas by a strided pad
    (interior padding = stride - 1) and added in (i, j) order, as CPU's col2im accumulates."""
    b, out = ctx.b, ctx.out[0]
    if out.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    (H, W), (kh, kw), (dh, dw), (ph, pw), (sh, sw) = output_size, kernel_size, dilation, padding, stride
    oh = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    lead = out.shape[:-3]
    c = out.shape[-3]
    x = b.reshape(cols, (*lead, c, kh, kw, oh, ow))
    n = len(lead) + 1
    zero = b.constant(0, x.dtype)
    acc = None
    for i in range(kh):
        for j in range(kw):
            blk = b.slice(x, [0] * n + [i, j, 0, 0], [*lead, c, i + 1, j + 1, oh, ow])
            blk = b.reshape(blk, (*lead, c, oh, ow))
            top, left = i * dh, j * dw
            placed = b.pad(blk, zero, [0] * n + [top, left],
                           [0] * n + [H + 2 * ph - top - (oh - 1) * sh - 1, W + 2 * pw - left - (ow - 1) * sw - 1],
                           [0] * n + [sh - 1, sw - 1])
            acc = placed if acc is None else b.add(acc, placed)
    return b.slice(acc, [0] * n + [ph, pw], [*lead, c, ph + H, pw + W])
