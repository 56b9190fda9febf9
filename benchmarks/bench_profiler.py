"""What torch.profiler costs on tpu, and what the device tracing costs when no profiler runs.

    python benchmarks/bench_profiler.py [--baseline /path/to/other/torch_tpu/checkout]

1. host time per small eager op (a 64-element float32 add, strict mode): without a profiler, under
   profile(activities=[CPU]) and under profile(activities=[CPU, PrivateUse1]) (every execution
   recorded as a device event), measured in this process;
2. with --baseline: the no-profiler time of (1) in fresh processes alternating between this checkout
   and the baseline one (built, e.g. a worktree of the commit before the profiler), so the launch
   path's check for an active profiler is compared against a build without it, side by side.
Times are minima over repeats and processes: on a shared machine other work only ever adds time,
so the minimum is the steadiest estimate of the code's own cost. Ratios, not asserts.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import warnings

warnings.filterwarnings("ignore")


def per_op_seconds(profiled=None, n=2000, repeats=7):
    """Least host seconds per a.add(b) on tpu over `repeats` loops of n, optionally inside
    torch.profiler.profile(profiled)."""
    import contextlib

    import torch
    from torch.profiler import profile

    a = torch.randn(64, device="tpu")
    b = torch.randn(64, device="tpu")
    for _ in range(50):  # compile once, fill the caches
        a.add(b)
    torch.tpu.synchronize()
    times = []
    for _ in range(repeats):
        ctx = profile(activities=profiled) if profiled else contextlib.nullcontext()
        with ctx:
            t0 = time.perf_counter()
            for _ in range(n):
                a.add(b)
            torch.tpu.synchronize()
            times.append((time.perf_counter() - t0) / n)
    return min(times)


def child_main():
    import torch_tpu

    with torch_tpu.eager_mode("strict"):
        print(per_op_seconds())


def side_by_side(here, baseline, rounds=7):
    """(us/op here, us/op baseline), each the least over `rounds` fresh processes, alternating."""
    out = {here: [], baseline: []}
    for _ in range(rounds):
        for root in (here, baseline):
            env = {**os.environ, "PYTHONPATH": root, "TORCH_TPU_EAGER_MODE": "strict"}
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env=env, capture_output=True,
                               text=True, timeout=600, cwd=root)
            if r.returncode != 0:
                raise RuntimeError(f"benchmark child under {root} failed:\n{r.stderr[-3000:]}")
            out[root].append(float(r.stdout.strip().splitlines()[-1]))
    return min(out[here]) * 1e6, min(out[baseline]) * 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--baseline", help="a torch_tpu checkout (with its _C built) to compare the no-profiler time with")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child_main()
    import torch
    import torch_tpu
    from torch.profiler import ProfilerActivity

    print(f"platform: {torch_tpu.runtime.platform()}  torch {torch.__version__}")
    with torch_tpu.eager_mode("strict"):
        none = per_op_seconds()
        cpu = per_op_seconds([ProfilerActivity.CPU])
        both = per_op_seconds([ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])
    print(f"small eager op (64-elem add), host time per op:  no profiler {none * 1e6:7.2f} us   "
          f"profile(CPU) {cpu * 1e6:7.2f} us ({cpu / none:4.2f}x)   "
          f"profile(CPU, PrivateUse1) {both * 1e6:7.2f} us ({both / none:4.2f}x)")
    if args.baseline:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        t_here, t_base = side_by_side(here, os.path.abspath(args.baseline))
        print(f"no profiler, fresh processes alternating:  this checkout {t_here:7.2f} us   "
              f"baseline {t_base:7.2f} us   ratio {t_here / t_base:5.3f}")


if __name__ == "__main__":
    main()
