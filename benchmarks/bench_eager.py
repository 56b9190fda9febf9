"""Eager tpu against PyTorch's CPU eager, measured side by side in one run (ratios, not asserts).

    python benchmarks/bench_eager.py

1. host time per small eager op: a 64-element float32 add, tpu / CPU;
2. a 1024x1024 float32 matmul's rate (FLOP/s), tpu / CPU;
3. digits CNN epoch time (examples/train_digits.py, steady-state epochs), tpu / CPU.
On a machine without a TPU, "tpu" is OpenXLA's CPU plugin, so (2) compares two CPU GEMMs.
"""
from __future__ import annotations

import contextlib
import io
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
warnings.filterwarnings("ignore")
import torch_tpu  # noqa: E402


def _sync(dev):
    if dev.type == "tpu":
        torch.tpu.synchronize()


def time_small_add(dev, n=2000, repeats=5):
    a = torch.randn(64, device=dev)
    b = torch.randn(64, device=dev)
    for _ in range(50):  # warm: compile once, fill caches
        a.add(b)
    _sync(dev)
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            a.add(b)
        _sync(dev)
        best.append((time.perf_counter() - t0) / n)
    return statistics.median(best)


def matmul_rate(dev, size=1024, n=10, repeats=3):
    a = torch.randn(size, size, device=dev)
    b = torch.randn(size, size, device=dev)
    (a @ b)
    _sync(dev)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            c = a @ b
        _sync(dev)
        if dev.type == "tpu":
            c[0, 0].item()
        times.append((time.perf_counter() - t0) / n)
    return 2 * size ** 3 / statistics.median(times)


def digits_epoch(dev, epochs=3):
    import train_digits
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        r = train_digits.main(["--device", dev.type, "--epochs", str(epochs)])
    return statistics.median(r["epoch_times"][1:])


def main():
    tpu, cpu = torch.device("tpu"), torch.device("cpu")
    print(f"platform: {torch_tpu.runtime.platform()}  torch {torch.__version__}  threads {torch.get_num_threads()}")
    t_tpu, t_cpu = time_small_add(tpu), time_small_add(cpu)
    print(f"small eager op (64-elem add): tpu {t_tpu * 1e6:8.1f} us  cpu {t_cpu * 1e6:8.1f} us  ratio tpu/cpu {t_tpu / t_cpu:6.1f}")
    r_tpu, r_cpu = matmul_rate(tpu), matmul_rate(cpu)
    print(f"1024^2 f32 matmul:            tpu {r_tpu / 1e9:8.1f} GFLOP/s  cpu {r_cpu / 1e9:8.1f} GFLOP/s  ratio tpu/cpu {r_tpu / r_cpu:6.2f}")
    e_tpu, e_cpu = digits_epoch(tpu), digits_epoch(cpu)
    print(f"digits CNN epoch:             tpu {e_tpu:8.3f} s   cpu {e_cpu:8.3f} s   ratio tpu/cpu {e_tpu / e_cpu:6.2f}")


if __name__ == "__main__":
    main()
