"""What eager kernels and torch.compile's graph lowering both know of an ATen overload's call:
its schema's facts (Signature: argument kinds as csrc/eager/call.h keys them, written arguments,
out= or not) and CPU's answers to it that no meta kernel gives (cpu_dtype_probe: a dtype CPU's
kernel has no code for; cpu_out_dtype_refusal: an out= dtype CPU's kernel refuses), taken by
running CPU's kernel on one-element tensors of the call's dtypes and ranks."""
from __future__ import annotations

import warnings

import torch

from .. import _C
from .registry import Lowering


ArgKind = _C.eager.ArgKind


def _arg_kind(arg) -> ArgKind:
    """How schema argument `arg` enters a call's key (csrc/eager/call.h), from its type."""
    t = str(arg.type)
    if t in ("Tensor", "Tensor?", "Optional[Tensor]"):
        return ArgKind.tensor
    if t in ("Tensor[]", "Tensor?[]", "List[Tensor]", "List[Optional[Tensor]]"):
        return ArgKind.tensor_list
    if t in ("Scalar", "Scalar?", "number", "Optional[number]"):
        return ArgKind.scalar
    if t in ("Scalar[]", "List[number]"):
        return ArgKind.scalar_list
    if t in ("Generator?", "Optional[Generator]"):
        return ArgKind.generator
    return ArgKind.value


class Signature:
    """Precomputed facts about one overload's schema: argument names and kinds (_C.eager.ArgKind),
    written arguments, return count, whether it is an out= overload; invoke() and bind() call it with
    values in schema order (eager kernels and torch.compile's graph lowering share it)."""

    def __init__(self, overload, float_operands=False):
        self.overload = overload
        schema = overload._schema
        self.args = list(schema.arguments)
        self.names = [a.name for a in self.args]
        # float_operands (Lowering.float_operands): `float` arguments as Scalars, operands of the program
        self.kinds = [ArgKind.scalar if float_operands and str(a.type) == "float" else _arg_kind(a)
                      for a in self.args]
        self.written = [i for i, a in enumerate(self.args) if a.alias_info is not None and a.alias_info.is_write]
        self.num_returns = len(schema.returns)
        self.is_out = bool(self.written) and any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
                                                  for a in self.args)

    def invoke(self, vals):
        """Calls the overload with `vals` (schema order), kwarg-only arguments by name."""
        pos = [v for v, a in zip(vals, self.args) if not a.kwarg_only]
        kw = {a.name: v for v, a in zip(vals, self.args) if a.kwarg_only}
        return self.overload(*pos, **kw)

    def bind(self, args, kwargs):
        vals = list(args)
        if len(vals) > len(self.args):
            raise TypeError(f"{self.overload}: too many arguments")
        for a in self.args[len(vals):]:
            if a.name in kwargs:
                vals.append(kwargs[a.name])
            elif a.has_default_value():
                vals.append(a.default_value)
            else:
                vals.append(None)
        return vals


def tensors_of(v):
    """The tensors in `v` (a tensor, or nested lists/tuples of them), in order."""
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from tensors_of(x)


def cpu_dtype_probe(low: Lowering, sig: Signature, vals, host_inputs: bool = False) -> None:
    """Raises CPU's NotImplementedError where CPU's kernel has no code for the call's dtypes
    ('"hypot_cpu" not implemented for 'Byte''), which no meta kernel checks: the op runs on CPU
    (eager: once per key; torch.compile: once per graph node, on its example values), on
    one-element tensors of the call's dtypes and ranks (values 1; empty ones as they are). Only that error is taken from the probe; any other is left to the real call (its
    values and shapes differ).
    Not probed: random ops (they would draw from CPU's generator), host-input ops, float8 (tpu
    computes what CPU has no float8 kernel for: README), lowerings with cpu_dtypes=False (decided
    otherwise) and other namespaces' ops. An out= overload is probed with its out= tensors too
    (torch.floor(complex, out=...): the refs' out= meta checks no input dtype; the out= dtypes
    themselves are cpu_out_dtype_refusal's). The probe's own warnings are dropped (C++ ones through
    _C.device.without_cpp_warnings: the caller's warning handler would hold them past any Python
    filter)."""
    if low.rng or not low.cpu_dtypes or host_inputs:
        return
    cpu_dtype_refusal(sig, vals)


