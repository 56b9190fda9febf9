"""Custom kernels (torch_tpu.pallas), side by side in one run.

    python benchmarks/bench_kernels.py

1. Host time per call of a jax_op elementwise kernel (x + y) against the native tpu op on a
   64-element tensor, strict eager, alternating rounds (target: <= 1.5x).
2. The GPT-style block training step compiled with backend "tpu": the Pallas flash-attention
   kernel (examples/kernels/flash_attention.py) inlined, against scaled_dot_product_attention.
On the CPU plugin Pallas kernels run in interpret mode: (2) measures that, not Mosaic.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "kernels"))
import torch_tpu  # noqa: E402
from tiny_models import TinyGPT  # noqa: E402
from torch_tpu.pallas import jax_op  # noqa: E402


def per_call(fn, n=2000):
    for _ in range(200):
        fn()
    torch.tpu.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.tpu.synchronize()
    return (time.perf_counter() - t0) / n


def call_overhead(rounds=7):
    add = jax_op("bench::add", lambda a, b: a + b)
    x, y = torch.randn(64, device="tpu"), torch.randn(64, device="tpu")
    native, kernel = [], []
    for _ in range(rounds):
        native.append(per_call(lambda: x + y))
        kernel.append(per_call(lambda: add(x, y)))
    return statistics.median(native), statistics.median(kernel)


def step_time(attention, steps=20):
    """Median seconds of the compiled TinyGPT training step with `attention` (None: SDPA)."""
    from flash_attention import training_step
    torch.manual_seed(0)
    step = training_step(TinyGPT(attention=attention).to("tpu"), compiled=True)
    for _ in range(5):
        step().item()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step().item()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    torch_tpu.set_eager_mode("strict")
    native, kernel = call_overhead()
    print(f"64-element add, host time per call: native {native * 1e6:.2f} us, jax_op kernel {kernel * 1e6:.2f} us, "
          f"ratio {kernel / native:.2f}x (target <= 1.5x)")
    from flash_attention import attention
    sdpa = step_time(None)
    pallas = step_time(attention)
    print(f"compiled GPT-style block training step: SDPA {sdpa * 1e3:.2f} ms, Pallas flash attention "
          f"{pallas * 1e3:.2f} ms, ratio {pallas / sdpa:.2f}x ({torch_tpu.runtime.platform()} platform)")


if __name__ == "__main__":
    main()
