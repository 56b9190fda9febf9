"""torch_tpu's integrations with libraries that choose a device themselves (or a path by device:
torch.nn's transformer fast path): each is applied when that library is imported (and only where it
is installed), and says what it changes and why."""
from __future__ import annotations

from . import accelerate, nn_transformer, torchvision


def install() -> None:
    """Called once when torch_tpu loads."""
    accelerate.install()
    torchvision.install()
    nn_transformer.install()
