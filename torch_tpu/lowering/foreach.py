"""`_foreach_*` ops (torch.optim's multi-tensor path): one program for the whole tensor list,
applying the elementwise lowering of the per-tensor op to each tensor (no math repeated here).
Only functional overloads are registered; `_foreach_add_` etc. are derived from them."""
from __future__ import annotations

import torch

from .builder import TensorType, Value
from .registry import REGISTRY, LoweringContext, fit, register
from . import elementwise  # noqa: F401  (the per-tensor lowerings used below)


def _flat(b, t, parts):
    """(1-D result type, parts reshaped to 1-D) when every tensor part has the result's shape or is
    0-dim, else None. The op is elementwise, so computing it on the flattened tensors is the same;
    done because the updated tensors are 1-D storage buffers: XLA sees reshapes that cancel, where
    an N-D computation between them keeps bitcasts inside its fusions, which stops it from updating
    donated buffers in place (it inserted a copy of each 2-D optimizer state and parameter)."""
    if len(t.shape) <= 1:
        return None
    flat = TensorType((t.numel,), t.dtype)
    out = []
    for p in parts:
        if isinstance(p, Value) and p.shape != ():
            if p.shape != t.shape:
                return None
            p = b.reshape(p, flat.shape)
        out.append(p)
    return flat, out


def _per_tensor(fn):
    """Lowering of a foreach op from `fn(ctx, *args)` of the per-tensor op: list arguments
    (Tensor[] and Scalar[]) are taken element by element, the others shared."""
    def lower(ctx, *args):
        out = []
        for i, t in enumerate(ctx.out):
            parts = [a[i] if isinstance(a, list) else a for a in args]
            flat = _flat(ctx.b, t, parts)
            if flat is None:
                out.append(fn(LoweringContext(ctx.b, [t]), *parts))
            else:
                r = fit(ctx.b, fn(LoweringContext(ctx.b, [flat[0]]), *flat[1]), flat[0])
                out.append(ctx.b.reshape(r, t.shape))
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
