"""Imports torchvision's Python modules where its compiled ops cannot load (timm needs them).

timm imports torchvision (FrozenBatchNorm2d, transforms). On this machine torch is PyTorch's CPU
build, and the only torchvision for it on PyPI (0.28.0) is built against CUDA: its `_C` extension
fails to load (it links libtorch_cuda), and `import torchvision` then raises
"operator torchvision::nms does not exist", because its meta registrations for `nms` and `qnms`
are the only ones not guarded by `torchvision.extension._has_ops()`.

`import_torchvision()` declares those two operators' schemas (the ones torchvision's C++ defines)
with no kernels, so the Python modules import; calling `torchvision.ops.nms` still fails, with
PyTorch's "no kernel" error. Where torchvision loads normally, it is imported unchanged.
"""
import importlib
import importlib.util
import sys

import torch

_declared = None  # the torch.library.Library holding the two schemas, kept alive


def import_torchvision():
    """Returns the torchvision module (None where it is not installed), declaring nms/qnms first if
    its compiled ops cannot load. Call it before importing transformers or timm, which import
    torchvision whenever it is installed."""
    global _declared
    if importlib.util.find_spec("torchvision") is None:
        return None
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as e:
        if "torchvision::nms does not exist" not in str(e):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    _declared = torch.library.Library("torchvision", "DEF")
    _declared.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _declared.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    return importlib.import_module("torchvision")
