"""Matrix products: mm, bmm, dot, mv and their add-variants (addmm, baddbmm, addmv); grouped
products (_grouped_mm: Mixture-of-Experts layers, torch.nn.functional.grouped_mm).

These are all that torch.matmul, F.linear and nn.Linear (forward and backward) reach on the device;
the transposes and reshapes around them are views. Half-precision products accumulate in float32
and round once, as PyTorch's CPU kernels do; float32 products ask for full precision (a TPU would
otherwise use bfloat16 passes).
"""
from __future__ import annotations

import math

import torch

from .builder import TensorType, Value
from .elementwise import compute_dtype
from .helpers import arith
from .helpers.checks import cpp_type_name, scalar_type_name
from .precision import precision_config
from .reduction import reduce_sum
from .registry import register

_NAMES = {"mm": "addmm_impl_cpu_", "addmm": "addmm_impl_cpu_", "mv": "addmv_impl_cpu",
          "addmv": "addmv_impl_cpu", "dot": "dot", "bmm": "bmm", "baddbmm": "baddbmm_cpu"}


# A product with a vector operand (dot, a matrix-vector product, batch-1 rows through a Linear)
# contracting more than SUMMED_FROM elements is a multiply and a reduce: XLA:CPU's emitter for such
# a dot adds the terms one after another in float32 (dot of two rand(10**7) vectors: 1.2e-2 relative
# error, CPU's BLAS 1.3e-6), while its reduce (the multiply fused into it) sums in vector lanes, as
# fast here (18.6 / 20.3 ms for that dot; a 512 x 8192 matrix-vector product 2.5 / 2.9 ms). Products
# of matrices are blocked: 4 rows or more accurate; 2 or 3 rows over 10**6 terms still 3.6e-4 (the
# multiply-reduce form was much slower there with many columns, so they keep dot_general).
SUMMED_FROM = 4096


def dot(b, x: Value, y: Value, batch, contract, out_dtype) -> Value:
    """dot_general of x and y computed in compute_dtype(out_dtype), then rounded to out_dtype."""
    cd = compute_dtype(out_dtype)
    x, y = b.convert(x, cd), b.convert(y, cd)
    (xb, yb), (xc, yc) = batch, contract
    if len(xc) == 1 and x.shape[xc[0]] > SUMMED_FROM:
        free = [math.prod(s for i, s in enumerate(v.shape) if i not in vb and i not in vc)
                for v, vb, vc in ((x, xb, xc), (y, yb, yc))]
        if min(free) == 1:
            return _summed_dot(b, x, y, batch, contract)
    return _dot_general(b, x, y, batch, contract)


def _summed_dot(b, x: Value, y: Value, batch, contract) -> Value:
    """dot_general (one contracting dimension) as the sum over it of the broadcast product: each
    operand laid out as (batch..., its free dims..., contracted) and broadcast to (batch..., x's free,
    y's free, contracted), dot_general's result layout plus the contracted dimension."""
    (xb, yb), (xc, yc) = batch, contract
    xf = [i for i in range(x.rank) if i not in xb and i not in xc]
    yf = [i for i in range(y.rank) if i not in yb and i not in yc]
    xt = b.transpose(x, list(xb) + xf + list(xc))
    yt = b.transpose(y, list(yb) + yf + list(yc))
    nb = len(xb)
    shape = ([x.shape[i] for i in xb] + [x.shape[i] for i in xf] + [y.shape[i] for i in yf]
             + [x.shape[xc[0]]])
    last = len(shape) - 1
    xs = b.broadcast_in_dim(xt, shape, list(range(nb + len(xf))) + [last])
    ys = b.broadcast_in_dim(yt, shape, list(range(nb)) + list(range(nb + len(xf), last + 1)))
    return reduce_sum(b, b.multiply(xs, ys), [last])


