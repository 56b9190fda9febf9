"""`torch_tpu._internal.pallas.tpu_torch_pallas`: the kernel registry PyTorch Inductor's tpu Pallas
backend calls (torch/_inductor/codegen/pallas.py): it exports each kernel with `jax.export`,
registers the serialized StableHLO module under (name, key), and calls it on tpu tensors.

Here each registered module becomes an operator (pallas.ops.ModuleOp) whose lowering inlines the
module into the calling program, compiled through the executable cache. Modules containing Mosaic
kernels (exported for platforms=['tpu']) compile only where the plugin is a TPU; elsewhere the
compile error names the kernel."""
from __future__ import annotations

import itertools
import threading

import torch

from ...pallas.ops import ModuleOp

__all__ = ["call_custom_kernel", "lookup_custom_kernel", "register_custom_kernel"]

_KERNELS: dict[tuple[str, str], ModuleOp] = {}
_LOCK = threading.Lock()
_IDS = itertools.count()


def register_custom_kernel(name: str, key: str, serialized_mlir_module: bytes) -> None:
    """Registers the serialized StableHLO module (a portable artifact or bytecode) as kernel
    (name, key); registering the same pair again keeps the first. Raises RuntimeError for bytes
    that are not such a module."""
    with _LOCK:
        if (name, key) in _KERNELS:
            return
        safe = "".join(c if c.isalnum() else "_" for c in name).strip("_") or "kernel"
        _KERNELS[(name, key)] = ModuleOp(f"torch_tpu_inductor::{safe}_{next(_IDS)}", bytes(serialized_mlir_module))


def lookup_custom_kernel(name: str, key: str) -> bool:
    """True when kernel (name, key) is registered."""
    return (name, key) in _KERNELS


def call_custom_kernel(name: str, key: str, inputs, output_shapes=None, donate_argnums=None,
                       input_output_aliases=None) -> list[torch.Tensor]:
    """Runs kernel (name, key) on the tpu tensors `inputs` (its @main's arguments, in order) and
    returns its results as new tpu tensors. `output_shapes` (tensors of the results' shapes and
    dtypes) are checked against the module's results; donation hints are accepted and do not
    change the inputs (the caller writes results back, as Inductor's generated code does).
    Raises KeyError for an unregistered kernel, ValueError for mismatched inputs or outputs."""
    op = _KERNELS.get((name, key))
    if op is None:
        raise KeyError(f"tpu_torch_pallas: kernel {name!r} with key {key!r} is not registered "
                       "(register_custom_kernel first)")
    results = op(*inputs)
    if output_shapes is not None:
        want = [(tuple(t.shape), t.dtype) for t in output_shapes]
        got = [(tuple(t.shape), t.dtype) for t in results]
        if want != got:
            raise ValueError(f"tpu_torch_pallas: kernel {name!r} returns {got}; the caller expects {want}")
    return results
