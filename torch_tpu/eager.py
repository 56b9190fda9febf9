"""Choosing how eager ops run on the tpu device: "debug", "strict" (default) or "fused".

    torch_tpu.set_eager_mode("fused")
    with torch_tpu.eager_mode("debug"): ...

Environment (read at import): TORCH_TPU_EAGER_MODE=debug|strict|fused; the switches of Google's
TorchTPU are honoured too: TPU_LAUNCH_BLOCKING=1 means debug, TORCH_TPU_DEFER_AND_FUSE=1 fused.
See torch_tpu/aten/launch.py for what each mode does.
"""
from __future__ import annotations

import contextlib
import os

from . import _C, _state

MODES = ("debug", "strict", "fused")


def _flush():
    from .aten import fused
    fused.flush()


def set_eager_mode(mode: str) -> None:
    """Switches the eager mode; ops recorded by fused mode run first. Raises ValueError for an
    unknown mode."""
    if mode not in MODES:
        raise ValueError(f"unknown tpu eager mode {mode!r}: expected one of {', '.join(MODES)}")
    if _state.eager_mode == "fused" and mode != "fused":
        _flush()
    _state.eager_mode = mode


def get_eager_mode() -> str:
    return _state.eager_mode


@contextlib.contextmanager
def eager_mode(mode: str):
    """Context manager: runs its body in `mode`, then restores the previous mode."""
    previous = get_eager_mode()
    set_eager_mode(mode)
    try:
        yield
    finally:
        set_eager_mode(previous)


def _mode_from_env() -> str:
    if os.environ.get("TPU_LAUNCH_BLOCKING") == "1":
        return "debug"
    if os.environ.get("TORCH_TPU_DEFER_AND_FUSE") == "1":
        return "fused"
    mode = os.environ.get("TORCH_TPU_EAGER_MODE", "strict")
    if mode not in MODES:
        raise ValueError(f"TORCH_TPU_EAGER_MODE={mode!r}: expected one of {', '.join(MODES)}")
    return mode


_state.eager_mode = _mode_from_env()
# Every host read (download, synchronize, the CPU fallback) first runs what fused mode recorded.
_C._set_host_read_hook(_flush)
