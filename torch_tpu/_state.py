"""Process-wide eager state: counters for torch_tpu.metrics and the eager mode hook."""
from __future__ import annotations

import collections
import os

from . import _C

counts: collections.Counter = collections.Counter()
last_program_text: str | None = None

# "debug" waits after every op so that its error is raised by that op (TPU_LAUNCH_BLOCKING=1);
# "strict" (default) is asynchronous like CUDA.
eager_mode = "debug" if os.environ.get("TPU_LAUNCH_BLOCKING") == "1" else \
    os.environ.get("TORCH_TPU_EAGER_MODE", "strict")


def count(name: str, n: int = 1) -> None:
    counts[name] += n


def after_execute(op_name: str, outputs) -> None:
    if eager_mode == "debug":
        try:
            _C._synchronize(-1)
        except RuntimeError as e:
            shapes = ", ".join(f"{tuple(t.shape)}:{t.dtype}" for t in outputs)
            raise RuntimeError(f"tpu op {op_name} (outputs {shapes}) failed: {e}") from None