def cpu_dtype_refusal(sig: Signature, vals) -> None:
    """cpu_dtype_probe's probe itself, for any aten call that draws no random numbers (also the ops
    that run through a decomposition, eager/register.py)."""
    if sig.overload.namespace != "aten":
        return
    tensors = tensors_of(vals)
    if any(t.dtype.is_floating_point and t.dtype.itemsize == 1 for t in tensors):
        return

    try:
        run_probe(sig, probe_args(sig, vals))
    except NotImplementedError as e:  # TORCH_CHECK_NOT_IMPLEMENTED: what CPU has no code for
        m = str(e)  # (not an op with no CPU kernel at all, or a privateuse1-only stub: no dtype rule)
        if not m.startswith("Could not run") and "privateuse1" not in m:
            raise NotImplementedError(m) from None
    except Exception:  # noqa: BLE001  (only the dtype refusal above is CPU's answer for this call)
        pass


def probe_args(sig: Signature, vals, dtypes=None) -> list:
    """The call's arguments as one-element CPU tensors of their dtypes and ranks (values 1; an empty
    tensor keeps its shape: CPU skips some kernels, and their checks, for no elements). dtypes: per
    argument index, a dtype to use instead."""
    def one(t, dtype):
        if not isinstance(t, torch.Tensor):
            return t
        return torch.ones(t.shape if t.numel() == 0 else [1] * t.dim(), dtype=dtype or t.dtype)
    dtypes = dtypes or {}
    return [[one(t, None) for t in v] if isinstance(v, (list, tuple)) and kind == ArgKind.tensor_list else
            None if kind == ArgKind.generator else one(v, dtypes.get(i)) for i, (v, kind) in enumerate(zip(vals, sig.kinds))]


def run_probe(sig: Signature, probe) -> None:
    with warnings.catch_warnings():  # the probe's warnings (var's "degrees of freedom is <= 0"
        warnings.simplefilter("ignore")  # on one element, an out= resized) are not the call's
        _C.device.without_cpp_warnings(sig.invoke, probe)


# PyTorch's out= wrappers' refusals of an out= dtype, whose wording is not CPU's kernels'.
_OUT_DTYPE_REFUSALS = ("to out tensor with dtype", "Expected out tensor to have dtype")


def cpu_out_dtype_refusal(sig: Signature, vals, result_dtypes=None, meta_error: Exception | None = None) -> None:
    """Raises CPU's RuntimeError for an out= tensor of a dtype CPU's kernel refuses, in the kernel's
    own words ("Found dtype Double but expected Float" for neg, nonzero's "Expected out tensor to have
    scalar type Long", add's "result type Float can't be cast to the desired output type Long"): CPU
    runs the call on one-element tensors (probe_args). Two callers:
    - meta passed (result_dtypes: per written tensor argument, the result's dtype): meta kernels leave
      these dtypes unchecked; the probe's RuntimeError is raised when the same probe with out= tensors
      of the result's dtypes passes, so only the out= dtype is to blame;
    - meta refused (meta_error): where that is PyTorch's out= wrapper refusing the dtype in its own
      words, the probe's RuntimeError replaces it.
    Returns (meta's answer stands) otherwise."""
    if sig.overload.namespace != "aten":
        return
    if meta_error is not None:
        if not any(m in str(meta_error) for m in _OUT_DTYPE_REFUSALS):
            return
        written = []
    else:
        written = [i for i in sig.written if sig.kinds[i] == ArgKind.tensor]
        if not written or result_dtypes is None or len(written) != len(result_dtypes) or \
                any(d is None for d in result_dtypes) or all(vals[i].dtype == d for i, d in zip(written, result_dtypes)):
            return
        if any(t.dtype.is_floating_point and t.dtype.itemsize == 1 for t in tensors_of(vals)):
            return  # float8: tpu computes what CPU has no kernel for (README)
    try:
        run_probe(sig, probe_args(sig, vals))
        return
    except RuntimeError as e:
        refused = e
    except Exception:  # noqa: BLE001  (only an out= dtype refusal is taken from the probe)
        return
    if written:
        try:
            run_probe(sig, probe_args(sig, vals, dict(zip(written, result_dtypes))))
        except Exception:  # noqa: BLE001  (the call fails for another reason: left to the real call)
            return
    raise RuntimeError(str(refused)) from None
