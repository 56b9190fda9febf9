"""Soak: a training loop whose batch shape cycles through many values keeps host and device memory
flat (issue target: after 5,000 steps with 50 cycling shapes, host RSS and
torch.tpu.memory_allocated() within 10% of their values after the first cycle).

    python benchmarks/bench_soak.py [--steps 5000] [--shapes 50] [--mode strict|fused]

Prints both memories after the first cycle and at the end, their ratios, the time per step of the
first cycle (compiling) and of the rest, and every in-memory cache's counters
(torch_tpu.metrics.host_caches()). tests/test_soak.py runs a short version in CI.
"""
from __future__ import annotations

import argparse
import time
import warnings

warnings.filterwarnings("ignore")
import torch_tpu  # noqa: E402
from torch_tpu.testing import cycling_training  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--shapes", type=int, default=50)
    p.add_argument("--mode", default="strict")
    a = p.parse_args()
    t0 = time.perf_counter()
    times = []
    marks = cycling_training(a.steps, a.shapes, a.mode, on_cycle=lambda: times.append(time.perf_counter()))
    (rss0, dev0), (rss1, dev1) = marks[0], marks[-1]
    first = times[0] - t0
    rest = (times[-1] - times[0]) / max(1, a.steps - a.shapes)
    print(f"{a.steps} steps, {a.shapes} cycling batch shapes, {a.mode} eager")
    print(f"host RSS:      after cycle 1 {rss0 / 2**20:8.1f} MiB  at the end {rss1 / 2**20:8.1f} MiB  "
          f"ratio {rss1 / rss0:5.3f}")
    print(f"tpu allocated: after cycle 1 {dev0 / 2**20:8.3f} MiB  at the end {dev1 / 2**20:8.3f} MiB  "
          f"ratio {dev1 / dev0:5.3f}")
    print(f"first cycle {first:7.2f} s ({first / a.shapes * 1e3:.1f} ms/step); later steps {rest * 1e3:.2f} ms/step")
    for name, s in sorted(torch_tpu.metrics.host_caches().items()):
        print(f"  {name:24s} " + "  ".join(f"{k} {v}" for k, v in s.items()))


if __name__ == "__main__":
    main()
