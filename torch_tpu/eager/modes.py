"""Choosing how eager ops run on the tpu device: "debug", "strict" (default) or "fused".

    torch_tpu.set_eager_mode("fused")
    with torch_tpu.eager_mode("debug"): ...

The mode is per thread, as PyTorch's grad mode is: `set_eager_mode` sets the process default, which
every thread follows outside an `eager_mode(...)` block; a block changes only the calling thread's
mode, for its body (and the backward passes it starts: autograd's threads run them in its mode).

Environment (read at import): TORCH_TPU_EAGER_MODE=debug|strict|fused; the switches of Google's
TorchTPU are honoured too: TPU_LAUNCH_BLOCKING=1 means debug, TORCH_TPU_DEFER_AND_FUSE=1 fused.
See torch_tpu/eager/executables.py for what each mode does.
"""
from __future__ import annotations

import contextlib

from .. import _C, settings
from . import state as _state
from .state import MODES


_flush = _C.eager.fused_flush  # runs what fused mode recorded


def _code(mode: str) -> "_C.eager.Mode":
    if mode not in MODES:
        raise ValueError(f"unknown tpu eager mode {mode!r}: expected one of {', '.join(MODES)}")
    return _C.eager.Mode.__members__[mode]


def set_eager_mode(mode: str) -> None:
    """Sets the process's default eager mode (inside an `eager_mode` block, the block's mode stays in
    effect until it ends); ops that fused mode recorded run first. Raises ValueError for an unknown
    mode."""
    code = _code(mode)
    if _state.eager_mode() == "fused" and mode != "fused":
        _flush()
    _C.eager.set_default_mode(code)


def get_eager_mode() -> str:
    """The calling thread's eager mode."""
    return _state.eager_mode()


@contextlib.contextmanager
def eager_mode(mode: str):
    """Context manager: runs its body in `mode` on the calling thread (other threads keep theirs),
    then restores the thread's previous mode. Raises ValueError for an unknown mode."""
    code = _code(mode)
    if _state.eager_mode() == "fused" and mode != "fused":
        _flush()
    _C.eager.push_mode(code)
    try:
        yield
    finally:
        if _state.eager_mode() == "fused":
            _flush()
        _C.eager.pop_mode()


def _mode_from_env() -> str:
    if settings.flag("TPU_LAUNCH_BLOCKING"):
        return "debug"
    if settings.flag("TORCH_TPU_DEFER_AND_FUSE"):
        return "fused"
    mode = settings.get("TORCH_TPU_EAGER_MODE")
    if mode not in MODES:
        raise ValueError(f"TORCH_TPU_EAGER_MODE={mode!r}: expected one of {', '.join(MODES)}")
    return mode


_C.eager.set_default_mode(_code(_mode_from_env()))
# eager/executables.py's install_fused (at torch_tpu's import) installs fused eager's program builder
# and the runtime's host-read hook: every host read (download, synchronize, the CPU fallback) first
# runs what fused mode recorded.