def _dot_general(b, x: Value, y: Value, batch, contract) -> Value:
    cd = x.dtype
    (xb, yb), (xc, yc) = batch, contract
    shape = [x.shape[i] for i in xb]
    shape += [s for i, s in enumerate(x.shape) if i not in xb and i not in xc]
    shape += [s for i, s in enumerate(y.shape) if i not in yb and i not in yc]
    lst = lambda xs: "[" + ", ".join(map(str, xs)) + "]"  # noqa: E731
    attrs = {"dot_dimension_numbers":
             f"#stablehlo.dot<lhs_batching_dimensions = {lst(xb)}, rhs_batching_dimensions = {lst(yb)}, "
             f"lhs_contracting_dimensions = {lst(xc)}, rhs_contracting_dimensions = {lst(yc)}>"}
    if precision_config(cd):
        attrs["precision_config"] = precision_config(cd)
    return b.op("stablehlo.dot_general", [x, y], [TensorType(tuple(shape), cd)], attrs)[0]


def _name(dt, cpp=False):
    return cpp_type_name(dt) if cpp else scalar_type_name(dt)


def _check_dtype(op, dt):
    if dt == torch.bool:
        raise NotImplementedError(f'"{_NAMES[op]}" not implemented for \'Bool\'')


def _check_same(op, out, *xs):
    """The dtype agreement CPU requires and the meta kernels of mm, mv and addmm do not check."""
    dts = [x.dtype for x in xs]
    if all(d == dts[0] for d in dts):
        return
    if op == "mm":
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {_name(dts[0], True)} != "
                           f"{_name(dts[1], True)}")
    if op == "addmm":
        bad = dts[0] if dts[0] != dts[2] else dts[1]
        raise RuntimeError(f"self and mat2 must have the same dtype, but got {_name(bad)} and {_name(dts[2])}")
    if op == "mv":
        raise RuntimeError(f"addmv input tensors must have the same dtype, but got {_name(out)}, "
                           f"{_name(dts[0])}, and {_name(dts[1])}")


def _product(ctx, op, x, y):
    out = ctx.out[0].dtype
    _check_dtype(op, out)
    b = ctx.b
    if op in ("mm", "addmm"):
        return dot(b, x, y, ([], []), ([1], [0]), out)
    if op in ("bmm", "baddbmm"):
        return dot(b, x, y, ([0], [0]), ([2], [1]), out)
    if op in ("mv", "addmv"):
        return dot(b, x, y, ([], []), ([1], [0]), out)
    return dot(b, x, y, ([], []), ([0], [0]), out)


@register("mm")
def mm(ctx, x, y):
    _check_same("mm", None, x, y)
    return _product(ctx, "mm", x, y)


@register("bmm")
def bmm(ctx, x, y):
    return _product(ctx, "bmm", x, y)


@register("mv")
def mv(ctx, x, y):
    _check_same("mv", ctx.out[0].dtype, x, y)
    return _product(ctx, "mv", x, y)


@register("dot")
def dot_(ctx, x, y):
    return _product(ctx, "dot", x, y)


@register("addmm")
def addmm(ctx, self, x, y, beta=None, alpha=None):
    _check_same("addmm", None, self, x, y)
    return arith.add_scaled(ctx, self, _product(ctx, "addmm", x, y), beta, alpha)


@register("baddbmm")
def baddbmm(ctx, self, x, y, beta=None, alpha=None):
    return arith.add_scaled(ctx, self, _product(ctx, "baddbmm", x, y), beta, alpha)


@register("addmv")
def addmv(ctx, self, x, y, beta=None, alpha=None):
    return arith.add_scaled(ctx, self, _product(ctx, "addmv", x, y), beta, alpha)


# -- grouped products ---------------------------------------------------------------------------
def _grouped_strides(mat):
    """CPU's stride check of a _grouped_mm operand (check_valid_strides_and_return_transposed in
    ATen's GroupedMMUtils.h): its last two dims row- or column-major, the leading stride a
    multiple of 16 bytes."""
    st, sz = mat.stride(), mat.shape
    align = 16 // mat.element_size()
    if st[-2] == 1 and st[-1] >= max(1, sz[-2]):
        lead = st[-1]
    elif st[-1] == 1 and st[-2] >= max(1, sz[-1]):
        lead = st[-2]
    else:
        raise RuntimeError(f"Invalid strides/sizes, got {list(st)} for strides and {list(sz)} for sizes")
    if lead % align:
        raise RuntimeError("strides should be multiple of 16 bytes")


