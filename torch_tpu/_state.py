"""Process-wide eager state: counters for torch_tpu.metrics and the current eager mode."""
from __future__ import annotations

import collections

counts: collections.Counter = collections.Counter()
last_program_text: str | None = None

# The eager mode ("debug", "strict", "fused"); set from the environment by torch_tpu.eager.
eager_mode = "strict"


def count(name: str, n: int = 1) -> None:
    counts[name] += n
