"""torch.compile(backend="tpu"): Dynamo graphs lowered whole, by the eager lowering registry, to
one StableHLO module each (see backend.py and lower_graph.py).

Importing torch_tpu does not import torch._dynamo (it takes seconds): "tpu" is registered with
Dynamo's backend registry the moment that registry is imported, and the backend's own modules load
on the first compile.
"""
from __future__ import annotations

import sys

from ..integrations._import_hook import on_import

_REGISTRY_MODULE = "torch._dynamo.backends.registry"


def tpu_backend(gm, example_inputs, **kwargs):
    """The Dynamo backend "tpu" (torch.compile(model, backend="tpu"))."""
    from .backend import tpu_backend as compile_fx
    return compile_fx(gm, example_inputs, **kwargs)


def last_stablehlo() -> str | None:
    """StableHLO text of the graph compiled last by torch.compile(backend="tpu")."""
    mod = sys.modules.get(__name__ + ".lower_graph")
    return None if mod is None else mod.last_text


def _register() -> None:
    registry = sys.modules[_REGISTRY_MODULE]
    # Skipped while Dynamo loads "tpu" through the package's entry point: it registers it itself.
    if "tpu" not in registry._COMPILER_FNS and registry._BACKENDS.get("tpu") is None:
        registry.register_backend(compiler_fn=tpu_backend, name="tpu")


def _route_inductor_to_tpu() -> None:
    """torch.compile(fn) with no backend (Inductor) on tpu tensors compiles with backend "tpu".

    Inductor's own tpu path generates Pallas (Mosaic) kernels and runs them through
    torch_tpu._internal.pallas.tpu_torch_pallas; Mosaic kernels compile only on a TPU. So where the
    plugin is not a TPU, and on a TPU unless TORCH_TPU_INDUCTOR_PALLAS=1 asks for Inductor's kernels,
    a graph with a tpu tensor among its inputs goes to our backend. Graphs of CPU or CUDA tensors stay
    Inductor's."""
    import torch
    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper is None or getattr(wrapper.__call__, "_torch_tpu_routed", False):
        return
    inductor_call = wrapper.__call__

    def __call__(self, model_, inputs_, **kwargs):
        if any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in inputs_):
            from .. import runtime, settings
            if runtime.platform().lower() != "tpu" or not settings.flag("TORCH_TPU_INDUCTOR_PALLAS"):
                return tpu_backend(model_, inputs_)
        return inductor_call(self, model_, inputs_, **kwargs)
    __call__._torch_tpu_routed = True
    wrapper.__call__ = __call__


_route_inductor_to_tpu()

on_import(_REGISTRY_MODULE, after=lambda module: _register())  # right after Dynamo's backend registry loads

__all__ = ["tpu_backend", "last_stablehlo"]
