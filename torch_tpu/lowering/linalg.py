"""Matrix products: mm, bmm, dot, mv and their add-variants (addmm, baddbmm, addmv).

These are all that torch.matmul, F.linear and nn.Linear (forward and backward) reach on the device;
the transposes and reshapes around them are views. Half-precision products accumulate in float32
and round once, as PyTorch's CPU kernels do; float32 products ask for full precision (a TPU would
otherwise use bfloat16 passes).
"""
from __future__ import annotations

import torch

from .builder import TensorType, Value
from .elementwise import compute_dtype
from .precision import precision_config
from .registry import register

_NAMES = {"mm": "addmm_impl_cpu_", "addmm": "addmm_impl_cpu_", "mv": "addmv_impl_cpu",
          "addmv": "addmv_impl_cpu", "dot": "dot", "bmm": "bmm", "baddbmm": "baddbmm_cpu"}


def dot(b, x: Value, y: Value, batch, contract, out_dtype) -> Value:
    """dot_general of x and y computed in compute_dtype(out_dtype), then rounded to out_dtype."""
    cd = compute_dtype(out_dtype)
    x, y = b.convert(x, cd), b.convert(y, cd)
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


_CPP = {torch.float32: ("float", "Float"), torch.float64: ("double", "Double"),
        torch.float16: ("c10::Half", "Half"), torch.bfloat16: ("c10::BFloat16", "BFloat16"),
        torch.int64: ("long int", "Long"), torch.int32: ("int", "Int"), torch.int16: ("short int", "Short"),
        torch.int8: ("signed char", "Char"), torch.uint8: ("unsigned char", "Byte"), torch.bool: ("bool", "Bool"),
        torch.complex64: ("c10::complex<float>", "ComplexFloat"),
        torch.complex128: ("c10::complex<double>", "ComplexDouble")}


def _name(dt, cpp=False):
    return _CPP.get(dt, (str(dt), str(dt)))[0 if cpp else 1]


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


def _add_scaled(ctx, self, prod, beta, alpha):
    """beta * self + alpha * prod; with beta == 0 self is not read (its NaNs do not propagate), as on
    CPU. Scalars are converted to the result dtype first (an int result truncates them)."""
    b = ctx.b
    out = ctx.out[0].dtype
    cd = prod.dtype
    shape = ctx.out[0].shape
    prod = b.broadcast_to(prod, shape)
    if alpha is not None:
        a = b.convert(b.convert(alpha, out), cd)
        prod = b.multiply(prod, b.broadcast_to(a, shape))
    s = b.broadcast_to(b.convert(self, cd), shape)
    if beta is not None:
        bt = b.convert(beta, out)
        zero = b.compare(bt, b.zeros_like(bt), "EQ")
        bt = b.broadcast_to(b.convert(bt, cd), shape)
        s = b.select(b.broadcast_to(zero, shape), b.zeros_like(s), b.multiply(s, bt))
    return b.convert(b.add(s, prod), out)


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
    return _add_scaled(ctx, self, _product(ctx, "addmm", x, y), beta, alpha)


@register("baddbmm")
def baddbmm(ctx, self, x, y, beta=None, alpha=None):
    return _add_scaled(ctx, self, _product(ctx, "baddbmm", x, y), beta, alpha)


@register("addmv")
def addmv(ctx, self, x, y, beta=None, alpha=None):
    return _add_scaled(ctx, self, _product(ctx, "addmv", x, y), beta, alpha)