def grouped_mm_meta(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """The result of aten::_grouped_mm as PyTorch's CPU kernel makes it (ATen's
    _grouped_mm_validate_inputs, create_grouped_gemm_output_tensor, _grouped_mm_fallback), as an
    empty tensor on mat_a's device (meta in eager, fake under torch.compile), raising CPU's errors:

    - mat_a [M, K] x mat_b [G, K, N], offs [G] -> [M, N] (rows of mat_a grouped by offs);
    - mat_a [G, M, K] x mat_b [K, N], offs [G] -> [M, N] (columns of mat_b grouped);
    - mat_a [M, K] x mat_b [K, N], offs [G] -> [G, M, N] (the contracted dim grouped);
    - mat_a [G, M, K] x mat_b [G, K, N], no offs -> [G, M, N] (bmm).

    float32, bfloat16 or float16 operands of one dtype, with row- or column-major last two dims
    whose leading stride is a multiple of 16 bytes; offs int32 and 1-D; no bias; out_dtype None or
    mat_a's. The result's last dim is padded to 16 bytes in its strides, as on CPU. PyTorch's own
    meta kernel copies CUDA's bfloat16-only check, which CPU (and tpu) do not have."""
    ok = (torch.float32, torch.bfloat16, torch.float16)
    for name, m in (("mat_a", mat_a), ("mat_b", mat_b)):
        if m.dtype not in ok:
            raise RuntimeError(f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got {_name(m.dtype)}")
    for name, m in (("mat_a", mat_a), ("mat_b", mat_b)):
        if m.dim() not in (2, 3):
            raise RuntimeError(f"{name} has to be 2 or 3d")
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    if not (a2 and b2) and mat_a.shape[-1] != mat_b.shape[-2]:
        raise RuntimeError("contraction dimension of mat_a and mat_b must match")
    _grouped_strides(mat_a)
    _grouped_strides(mat_b)
    if (offs is not None) != (a2 or b2):
        raise RuntimeError("Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d")
    if offs is not None:
        if offs.dim() != 1:
            raise RuntimeError("offs has to be 1D")
        if offs.dtype != torch.int32:
            raise RuntimeError("Offsets have to be int32")
    if bias is not None:
        raise RuntimeError("Bias not supported yet")
    out_dtype = mat_a.dtype if out_dtype is None else out_dtype
    if out_dtype != mat_a.dtype:
        raise RuntimeError("Grouped gemm output dtype must match `mat_a` dtype")
    if a2 and b2:
        size = [offs.shape[0], mat_a.shape[0], mat_b.shape[1]]
    elif a2 or b2:
        if offs.shape[0] != (mat_b if a2 else mat_a).shape[0]:
            raise RuntimeError("matrix batch sizes have to match")
        size = [mat_a.shape[0], mat_b.shape[-1]] if a2 else [mat_a.shape[1], mat_b.shape[1]]
    else:
        if mat_a.shape[0] != mat_b.shape[0]:
            raise RuntimeError("batched dimension has to match")
        size = [mat_a.shape[0], mat_a.shape[1], mat_b.shape[-1]]
    # The CPU kernel multiplies group by group with mm_out (bmm_out for 3D x 3D), whose dtype checks
    # are the only ones that see mat_b's dtype; with no group nothing is multiplied or checked.
    if mat_a.dtype != mat_b.dtype:
        if a2 or b2:
            if offs.shape[0] > 0:
                raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: "
                                   f"{_name(mat_a.dtype, True)} != {_name(mat_b.dtype, True)}")
        else:
            raise RuntimeError(f"Expected out tensor to have dtype {_name(mat_b.dtype, True)}, but got "
                               f"{_name(mat_a.dtype, True)} instead")
    align = 16 // out_dtype.itemsize
    padded = -(-size[-1] // align) * align
    stride = [padded, 1] if len(size) == 2 else [size[1] * padded, padded, 1]
    return torch.empty_strided(size, stride, dtype=out_dtype, device=mat_a.device)


def _groups(b, offs: Value, n: int, last_wins: bool) -> Value:
    """[G, n] bool: which of the n positions along the grouped dim each group covers. Group g is
    the slice [offs[g-1], offs[g]) (offs[-1] = 0) with at::slice's bounds, as CPU's kernel slices
    it: a negative bound counts from the end, both are clamped to [0, n], and an end before the
    start is an empty group. With last_wins a position belongs only to the last group covering it
    (CPU writes the groups' rows in order, so a later one overwrites); positions past the last
    offset belong to none (CPU leaves them uninitialised; here they are 0)."""
    g, i32 = offs.shape[0], torch.int32
    zero, size = b.constant(0, i32, (g,)), b.constant(n, i32, (g,))

    def bound(x):
        x = b.select(b.compare(x, zero, "LT"), b.add(x, size), x)
        return b.broadcast_in_dim(b.clamp(b.constant(0, i32), x, b.constant(n, i32)), (g, n), [0])

    starts = b.concatenate([b.constant(0, i32, (1,)), b.slice(offs, [0], [g - 1])], 0) if g else offs
    pos = b.iota((g, n), 1, i32)
    member = b.and_(b.compare(bound(starts), pos, "LE"), b.compare(pos, bound(offs), "LT"))
    if not last_wins:
        return member
    group = b.iota((g, n), 0, i32)
    owner = b.reduce([b.select(member, group, b.constant(-1, i32, (g, n)))], [b.constant(-1, i32)], [0],
                     lambda s, x, y: [s.maximum(x, y)])[0]
    return b.compare(group, b.broadcast_in_dim(owner, (g, n), [1]), "EQ")


def _masked(b, x: Value, mask: Value, shape, x_dims, mask_dims) -> Value:
    """x broadcast to `shape` (its dims at x_dims), zero where the broadcast mask is false."""
    x = b.broadcast_in_dim(x, shape, x_dims)
    return b.select(b.broadcast_in_dim(mask, shape, mask_dims), x, b.zeros_like(x))


@register("_grouped_mm", meta=grouped_mm_meta)
def grouped_mm(ctx, a, w, offs=None, bias=None, out_dtype=None):
    """aten::_grouped_mm (shapes and errors: grouped_mm_meta). Each layout is one dot_general over
    the operand whose grouped dim is masked per group, the group and the reduction dims contracted
    together, so a group's products accumulate as one mm would (in float32 for half precision),
    whatever the offsets; empty groups give zeros. Not chlo.ragged_dot (JAX's lowering of
    lax.ragged_dot for TPU): the CPU plugin parses it but cannot compile it (XLA:CPU has no
    ragged-dot). The masked operand is G times the grouped one, and so is the work."""
    b, out = ctx.b, ctx.out[0].dtype
    if offs is None:                                          # [G, M, K] x [G, K, N]
        return b.convert(dot(b, a, w, ([0], [0]), ([2], [1]), out), out)
    if a.rank == 2 and w.rank == 3:                           # rows of a grouped
        (m, k), g = a.shape, w.shape[0]
        a = _masked(b, a, _groups(b, offs, m, True), (g, m, k), [1, 2], [0, 1])
        return b.convert(dot(b, a, w, ([], []), ([0, 2], [0, 1]), out), out)
    if a.rank == 3:                                           # columns of w grouped
        (k, n), g = w.shape, a.shape[0]
        w = _masked(b, w, _groups(b, offs, n, True), (g, k, n), [1, 2], [0, 2])
        return b.convert(dot(b, a, w, ([], []), ([0, 2], [0, 1]), out), out)
    (m, k), g = a.shape, offs.shape[0]                        # the contracted dim grouped
    a = _masked(b, a, _groups(b, offs, k, False), (g, m, k), [1, 2], [0, 2])
    return b.convert(dot(b, a, w, ([], []), ([2], [0]), out), out)
