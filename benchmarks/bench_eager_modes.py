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
import time, warnings
warnings.filterwarnings("ignore")
t0 = time.perf_counter()
import torch, torch_tpu, torch.nn.functional as F
import sys; sys.path.insert(0, %r)
from tiny_models import TinyGPT
torch.manual_seed(0)
model = TinyGPT().to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
idx = torch.randint(0, 64, (8, 17), device="tpu")
t1 = time.perf_counter()
logits = model(idx[:, :-1])
loss = F.cross_entropy(logits.reshape(-1, 64), idx[:, 1:].reshape(-1))
loss.backward(); opt.step(); loss.item()
print(time.perf_counter() - t1)
""" % EXAMPLES


def first_step_seconds(cache_dir):
    # Only this directory: a per-host or shared tier set in the environment would warm the cold run.
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_TPU_TIER2_COMPILATION_CACHE", "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT")}
    env["TORCH_TPU_CACHE_DIR"] = cache_dir
    r = subprocess.run([sys.executable, "-c", COLD], capture_output=True, text=True, env=env, check=True)
    return float(r.stdout.strip().splitlines()[-1])


def main():
    print(f"platform: {torch_tpu.runtime.platform()}")
    for name, make in (("MLP training step", mlp_step), ("GPT-style block training step", gpt_step),
                       ("50-op elementwise chain", chain_step)):
        t = {m: time_step(make, m) for m in ("strict", "fused", "debug", "compiled")}
        print(f"{name:32s} strict {t['strict'] * 1e3:7.2f} ms  fused {t['fused'] * 1e3:7.2f} ms  "
              f"debug {t['debug'] * 1e3:7.2f} ms  compiled {t['compiled'] * 1e3:7.2f} ms  | "
              f"fused speed-up {t['strict'] / t['fused']:5.2f}x  (compiled: {t['strict'] / t['compiled']:5.2f}x)  "
              f"debug cost {t['debug'] / t['strict']:5.2f}x")
    with tempfile.TemporaryDirectory() as d:
        cold = first_step_seconds(d)
        warm = first_step_seconds(d)
    print(f"first GPT step of a new process: cold cache {cold:.2f} s, warm disk cache {warm:.2f} s, "
          f"speed-up {cold / warm:.1f}x")


if __name__ == "__main__":
    main()
