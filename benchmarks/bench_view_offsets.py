"""Views at many offsets in strict eager (issue 49): programs compiled by loops over rows and columns,
their first pass against CPU eager, and what a runtime offset costs a call against a baked one.

    python benchmarks/bench_view_offsets.py [--calls 2000]

A view of a storage at offset 0 is baked into its program (a static slice); at any other offset the
offset is an int64 operand (dynamic_slice / dynamic_update_slice), so `t[i]` for every i >= 1 is one
program. Part 2 times the same op on a view at offset 0 (baked) and at offset 5 (operand), side by
side, per call (host dispatch and device time, synchronized at the end), best of 5.
"""
from __future__ import annotations

import argparse
import os
import time
import warnings

# Programs compiled here, not loaded from an earlier run's disk cache (set before `import torch`,
# which loads torch_tpu).
os.environ.setdefault("TORCH_TPU_DISK_CACHE", "0")
import torch  # noqa: E402

warnings.filterwarnings("ignore")
import torch_tpu  # noqa: E402

TPU = torch.device("tpu")


def _compiles():
    return torch_tpu.metrics.counters()["compiles"]


def _first_pass(name, make, body, n):
    """(programs compiled, tpu seconds, CPU seconds) of `body(t, i)` for i in 1..n on a fresh tensor."""
    times = {}
    for dev in ("cpu", TPU):
        t = make(dev)
        c0, t0 = _compiles(), time.perf_counter()
        for i in range(1, n + 1):
            r = body(t, i)
        r.cpu()
        times[dev] = time.perf_counter() - t0
        compiled = _compiles() - c0
    print(f"{name:46} {compiled:9d} {times[TPU] * 1e3:9.1f} {times['cpu'] * 1e3:9.1f} {times[TPU] / times['cpu']:7.1f}")


def _per_call(fn, calls):
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            r = fn()
        r.cpu()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000)
    a = p.parse_args()
    torch.manual_seed(0)
    print("1. first pass over n offsets (strict eager)")
    print(f"{'loop':46} {'programs':>9} {'tpu ms':>9} {'CPU ms':>9} {'tpu/CPU':>7}")
    rows = lambda d: torch.randn(64, 32, device=d)  # noqa: E731
    _first_pass("t[i] * 2 + 1, 20 rows", rows, lambda t, i: t[i] * 2 + 1, 20)
    _first_pass("t[:, i].sum(), 20 columns", rows, lambda t, i: t[:, i].sum(), 20)
    _first_pass("t[i].mul_(0.5) in place, 20 rows", rows, lambda t, i: t[i].mul_(0.5), 20)
    _first_pass("t[i:i+4, ::2].exp(), 20 boxes", rows, lambda t, i: t[i:i + 4, ::2].exp(), 20)

    print("\n2. a call on a view at offset 0 (baked) and at offset 5 (runtime operand), us per call")
    print(f"{'op':46} {'baked':>9} {'operand':>9} {'ratio':>7}")
    cases = [("row of 64x32: t[i] * 2", (64, 32), lambda t, i: t[i] * 2),
             ("row of 1024x1024: t[i].sum()", (1024, 1024), lambda t, i: t[i].sum()),
             ("column of 1024x1024: t[:, i].sum()", (1024, 1024), lambda t, i: t[:, i].sum()),
             ("rows of 1024x1024: t[i:i+512] + 1", (1024, 1024), lambda t, i: t[i:i + 512] + 1),
             ("in place t[i:i+512].mul_(1.0)", (1024, 1024), lambda t, i: t[i:i + 512].mul_(1.0))]
    for name, shape, fn in cases:
        t = torch.randn(*shape, device=TPU)
        baked = _per_call(lambda: fn(t, 0), a.calls)
        operand = _per_call(lambda: fn(t, 5), a.calls)
        print(f"{name:46} {baked:9.1f} {operand:9.1f} {operand / baked:7.2f}")


if __name__ == "__main__":
    main()
