"""JAX, imported only when a kernel is used: `import torch_tpu` never imports it.

JAX and the kernel libraries are the optional `kernels` extra (pyproject.toml). Lowering runs on the
host (tracing to StableHLO); nothing here starts a JAX backend on a device, so JAX and torch_tpu
never compete for a chip.
"""
from __future__ import annotations

import contextlib

import torch

_INSTALL = "pip install 'torch_tpu[kernels]'"


def require():
    """The jax module; ImportError naming what to install when JAX is missing. On a host without a
    TPU, libtpu (the tpu extra) gets its compile-only environment first: JAX loads it when it starts
    its backends, and without that it prints "Failed to find host bounds" and an INVALID_ARGUMENT
    trace about worker hostnames (issue 52)."""
    from ..aot.target import compile_only_environment
    compile_only_environment()
    try:
        import jax
    except ImportError as e:
        raise ImportError(f"torch_tpu.pallas needs JAX to trace kernels, and it is not installed ({e}). "
                          f"Install the kernels extra: {_INSTALL}") from None
    return jax


_DTYPES = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int8: "int8", torch.int16: "int16", torch.int32: "int32", torch.int64: "int64", torch.uint8: "uint8",
    torch.uint16: "uint16", torch.uint32: "uint32", torch.uint64: "uint64", torch.bool: "bool",
    torch.complex64: "complex64", torch.complex128: "complex128",
    torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2",
}
_TORCH = {v: k for k, v in _DTYPES.items()}


def jax_dtype(dtype: torch.dtype):
    """The JAX (numpy) dtype of a torch dtype; TypeError for one JAX has no equivalent of."""
    import jax.numpy as jnp
    name = _DTYPES.get(dtype)
    if name is None:
        raise TypeError(f"torch_tpu.pallas: {dtype} has no JAX equivalent")
    return jnp.dtype(name)


def torch_dtype(dtype) -> torch.dtype:
    """The torch dtype of a JAX dtype; TypeError for one torch has no equivalent of."""
    import numpy as np
    name = np.dtype(dtype).name
    if name not in _TORCH:
        raise TypeError(f"torch_tpu.pallas: JAX dtype {name} has no torch equivalent")
    return _TORCH[name]


def spec(t: torch.Tensor):
    """jax.ShapeDtypeStruct of a tensor's shape and dtype."""
    jax = require()
    return jax.ShapeDtypeStruct(tuple(t.shape), jax_dtype(t.dtype))


@contextlib.contextmanager
def lowering_context(wide: bool, interpret: bool):
    """JAX's settings while tracing a kernel: 64-bit types when an argument is 64-bit (JAX would
    narrow them otherwise), and Pallas calls in interpret mode (plain StableHLO) when the platform
    cannot compile Mosaic kernels."""
    from jax._src import config
    stack = contextlib.ExitStack()
    with stack:
        if wide:
            prev_x64 = config.enable_x64.swap_local(True)
            stack.callback(config.enable_x64.set_local, prev_x64)
        if interpret:
            prev = config.pallas_tpu_interpret_mode_context_manager.swap_local(True)
            stack.callback(config.pallas_tpu_interpret_mode_context_manager.set_local, prev)
            _force_interpreted_pallas_lowering(stack)
        yield


def _force_interpreted_pallas_lowering(stack: contextlib.ExitStack) -> None:
    """A pallas_call built before tracing (Helion's launcher builds it, then jits it) carries
    interpret=False from its construction, which the config above cannot change: while we lower,
    pallas_call's lowering (the primitive's rule, and the function that Pallas's mpmd_map lowering
    calls directly) interprets it. JAX internals: jax._src.pallas.pallas_call._pallas_call_lowering
    and jax._src.interpreters.mlir's rule table; without them only calls built while tracing are
    interpreted."""
    try:
        from jax._src.interpreters import mlir
        from jax._src.pallas import pallas_call as module
    except ImportError:
        return
    original = getattr(module, "_pallas_call_lowering", None)
    if original is None:
        return

    def interpreted(ctx, *args, interpret=False, **params):
        return original(ctx, *args, interpret=interpret or True, **params)
    module._pallas_call_lowering = interpreted
    stack.callback(setattr, module, "_pallas_call_lowering", original)
    entry = mlir._lowerings.get(module.pallas_call_p)
    if entry is not None:
        mlir._lowerings[module.pallas_call_p] = mlir.LoweringRuleEntry(interpreted, entry.inline)
        stack.callback(mlir._lowerings.__setitem__, module.pallas_call_p, entry)
