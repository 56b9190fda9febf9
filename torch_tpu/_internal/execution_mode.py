"""`torch_tpu._internal.execution_mode`: Google TorchTPU's names for the eager modes.

EagerMode.DEFER_NEVER is strict mode (each op launched at once, asynchronously),
DEFER_NEVER_AND_LAUNCH_BLOCKING is debug mode (each op waited for: errors at the op), DEFER_AND_FUSE
is fused mode (ops recorded and run as one program). The functions are torch_tpu.eager's, taking and
returning EagerMode values (or the mode names)."""
from __future__ import annotations

import contextlib
import enum

from .. import eager

__all__ = ["EagerMode", "eager_mode", "get_eager_mode", "set_eager_mode"]


class EagerMode(enum.Enum):
    DEFER_NEVER = "strict"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"
    DEFER_AND_FUSE = "fused"


def _name(mode) -> str:
    if isinstance(mode, EagerMode):
        return mode.value
    if isinstance(mode, str) and mode in {m.value for m in EagerMode}:
        return mode
    raise ValueError(f"unknown eager mode {mode!r}: use an EagerMode (DEFER_NEVER, "
                     "DEFER_NEVER_AND_LAUNCH_BLOCKING, DEFER_AND_FUSE)")


def set_eager_mode(mode) -> None:
    """Sets the process's default eager mode (threads inside an eager_mode block keep theirs)."""
    eager.set_eager_mode(_name(mode))


def get_eager_mode() -> EagerMode:
    """This thread's eager mode."""
    return EagerMode(eager.get_eager_mode())


@contextlib.contextmanager
def eager_mode(mode):
    """Runs the block in `mode` on this thread (and in the autograd work it starts)."""
    with eager.eager_mode(_name(mode)):
        yield
