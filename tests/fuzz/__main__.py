"""Runs seeded fuzz programs on tpu against CPU and prints every difference.

    python -m tests.fuzz --programs 10000 --modes strict,fused,compiled [--seed 0] [--kind ops|reuse]

Exit status 1 when some program differs. Modes: debug, strict and fused eager, compiled
(torch.compile(backend="tpu") per step). Kinds: ops (programs.py: random ops on small tensors of
every dtype and layout) and reuse (reuse.py: an operand updated in place, then used again, at the
sizes of real layers)."""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--programs", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0, help="first program's seed (programs are seed .. seed+N-1)")
    p.add_argument("--modes", default="strict,fused,compiled")
    p.add_argument("--kind", choices=("ops", "reuse"), default="ops")
    p.add_argument("--verbose", action="store_true", help="print each program before it runs (to find a crash)")
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch_tpu
    from . import programs, reuse
    kind = programs if a.kind == "ops" else reuse
    bad = 0
    for mode in a.modes.split(","):
        t0, found = time.perf_counter(), 0
        for seed in range(a.seed, a.seed + a.programs):
            prog = kind.generate(seed)
            if a.verbose:
                print(f"[{mode}] running {prog}", flush=True)
            cpu = kind.run(prog, "cpu")
            with torch_tpu.eager_mode("strict" if mode == "compiled" else mode):
                tpu = kind.run(prog, "tpu", compiled=mode == "compiled")
            diffs = (programs.compare(cpu, tpu, compiled=mode == "compiled") if kind is programs
                     else reuse.compare(cpu, tpu))
            if diffs:
                found += 1
                print(f"[{mode}] {prog}")
                for d in diffs:
                    print("    " + d)
        bad += found
        print(f"{mode}: {a.programs} programs, {found} differ, {time.perf_counter() - t0:.0f} s", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
