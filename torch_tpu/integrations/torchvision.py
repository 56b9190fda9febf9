"""torchvision's Python modules, importable where its compiled ops cannot load.

Why: torch_tpu pins PyTorch's CPU build (torch==2.13.0), and the torchvision for it on PyPI (0.28.0)
is built against CUDA: its compiled extension (`torchvision/_C.so`) links libtorch_cuda and does not
load. torchvision guards every use of its ops on that, except two meta registrations (`nms`, `qnms`)
made at import, so `import torchvision` raised "operator torchvision::nms does not exist" — and with
it `import timm` and transformers' model classes (`from transformers import GPT2LMHeadModel`:
"Could not import module"), which import torchvision whenever it is installed.

What changes, in a process where torch_tpu is loaded, when `torchvision` is imported: if its
compiled extension cannot be loaded, the schemas of `torchvision::nms` and `torchvision::qnms` (as
torchvision's C++ declares them) are defined first, with no kernels, so torchvision's Python modules
import (transforms, models, FrozenBatchNorm2d: what timm and transformers use). Calling
`torchvision.ops.nms` then raises PyTorch's "could not run ... no kernel" error, as torchvision's ops
would without their library. Where the extension loads, or torchvision is not installed, nothing
changes.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import sys

_MODULE = "torchvision"
_declared = None  # the torch.library.Library defining the two schemas, kept alive with the process


def _extension_loads(package_dir: str) -> bool:
    """Whether torchvision's compiled ops library loads (torchvision loads it the same way)."""
    import torch
    for path in glob.glob(os.path.join(package_dir, "_C*.so")) + glob.glob(os.path.join(package_dir, "_C*.pyd")):
        try:
            torch.ops.load_library(path)
            return True
        except OSError:
            return False
    return False


def _before_import(module) -> None:
    """Declares nms and qnms where torchvision's extension cannot load (see the module docstring)."""
    global _declared
    import torch
    locations = list(getattr(module.__spec__, "submodule_search_locations", None) or [])
    if _declared is not None or not locations or _extension_loads(locations[0]):
        return
    try:
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    except RuntimeError:  # the namespace or the schemas were defined already (by the user's own fix)
        return
    _declared = lib


def install() -> None:
    """Arranges the change above for torchvision's import; nothing where torchvision is not installed.
    `import torchvision` imports torch first, which loads torch_tpu (PyTorch's device autoload) while
    torchvision's own import is under way: then the change is made at once, before torchvision goes on
    to the registrations that need it. (A torchvision fully imported already loaded its extension.)"""
    from ._import_hook import on_import
    if _MODULE in sys.modules:
        _before_import(sys.modules[_MODULE])
    elif importlib.util.find_spec(_MODULE) is not None:
        on_import(_MODULE, before=_before_import)
