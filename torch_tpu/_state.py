"""Process-wide eager state: counters for torch_tpu.metrics, and the calling thread's eager mode."""
from __future__ import annotations

import collections

from . import _C

counts: collections.Counter = collections.Counter()
last_program_text: str | None = None

# Eager modes, in the order of their C++ codes (csrc/eager/mode.h).
MODES = ("debug", "strict", "fused")


def eager_mode() -> str:
    """The calling thread's eager mode: "debug", "strict" or "fused" (torch_tpu/eager.py)."""
    return MODES[_C._eager_mode()]


def count(name: str, n: int = 1) -> None:
    counts[name] += n
