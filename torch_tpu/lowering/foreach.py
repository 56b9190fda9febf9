"""`_foreach_*` ops (torch.optim's multi-tensor path): one program for the whole tensor list,
applying the elementwise lowering of the per-tensor op to each tensor (no math repeated here).
Only functional overloads are registered; `_foreach_add_` etc. are derived from them."""
from __future__ import annotations

import torch

from .registry import REGISTRY, LoweringContext, register
from . import elementwise  # noqa: F401  (the per-tensor lowerings used below)


def _per_tensor(fn):
    """Lowering of a foreach op from `fn(ctx, *args)` of the per-tensor op: list arguments
    (Tensor[] and Scalar[]) are taken element by element, the others shared."""
    def lower(ctx, *args):
        out = []
        for i, t in enumerate(ctx.out):
            parts = [a[i] if isinstance(a, list) else a for a in args]
            out.append(fn(LoweringContext(ctx.b, [t]), *parts))
        return out
    return lower


def _has(name):
    packet, _, ov = name.partition(".")
    p = getattr(torch.ops.aten, packet, None)
    return p is not None and (ov or "default") in p.overloads()


def _register_family(op, per_tensor_name, overloads):
    fn = REGISTRY[per_tensor_name].fn
    names = [f"_foreach_{op}.{ov}" if ov else f"_foreach_{op}" for ov in overloads]
    names = [n for n in names if _has(n)]
    if names:
        register(*names)(_per_tensor(fn))


# Binary ops: (tensor, tensor|scalar[, alpha]) -> the per-tensor functional lowering.
for _op, _per in (("add", "add.Tensor"), ("sub", "sub.Tensor"), ("mul", "mul.Tensor"), ("div", "div.Tensor"),
                  ("maximum", "maximum"), ("minimum", "minimum"), ("clamp_min", "clamp_min"),
                  ("clamp_max", "clamp_max"), ("pow", "pow.Tensor_Tensor")):
    _register_family(_op, _per, ("Scalar", "List", "ScalarList", "Tensor", "ScalarAndTensor"))

# Unary ops.
for _op in ("sqrt", "neg", "reciprocal", "abs", "exp", "log", "sign", "sigmoid", "tanh", "rsqrt", "expm1",
            "log1p", "sin", "cos", "erf", "floor", "ceil", "round", "trunc", "frac", "zero"):
    if _op in REGISTRY:
        _register_family(_op, _op, ("",))

# Ternary ops with a scalar or per-tensor weight.
_register_family("addcmul", "addcmul", ("Scalar", "ScalarList"))
_register_family("addcdiv", "addcdiv", ("Scalar", "ScalarList"))
_register_family("lerp", "lerp.Scalar", ("Scalar", "List", "ScalarList"))
