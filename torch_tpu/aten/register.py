"""Registers the tpu (PrivateUse1) kernels of every lowered op, and the fallback chain.

For each lowering of a functional overload F this registers F, its in-place variant (F's name with
a trailing underscore, same overload) and every out= variant whose other arguments are F's: one
lowering, three entry points. Ops without a lowering then take, in order: PyTorch's
CompositeImplicitAutograd decomposition (the dispatcher does that by itself), a decomposition from
PyTorch's decomposition table run on tpu tensors (registered here), or the counted CPU fallback
(csrc/aten/cpu_fallback.cc).
"""
from __future__ import annotations

import threading

import torch
from torch._decomp import core_aten_decompositions

from .. import _C
from ..lowering import registry
from .kernel import Kernel

_registered: dict[str, object] = {}


def _overload(name: str):
    packet, _, ov = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), ov or "default")


def _same_args(a, b) -> bool:
    return [(x.name, str(x.type)) for x in a._schema.arguments] == [(x.name, str(x.type)) for x in b._schema.arguments]


def _name(overload) -> str:
    return overload._schema.name.split("::")[1] + ("." + overload._overloadname if overload._overloadname != "default" else "")


def _impl(overload, fn):
    name = _name(overload)
    if name in _registered:
        return
    if isinstance(fn, Kernel):
        fn.register()
        registry.KERNELS.append(fn)
    else:
        registry.register_kernel(name, fn)
    _registered[name] = fn


def _variants(f):
    """In-place and out= overloads whose value is f's."""
    packet_name = f._schema.name.split("::")[1]
    out = []
    if not packet_name.endswith("_"):
        inplace = getattr(torch.ops.aten, packet_name + "_", None)
        if inplace is not None and f._overloadname in inplace.overloads():
            k = getattr(inplace, f._overloadname)
            if _same_args(k, f):
                out.append(k)
    packet = getattr(torch.ops.aten, packet_name)
    f_args = [(x.name, str(x.type)) for x in f._schema.arguments]
    for ov in packet.overloads():
        k = getattr(packet, ov)
        args = k._schema.arguments
        outs = [a for a in args if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
        if outs and [(x.name, str(x.type)) for x in args if x not in outs] == f_args:
            out.append(k)
    return out


def register_lowerings():
    for name, low in registry.REGISTRY.items():
        f = _overload(name)
        host = name == "copy"
        _impl(f, Kernel(f, low, f, host_inputs=host))
        for k in _variants(f):
            kern = Kernel(k, low, f, host_inputs=host)
            if host and k._schema.name == "aten::copy_":
                # copy_, _copy_from, _copy_from_and_resize and _local_scalar_dense are C++ kernels
                # (csrc/python/copies.cc) that run this lowered copy for the device side.
                kern.register(dispatch=False)
                registry.KERNELS.append(kern)
                _C._register_copy_ops(kern.id)
                _registered[_name(k)] = kern
            else:
                _impl(k, kern)


_active = threading.local()


def _decomposed(op, decomp):
    """Runs PyTorch's decomposition of `op` on tpu tensors; falls to the CPU fallback if the
    decomposition calls `op` itself (some entries only normalise arguments)."""
    def kernel(*args, **kwargs):
        stack = getattr(_active, "ops", None)
        if stack is None:
            stack = _active.ops = set()
        if op in stack:
            raise NotImplementedError(f"{op}: its decomposition calls it again and it has no tpu lowering")
        stack.add(op)
        try:
            return decomp(*args, **kwargs)
        finally:
            stack.discard(op)
    return kernel


# Ops whose C++ CompositeExplicitAutograd kernel calls ops tpu lowers (empty then fill_ / zero_,
# cat of unsqueezed inputs, arange's out= overload): the Python decomposition (torch._refs) would
# compute the same result with Python in the way (and its first use imports torch._dynamo, most of
# a fresh process's first-op time). ones_like runs on every loss.backward().
_CPP_COMPOSITE_FACTORIES = frozenset({"empty_like", "zeros_like", "ones_like", "full_like", "new_empty",
                                      "new_zeros", "new_ones", "new_full", "ones", "zeros", "stack",
                                      "arange", "arange.start"})


def register_decompositions():
    """Step 2 of the fallback chain for ops with no lowering and no composite kernel: PyTorch's
    decompositions into core ATen (which never call the op they decompose)."""
    for op, fn in core_aten_decompositions().items():
        if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
            continue
        name = op._schema.name.split("::")[1] + ("." + op._overloadname if op._overloadname != "default" else "")
        if name in _registered or name in _CPP_COMPOSITE_FACTORIES:
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "PrivateUse1"):
            continue
        if getattr(fn, "__name__", "") == "nop_decomposition":
            continue  # e.g. detach: returning the input itself breaks nn.Parameter (needs a new TensorImpl)
        if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
            continue  # in-place / out= decompositions go through their functional op instead
        if any(r.alias_info is not None for r in op._schema.returns) and \
                torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeExplicitAutograd"):
            continue  # a view (squeeze.dim): PyTorch's own view kernel, over as_strided, stays a view
        registry.register_kernel(name, _decomposed(op, fn))
        _registered[name] = fn
