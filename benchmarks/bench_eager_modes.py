"""Debug, strict and fused eager side by side in one run, and the persistent cache's warm start.

    python benchmarks/bench_eager_modes.py

Prints per workload the time per step in each mode and the ratios fused/strict (speed-up) and
debug/strict (cost), and the same step compiled whole (torch.compile(backend="tpu"): one program
per step, the most fused eager could reach); then the first step of a fresh process with a cold and
with a warm disk cache. Each step ends with a host read (loss.item()), as training loops that log do.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
sys.path.insert(0, EXAMPLES)
warnings.filterwarnings("ignore")
import torch_tpu  # noqa: E402
from tiny_models import MLP, TinyGPT  # noqa: E402


def _steps(compute, compiled):
    """step() -> loss.item() around `compute` (run eagerly, or compiled whole with backend "tpu")."""
    fn = torch.compile(compute, backend="tpu") if compiled else compute

    def step():
        return fn().item()
    return step


def mlp_step(compiled=False):
    torch.manual_seed(0)
    model = MLP().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64, device="tpu"), torch.randint(0, 10, (32,), device="tpu")

    def compute():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    return _steps(compute, compiled)


def gpt_step(compiled=False):
    torch.manual_seed(0)
    model = TinyGPT().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 64, (8, 17), device="tpu")

    def compute():
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    return _steps(compute, compiled)


def chain_step(compiled=False):
    x = torch.randn(128, 128, device="tpu")

    def compute():
        y = x
        for i in range(50):
            y = torch.tanh(y) if i % 3 == 0 else (y * 1.001 if i % 3 == 1 else y + 0.01)
        return y.sum()
    return _steps(compute, compiled)


def time_step(make, mode, warm=8, n=20):
    """Median seconds per step in eager `mode`, or compiled whole ("compiled", in strict mode)."""
    torch_tpu.set_eager_mode("strict" if mode == "compiled" else mode)
    step = make(compiled=mode == "compiled")
    for _ in range(warm):
        step()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    torch_tpu.set_eager_mode("strict")
    return statistics.median(times)


COLD = r"""
import sys, time, warnings
warnings.filterwarnings("ignore")
dev = sys.argv[1]
t0 = time.perf_counter()
import torch, torch.nn.functional as F
t1 = time.perf_counter()
if dev == "tpu":
    import torch_tpu
    torch_tpu.runtime.start()
t2 = time.perf_counter()
sys.path.insert(0, %r)
from tiny_models import TinyGPT
torch.manual_seed(0)
model = TinyGPT().to(dev)
idx = torch.randint(0, 64, (8, 17), device=dev)
logits = model(idx[:, :-1])
loss = F.cross_entropy(logits.reshape(-1, 64), idx[:, 1:].reshape(-1))
loss.backward()
loss.item()
t3 = time.perf_counter()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
opt.step()
model.emb.weight.sum().item()
t4 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3)
""" % EXAMPLES


def first_step(cache_dir, dev="tpu"):
    """(import torch, PJRT client start, first forward + backward to its loss, first AdamW step)
    seconds in a new process on `dev`, with the disk cache in `cache_dir`."""
    # Only this directory: a per-host or shared tier set in the environment would warm the cold run.
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_TPU_TIER2_COMPILATION_CACHE", "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT")}
    env["TORCH_TPU_CACHE_DIR"] = cache_dir
    r = subprocess.run([sys.executable, "-c", COLD, dev], capture_output=True, text=True, env=env, check=True)
    return tuple(float(v) for v in r.stdout.strip().splitlines()[-1].split())


def main():
    print(f"platform: {torch_tpu.runtime.platform()}")
    for name, make in (("MLP training step", mlp_step), ("GPT-style block training step", gpt_step),
                       ("50-op elementwise chain", chain_step)):
        t = {m: time_step(make, m) for m in ("strict", "fused", "debug", "compiled")}
        print(f"{name:32s} strict {t['strict'] * 1e3:7.2f} ms  fused {t['fused'] * 1e3:7.2f} ms  "
              f"debug {t['debug'] * 1e3:7.2f} ms  compiled {t['compiled'] * 1e3:7.2f} ms  | "
              f"fused speed-up {t['strict'] / t['fused']:5.2f}x  (compiled: {t['strict'] / t['compiled']:5.2f}x)  "
              f"debug cost {t['debug'] / t['strict']:5.2f}x")
    # A new process's first GPT step: cold disk cache, warm (the executables and the meta memo on
    # disk: eager/meta_memo.py), and the same script on CPU. The optimizer's first step is apart:
    # torch.optim imports torch._dynamo on first use (about a second), on CPU as on tpu.
    with tempfile.TemporaryDirectory() as d:
        runs = {"cold": first_step(d), "warm": first_step(d), "warm again": first_step(d)}
    runs["cpu"] = first_step(d, "cpu")
    for what, (imp, client, fwd_bwd, opt) in runs.items():
        print(f"new process, {what:10s}: import torch {imp:5.2f} s  client start {client:5.3f} s  "
              f"first forward+backward {fwd_bwd:6.3f} s  first AdamW step {opt:5.2f} s")
    warm = min(runs["warm"][2], runs["warm again"][2])
    print(f"warm start beyond the client's start: {warm:.3f} s (target 0.3 s); "
          f"cold/warm first step {runs['cold'][2] / warm:.1f}x")


if __name__ == "__main__":
    main()
