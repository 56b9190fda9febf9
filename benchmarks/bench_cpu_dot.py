"""What turning XLA:CPU's XNNPACK off costs on the CPU plugin (torch_tpu does, issue 50: its dot
reused weights packed from an earlier buffer at the same address). Side by side in one run: each
case timed in a process with torch_tpu's flags (XNNPACK off, Eigen's dot) and in one with XLA's
default (`XLA_FLAGS=--xla_cpu_use_xnnpack=true`), alternating, best of --rounds; prints ms per call
and the ratio off / on. XNNPACK's numbers are its best case: the weights stay at one address, so its
packing is reused (and its results would be stale after an in-place update).

    python benchmarks/bench_cpu_dot.py [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# (name, m, k, n): matrix products of pytorch/examples' and transformer layers' sizes
DOTS = [("mnist fc1 128x784 @ 784x400", 128, 784, 400), ("1024 square-ish 128x1024 @ 1024x1024", 128, 1024, 1024),
        ("512^3", 512, 512, 512), ("ffn 64x4096 @ 4096x1024", 64, 4096, 1024), ("decode 8x768 @ 768x3072", 8, 768, 3072)]


def _child() -> None:
    import time
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch_tpu  # noqa: F401

    def timed(fn, reps):
        for _ in range(3):
            fn().cpu()
        t = time.perf_counter()
        for _ in range(reps):
            r = fn()
        r.cpu()
        return (time.perf_counter() - t) / reps * 1e3

    torch.manual_seed(0)
    out = {}
    for name, m, k, n in DOTS:
        g, w = torch.randn(m, k, device="tpu"), torch.randn(k, n, device="tpu")
        out[name] = timed(lambda: g @ w, 30)
    x, cw = torch.randn(16, 32, 28, 28, device="tpu"), torch.randn(64, 32, 3, 3, device="tpu")
    out["conv2d 16x32x28x28, 64 3x3 filters"] = timed(lambda: torch.nn.functional.conv2d(x, cw, padding=1), 20)
    model = torch.nn.Sequential(torch.nn.Linear(784, 400), torch.nn.ReLU(), torch.nn.Linear(400, 10)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    xb, yb = torch.randn(128, 784, device="tpu"), torch.randint(0, 10, (128,), device="tpu")

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        return loss
    out["MLP 784-400-10 SGD step, batch 128"] = timed(step, 20)
    print(json.dumps(out))


def _run(env_flags: str | None) -> dict:
    env = dict(os.environ, TORCH_TPU_DISK_CACHE="0")
    if env_flags is not None:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + env_flags).strip()
    r = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return _child()
    off, on = {}, {}
    for _ in range(a.rounds):
        for best, flags in ((off, None), (on, "--xla_cpu_use_xnnpack=true")):
            for k, v in _run(flags).items():
                best[k] = min(best.get(k, v), v)
    print(f"{'case':42} {'off ms':>8} {'on ms':>8} {'off/on':>7}")
    for k in off:
        print(f"{k:42} {off[k]:8.3f} {on[k]:8.3f} {off[k] / on[k]:7.2f}")


if __name__ == "__main__":
    main()
