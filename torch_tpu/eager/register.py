"""Registers the tpu (PrivateUse1) kernels of every lowered op, and the fallback chain.

For each lowering of a functional overload F this registers F, its in-place variant (F's name with
a trailing underscore, same overload) and every out= variant whose other arguments are F's: one
lowering, three entry points. Ops without a lowering then take, in order: PyTorch's
CompositeImplicitAutograd decomposition (the dispatcher does that by itself), a decomposition from
PyTorch's decomposition table run on tpu tensors (registered here; the out= overloads of those
through their functional op, eager/out_variants.py), or the counted CPU fallback
(csrc/aten/cpu_fallback.cc).
"""
from __future__ import annotations

import threading

import torch
from torch._decomp import core_aten_decompositions

from .. import _C
from . import state as _state
from ..lowering import registry
from ..lowering.overloads import overload, overload_name, variants
from ..lowering.signature import cpu_dtype_refusal, tensors_of
from .kernel import Kernel, Signature
from .out_variants import functional_of, inplace_functional_of, inplace_through_functional, out_through_functional

_registered: dict[str, object] = {}
_LIBRARY = torch.library.Library("aten", "IMPL")


def _register_fn(name: str, fn, dispatch_key: str = "PrivateUse1") -> None:
    _LIBRARY.impl(name, fn, dispatch_key)
    _state.run_as_is(fn)  # torch.compile must never trace a kernel it meets running eagerly


def _impl(op, fn):
    name = overload_name(op)
    if name in _registered:
        return
    if isinstance(fn, Kernel):
        fn.register()  # its Python entries run as they are (kernel.py)
    else:
        _register_fn(name, fn)
    _registered[name] = fn


def register_lowerings():
    """Registers a Kernel for every eager lowering and its variants, then the lowering package's
    host kernels and meta functions (registry.HOST_KERNELS)."""
    for name, low in registry.REGISTRY.items():
        if not low.graph_only:
            register_lowering(name, low)
    for name, fn, key in registry.HOST_KERNELS:
        _register_fn(name, fn, key)


def register_lowering(name: str, low) -> None:
    """Registers the tpu kernel of the overload `name` (a registry key) computed by `low`, and those
    of its in-place and out= variants (aten ops; a custom kernel's op has none)."""
    f = overload(name)
    host = name == "copy"
    if low.meta is not None:
        _fake_rule(f, low.meta)
    _impl(f, Kernel(f, low, f, host_inputs=host))
    for k in variants(f) if f.namespace == "aten" else ():
        kern = Kernel(k, low, f, host_inputs=host)
        if host and k._schema.name == "aten::copy_":
            # copy_, _copy_from, _copy_from_and_resize and _local_scalar_dense are C++ kernels
            # (csrc/eager/copies.cc) that run this lowered copy for the device side.
            kern.register(dispatch=False)
            _C.eager.register_copy_ops(kern.id)
            _registered[overload_name(k)] = kern
        else:
            _impl(k, kern)


def _fake_rule(op, meta) -> None:
    """Makes `meta` the FakeTensor rule of `op` for tpu tensors, as the eager kernel uses it for
    meta tensors (Lowering.meta). torch.compile traces with fake tensors, whose results PyTorch's
    meta kernel computes for every device: where that kernel refuses what CPU and tpu accept
    (_grouped_mm's CUDA-only bfloat16 check), a FakeTensorMode rule is the one hook that sees the
    device; a meta-kernel override could not tell tpu from CPU or CUDA. Calls with no tpu tensor
    get NotImplemented, which hands them on to PyTorch's meta kernel unchanged."""
    from torch._subclasses.fake_impls import register_op_impl
    sig = Signature(op)

    def rule(mode, func, *args, **kwargs):
        vals = sig.bind(args, kwargs)
        if not any(isinstance(v, torch.Tensor) and v.device.type == "tpu" for v in vals):
            return NotImplemented
        with mode:
            return meta(*vals)

    register_op_impl(lambda func: func is op)(rule)


_active = threading.local()


def _elu_backward_check(grad, alpha, scale, input_scale, is_result, self_or_result):
    if is_result and alpha < 0:  # the in-place elu_'s result cannot tell the input's sign
        torch.ops.aten.elu_backward(torch.ones(1), alpha, scale, input_scale, True, torch.ones(1))


# Decomposed ops whose CPU kernel refuses argument values that the decomposition would compute with
# anyway (a wrong gradient): for those values CPU's kernel is asked on one-element tensors, and its
# error raised in its words. Each check gets the op's arguments.
_DECOMPOSITION_CHECKS = {"elu_backward": _elu_backward_check}


def _decomposed(op, decomp):
    """Runs PyTorch's decomposition of `op` on tpu tensors; falls to the CPU fallback if the
    decomposition calls `op` itself (some entries only normalise arguments)."""
    check = _DECOMPOSITION_CHECKS.get(overload_name(op))
    # CPU's refusal of dtypes it has no kernel for ("hardswish_cpu" not implemented for 'Long'),
    # which the decomposition would compute anyway: probed once per dtypes and ranks. Random ops
    # are not probed (the probe would draw from CPU's generator).
    sig = None if torch.Tag.nondeterministic_seeded in op.tags else Signature(op)
    probed = set()

    def kernel(*args, **kwargs):
        if check is not None:
            check(*args, **kwargs)
        if sig is not None:
            vals = sig.bind(args, kwargs)
            key = tuple((t.dtype, t.dim()) for t in tensors_of(vals))
            if key not in probed:
                cpu_dtype_refusal(sig, vals)
                probed.add(key)
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
# cat of unsqueezed inputs, the range factories' out= overloads): the Python decomposition
# (torch._refs) would compute the same result with Python in the way (and its first use imports
# torch._dynamo, most of a fresh process's first-op time); for linspace it would not even be CPU's
# values (the refs' formula differs from CPU's kernel in the last bit). ones_like runs on every
# loss.backward().
_CPP_COMPOSITE_FACTORIES = frozenset({"empty_like", "zeros_like", "ones_like", "full_like", "new_empty",
                                      "new_zeros", "new_ones", "new_full", "ones", "zeros", "stack",
                                      "arange", "arange.start", "arange.start_step", "linspace"})


def register_decompositions():
    """Step 2 of the fallback chain for ops with no lowering and no composite kernel: PyTorch's
    decompositions into core ATen (which never call the op they decompose)."""
    out_ops = []
    for op, fn in core_aten_decompositions().items():
        if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
            continue
        name = overload_name(op)
        if name in _registered or name in _CPP_COMPOSITE_FACTORIES:
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "PrivateUse1"):
            continue
        if getattr(fn, "__name__", "") == "nop_decomposition":
            continue  # e.g. detach: returning the input itself breaks nn.Parameter (needs a new TensorImpl)
        if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
            out_ops.append(op)  # in-place / out= decompositions go through their functional op instead
            continue
        if any(r.alias_info is not None for r in op._schema.returns) and \
                torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeExplicitAutograd"):
            continue  # a view (squeeze.dim): PyTorch's own view kernel, over as_strided, stays a view
        _register_fn(name, _decomposed(op, fn))
        _registered[name] = fn
    for op in out_ops:
        f, through = functional_of(op), out_through_functional
        if f is None:
            f, through = inplace_functional_of(op), inplace_through_functional
        if f is not None and overload_name(f) in _registered and overload_name(op) not in _registered:
            _register_fn(overload_name(op), through(op, f))
            _registered[overload_name(op)] = f

