"""out= and in-place overloads of functional ops that run on tpu through a decomposition (sinc.out,
logaddexp.out, nansum.out, norm.out, linalg_cross.out, hardswish_, logit_...): the functional result
on the device, written into out= (or self) as CPU's kernels write it. Lowered ops' variants are
Kernels of their own (register.py); these took the CPU fallback (right values, a device -> host ->
device round trip per call: nn.Hardswish(inplace=True) in every block of mobilenet_v3)."""
from __future__ import annotations

import threading

import torch

from ..lowering.overloads import variants
from ..lowering.signature import ArgKind, Signature, run_probe


def functional_of(op):
    """The functional overload F whose out= variant `op` is (lowering/overloads.variants), or None:
    an in-place op, an out= overload of a list of tensors (split_with_sizes_copy.out: left to the
    CPU fallback), or one whose other arguments are no functional overload's."""
    sig = Signature(op)
    if not sig.is_out or any(sig.kinds[i] != ArgKind.tensor for i in sig.written):
        return None
    packet = getattr(torch.ops.aten, op._schema.name.split("::")[1])
    for ov in packet.overloads():
        f = getattr(packet, ov)
        if not Signature(f).written and op in variants(f):
            return f
    return None


def inplace_functional_of(op):
    """The functional overload F whose in-place variant `op` is (hardswish_ -> hardswish,
    lowering/overloads.variants), or None."""
    name = op._schema.name.split("::")[1]
    packet = getattr(torch.ops.aten, name[:-1], None) if name.endswith("_") else None
    f = getattr(packet, op._overloadname, None) if packet is not None else None
    return f if f is not None and op in variants(f) else None


def inplace_through_functional(op, f):
    """The tpu kernel of in-place overload `op` of functional overload `f` (same arguments): f runs
    on tpu and its result is copied into self, which keeps its dtype and shape. A result CPU's
    in-place kernel refuses (a dtype it has no kernel for, a result it cannot cast to self's dtype,
    another shape) raises CPU's own error, from CPU's kernel run on zeros of the call's shapes and
    dtypes, and self is left unchanged."""
    sig, f_sig = Signature(op), Signature(f)

    def kernel(*args, **kwargs):
        vals = sig.bind(args, kwargs)
        self_ = vals[0]
        r = f_sig.invoke(list(vals))
        if r.dtype != self_.dtype or r.shape != self_.shape:
            run_probe(sig, [_zeros(v) for v in vals])
        self_.copy_(r)
        return self_
    return kernel


def out_through_functional(op, f):
    """The tpu kernel of out= overload `op` of functional overload `f`. In CPU's order: f's errors
    for its inputs (f runs on tpu); the out= tensors' device; the out= dtypes CPU's kernel refuses
    (its own words and type, _cpu_out_refusal); then out is resized as at::native::resize_output
    resizes it (with its deprecation warning for a non-empty out of another shape) and the result is
    copied in, cast to out's dtype. A reduction's out= with no dtype computes in out's dtype
    (ReduceOps' get_dtype_from_result: nansum.out). Nothing is written when any check fails. Not
    checked: an out= tensor that partly overlaps an input, which CPU's TensorIterator ops refuse;
    here the result is the one a clone() of that input would give."""
    sig = Signature(op)
    f_sig = Signature(f)
    f_index = [i for i in range(len(sig.args)) if i not in sig.written]
    dtype_arg = sig.names.index("dtype") if "dtype" in sig.names and len(sig.written) == 1 else None

    def kernel(*args, **kwargs):
        vals = sig.bind(args, kwargs)
        outs = [vals[i] for i in sig.written]
        filled = dtype_arg is not None and vals[dtype_arg] is None
        if filled:
            vals[dtype_arg] = outs[0].dtype
        result = f_sig.invoke([vals[i] for i in f_index])
        results = [result] if isinstance(result, torch.Tensor) else list(result)
        for o, r in zip(outs, results):
            if o.device != r.device:
                raise RuntimeError(f"Expected out tensor to have device {r.device}, but got {o.device} instead")
        if filled or any(o.dtype != r.dtype for o, r in zip(outs, results)):
            if filled:
                vals[dtype_arg] = None
            _cpu_out_refusal(sig, f_sig, f_index, vals)
        for o, r in zip(outs, results):
            if o.shape != r.shape:  # resize_output's check and warning, on a meta twin of out
                m = torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device="meta")
                torch.ops.aten._resize_output_(m, r.shape, m.device)
                o.resize_(r.shape)
            o.copy_(r)
        return outs[0] if sig.num_returns == 1 else tuple(outs)
    return kernel


_REFUSALS: dict = {}  # call's (op, dtypes, shapes, other arguments) -> CPU's refusal or None
_LOCK = threading.Lock()


def _cpu_out_refusal(sig: Signature, f_sig: Signature, f_index: list, vals: list) -> None:
    """Raises what CPU's kernel raises for these out= dtypes (linalg_cross's exact-dtype "Expected
    out tensor to have dtype float, but got double instead", TensorIterator's "result type Float
    can't be cast...", nansum's "not implemented for 'Long'"), which no meta kernel says in CPU's
    words. CPU runs the call on zeros of the call's shapes and dtypes (shape rules make one-element
    probes fail for other reasons) and, when it refuses, the functional call alone: only a refusal
    the functional call does not share is the out= dtypes'. Once per distinct call (memoized)."""
    key = (sig.overload, tuple(_describe(v) for v in vals))
    with _LOCK:
        known = _REFUSALS.get(key, ())
    if known == ():
        known = None
        probe = [_zeros(v) for v in vals]
        try:
            run_probe(sig, probe)
        except (RuntimeError, TypeError, NotImplementedError) as e:
            try:
                run_probe(f_sig, [probe[i] for i in f_index])
                known = (type(e), str(e))
            except Exception:  # noqa: BLE001  (the inputs themselves fail: not the out= dtypes)
                pass
        with _LOCK:
            _REFUSALS[key] = known
    if known is not None:
        raise known[0](known[1])


def _describe(v):
    if isinstance(v, torch.Tensor):
        return ("T", tuple(v.shape), v.dtype)
    if isinstance(v, (list, tuple)):
        return tuple(_describe(x) for x in v)
    return repr(v)


def _zeros(v):
    if isinstance(v, torch.Tensor):
        return torch.zeros(v.shape, dtype=v.dtype)
    if isinstance(v, (list, tuple)):
        return type(v)(_zeros(x) for x in v)
    return None if isinstance(v, torch.Generator) else v
