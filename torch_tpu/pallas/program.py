"""A JAX function lowered to StableHLO for one call signature, as functions of OUR programs.

JAX traces the function for the argument shapes and dtypes (and the static arguments' values) and
lowers it for the platform the PJRT plugin runs: Pallas calls in interpret mode (plain StableHLO)
where the platform cannot compile Mosaic kernels (the CPU plugin), natively otherwise. The module's
functions are renamed into a namespace of their own (a hash of the module text, so the same kernel
has the same names, and the same disk-cached executables, in every process), made private, and
stripped of JAX's argument/result attributes; a lowering then adds them to whatever program calls
the kernel (an eager op, a fused run, a compiled graph) and calls the renamed entry function. One
lowering per signature: a second call with the same shapes traces and compiles nothing.
"""
from __future__ import annotations

import hashlib
import threading
import warnings

import torch

from .. import runtime
from ..lowering.builder import ELEMENT_TYPES, TensorType
from . import _jax

_CACHE: dict = {}
_LOCK = threading.Lock()
_WARNED_INTERPRET = [False]


def jax_platform() -> str:
    """The JAX lowering platform of the programs built now: "cpu", "cuda" or "tpu" (the running
    plugin's, or a compile-only target's under torch_tpu.aot: runtime.lowering_platform)."""
    return runtime.lowering_platform()


class JaxProgram:
    """`fn` lowered for arguments of `in_types` (TensorType, in order) with `statics` bound.

    Attributes: entry (the renamed public function), functions (private func.func texts),
    out_types (TensorType per flat output), out_tree (JAX's tree of the outputs), interpreted
    (Pallas calls lowered in interpret mode)."""

    def __init__(self, name: str, fn, in_types: list[TensorType], statics: tuple, jit_kwargs: dict):
        jax = _jax.require()
        from jax._src.lib.mlir import ir
        platform = jax_platform()
        self.interpreted = platform != "tpu"
        specs = [jax.ShapeDtypeStruct(t.shape, _jax.jax_dtype(t.dtype)) for t in in_types]
        wide = any(t.dtype in (torch.float64, torch.int64, torch.complex128, torch.uint64) for t in in_types)
        try:
            with _jax.lowering_context(wide, self.interpreted):
                bound = (lambda *a: fn(*a, *statics)) if statics else fn
                traced = jax.jit(bound, **jit_kwargs).trace(*specs)
                lowered = traced.lower(lowering_platforms=(platform,))
        except Exception as e:
            hint = ""
            if name.endswith("_vjp"):
                hint = (f"\n(This is the backward of {name[:-4]}, JAX's vjp of its function. JAX cannot "
                        "differentiate some functions, e.g. a pallas_call without a custom_vjp: give the operator "
                        "a backward with register_autograd.)")
            raise RuntimeError(f"torch_tpu.pallas: JAX could not trace {name} for arguments "
                               f"{[(tuple(t.shape), t.dtype) for t in in_types]}: {type(e).__name__}: {e}{hint}") from e
        if self.interpreted and "pallas_call" in str(traced.jaxpr) and not _WARNED_INTERPRET[0]:
            _WARNED_INTERPRET[0] = True
            warnings.warn(f"torch_tpu.pallas: the {platform} platform cannot compile Pallas (Mosaic) kernels; "
                          "they run in Pallas's interpret mode (plain StableHLO), correct but not fast.",
                          stacklevel=4)
        self.out_tree = lowered.out_tree
        self.out_types = [TensorType(tuple(o.shape), _jax.torch_dtype(o.dtype))
                          for o in jax.tree_util.tree_leaves(lowered.out_info)]
        jax_module = lowered.compiler_ir("stablehlo")
        with jax_module.context:
            from jax._src.lib.mlir import ir
            # a copy: JAX may hand the same module to a later lowering of the same function
            module = ir.Module.parse(jax_module.operation.get_asm(enable_debug_info=False))
            self.entry, self.functions = _import(module, name)

    def call(self, b, args):
        """The kernel inside program `b`: its functions added, the entry called on `args` (Values of
        in_types); returns one Value per flat output."""
        for f in self.functions:
            b.add_function(f, f)
        return b.call(self.entry, args, self.out_types)


def _import(module, name: str) -> tuple[str, list[str]]:
    """(entry, private func.func texts) of an MLIR StableHLO module (its context entered): every
    function renamed into the namespace k<hash of name and text>_, made private, and stripped of
    argument/result attributes (JAX's result names, shardings, donation hints only mean something on
    a program's own @main)."""
    from jax._src.lib.mlir import ir
    text = module.operation.get_asm(enable_debug_info=False)
    prefix = "k" + hashlib.sha256(f"{name}\n{text}".encode()).hexdigest()[:16] + "_"
    ops = list(module.body.operations)
    for op in ops:
        old = ir.StringAttr(op.attributes["sym_name"]).value
        ir.SymbolTable.replace_all_symbol_uses(old, prefix + old, module.operation)
        ir.SymbolTable.set_symbol_name(op, prefix + old)
        ir.SymbolTable.set_visibility(op, "private")
        for attr in ("arg_attrs", "res_attrs"):
            if attr in op.attributes:
                del op.attributes[attr]
    return prefix + "main", [op.operation.get_asm(enable_debug_info=False) for op in ops]


class ModuleProgram(JaxProgram):
    """A serialized StableHLO module (a portable artifact, e.g. `jax.export`'s
    mlir_module_serialized) as functions of our programs: its @main's argument and result types
    are the signature. Raises RuntimeError when the bytes are not such a module."""

    def __init__(self, name: str, serialized: bytes):
        _jax.require()
        from jax._src.interpreters import mlir as jmlir
        from jax._src.lib import _jax as jaxlib
        from jax._src.lib.mlir import ir
        ctx = jmlir.make_ir_context()
        with ctx:
            try:
                module = jaxlib.mlir.deserialize_portable_artifact(serialized)
            except Exception:
                try:
                    module = ir.Module.parse(serialized)
                except Exception as e:
                    raise RuntimeError(f"torch_tpu.pallas: kernel {name}: not a StableHLO module or portable "
                                       f"artifact ({type(e).__name__}: {e})") from None
            main = next(op for op in module.body.operations if ir.StringAttr(op.attributes["sym_name"]).value == "main")
            ftype = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
            self.in_types = [_tensor_type(t) for t in ftype.inputs]
            self.out_types = [_tensor_type(t) for t in ftype.results]
            self.entry, self.functions = _import(module, name)
        self.out_tree = None
        self.interpreted = False


def _tensor_type(t) -> TensorType:
    """TensorType of an MLIR ranked tensor type (its element type spelled as our builder spells it)."""
    from jax._src.lib.mlir import ir
    rt = ir.RankedTensorType(t)
    element = str(rt.element_type)
    dtype = next((d for d, e in ELEMENT_TYPES.items() if e == element), None)
    if dtype is None:
        raise TypeError(f"torch_tpu.pallas: element type {element} has no torch dtype")
    return TensorType(tuple(rt.shape), dtype)


def program(name: str, fn, in_types: list[TensorType], statics: tuple = (), jit_kwargs: dict | None = None,
            key=None) -> JaxProgram:
    """The cached JaxProgram of `fn` for this signature (`key` names fn in the cache: the op)."""
    k = (key if key is not None else fn, tuple(in_types), statics, jax_platform())
    p = _CACHE.get(k)
    if p is None:
        with _LOCK:
            p = _CACHE.get(k)
            if p is None:
                p = _CACHE[k] = JaxProgram(name, fn, list(in_types), statics, dict(jit_kwargs or {}))
    return p
