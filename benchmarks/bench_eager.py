"""Eager tpu against PyTorch's CPU eager, measured side by side in one run (ratios, not asserts).

    python benchmarks/bench_eager.py

1. host time per small eager op: a 64-element float32 add, tpu (strict) / CPU, and the same add
   dispatched by jax.jit on JAX's CPU backend (the PJRT-backed anchor; when jax is installed);
   and the host CPU time per call of small ops with checks or random draws (dropout in training,
   argmax, var, uniform_) against that add's, on tpu (strict) and on CPU (target: <= 1.5);
2. a 1024x1024 float32 matmul's rate (FLOP/s), tpu / CPU;
3. digits CNN epoch time (examples/train_digits.py, steady-state epochs), tpu strict and fused / CPU;
4. a Hugging Face GPT-2 training step (small random-init config, AdamW), tpu strict and fused / CPU;
5. start-up of a fresh process with a warm compilation cache: import torch_tpu, the PJRT client's
   start, and the first tpu op's result after it.
On a machine without a TPU, "tpu" is OpenXLA's CPU plugin, so (2) compares two CPU GEMMs.
"""
from __future__ import annotations

import contextlib
import functools
import io
import os
import statistics
import subprocess
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


def time_per_call(fn, dev, n=2000, repeats=5, clock=time.perf_counter):
    """Median seconds per call of fn() over `repeats` loops of n calls. With the default clock each
    loop ends with a device synchronisation (the device's work counted where it cannot overlap the
    host's); with time.thread_time it is the calling thread's CPU time alone (the host cost of a call,
    whatever else the machine runs), the synchronisation outside the timed part."""
    for _ in range(50):  # warm: compile once, fill caches
        fn()
    _sync(dev)
    best = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(n):
            fn()
        if clock is time.perf_counter:
            _sync(dev)
        best.append((clock() - t0) / n)
        _sync(dev)
    return statistics.median(best)


def time_small_add(dev, n=2000, repeats=5):
    a = torch.randn(64, device=dev)
    b = torch.randn(64, device=dev)
    return time_per_call(lambda: a.add(b), dev, n, repeats)


def small_ops(dev):
    """Host CPU seconds per call (the calling thread's) of small ops whose lowerings carry checks or
    draw random numbers (F.dropout in training, native_dropout, argmax, var, uniform_), each with the
    64-element add's measured right after it: {name: (op, add)}."""
    x, y, m = torch.randn(64, device=dev), torch.randn(64, device=dev), torch.randn(8, 8, device=dev)
    # F.dropout is torch.dropout behind PyTorch's Python wrapper (its checks cost about 2 us on any
    # device): both are shown, the op alone and as nn.Dropout calls it.
    ops = {"F.dropout(train)": lambda: torch.nn.functional.dropout(x, 0.1, True),
           "torch.dropout(train)": lambda: torch.dropout(x, 0.1, True),
           "native_dropout": lambda: torch.native_dropout(x, 0.1, True), "argmax": lambda: m.argmax(1),
           "var": lambda: m.var(1), "uniform_": lambda: x.uniform_()}
    cpu_time = functools.partial(time_per_call, dev=dev, clock=time.thread_time)
    return {name: (cpu_time(fn), cpu_time(lambda: x.add(y))) for name, fn in ops.items()}


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


def jax_small_add(n=2000, repeats=5):
    """Host time per jax.jit dispatch of a 64-element add on JAX's CPU backend; None without jax."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    with jax.default_device(jax.devices("cpu")[0]):
        add = jax.jit(lambda a, b: a + b)
        a, b = jnp.ones(64, jnp.float32), jnp.ones(64, jnp.float32)
        for _ in range(50):
            add(a, b)
        add(a, b).block_until_ready()
        best = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(n):
                r = add(a, b)
            r.block_until_ready()
            best.append((time.perf_counter() - t0) / n)
    return statistics.median(best)


def digits_epoch(dev, epochs=5, mode="strict"):
    """Median steady-state epoch: the first two epochs compile (fused eager meets its programs for
    the first step, the last partial batch and the epoch boundary during them)."""
    import train_digits
    with torch_tpu.eager_mode(mode), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        r = train_digits.main(["--device", dev.type, "--epochs", str(epochs)])
    return statistics.median(r["epoch_times"][2:])


def gpt2_step(dev, mode="strict", warm=3, n=8):
    """Seconds per Hugging Face GPT-2 training step (2 layers, 128 wide, batch 4 x 64 tokens)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=512, n_positions=128)
    model = GPT2LMHeadModel(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 512, (4, 64)).to(dev)
    with torch_tpu.eager_mode(mode):
        times = []
        for i in range(warm + n):
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()
            if i >= warm:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


STARTUP = r"""
import time, warnings
warnings.filterwarnings("ignore")
t0 = time.perf_counter()
import torch, torch_tpu
t1 = time.perf_counter()
torch_tpu.runtime.start()
t2 = time.perf_counter()
x = torch.ones(4, device="tpu")
(x * 3 + 1).cpu()
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2)
"""


def startup():
    """(import torch + torch_tpu, PJRT client start, first op's result) seconds of a fresh process
    whose disk cache already holds the op's programs (a first run fills it)."""
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", STARTUP], capture_output=True, text=True, check=True)
    return tuple(float(v) for v in r.stdout.split())


def main():
    tpu, cpu = torch.device("tpu"), torch.device("cpu")
    print(f"platform: {torch_tpu.runtime.platform()}  torch {torch.__version__}  threads {torch.get_num_threads()}")
    with torch_tpu.eager_mode("strict"):
        t_tpu = time_small_add(tpu)
    t_cpu, t_jax = time_small_add(cpu), jax_small_add()
    jax_part = "" if t_jax is None else f"  jax.jit {t_jax * 1e6:6.1f} us  ratio tpu/jax {t_tpu / t_jax:5.2f}"
    print(f"small eager op (64-elem add): tpu {t_tpu * 1e6:8.1f} us  cpu {t_cpu * 1e6:8.1f} us  ratio tpu/cpu "
          f"{t_tpu / t_cpu:6.2f}{jax_part or '  (jax not installed)'}")
    on_cpu = small_ops(cpu)  # PyTorch's own cost of the same calls, for reference
    with torch_tpu.eager_mode("strict"):
        for name, (t_op, t_add) in small_ops(tpu).items():
            c_op, c_add = on_cpu[name]
            print(f"{name + ' host cpu:':29s} tpu {t_op * 1e6:6.1f} us  add {t_add * 1e6:5.1f} us  ratio op/add "
                  f"{t_op / t_add:5.2f}   (CPU eager: ratio {c_op / c_add:5.2f})")
    r_tpu, r_cpu = matmul_rate(tpu), matmul_rate(cpu)
    print(f"1024^2 f32 matmul:            tpu {r_tpu / 1e9:8.1f} GFLOP/s  cpu {r_cpu / 1e9:8.1f} GFLOP/s  ratio tpu/cpu {r_tpu / r_cpu:6.2f}")
    e_cpu = digits_epoch(cpu)
    for mode in ("strict", "fused"):
        e_tpu = digits_epoch(tpu, mode=mode)
        print(f"digits CNN epoch ({mode:6s}):    tpu {e_tpu:8.3f} s   cpu {e_cpu:8.3f} s   ratio tpu/cpu {e_tpu / e_cpu:6.2f}")
    g_cpu = gpt2_step(cpu)
    for mode in ("strict", "fused"):
        g_tpu = gpt2_step(tpu, mode)
        print(f"HF GPT-2 train step ({mode:6s}): tpu {g_tpu * 1e3:8.2f} ms  cpu {g_cpu * 1e3:8.2f} ms  "
              f"ratio tpu/cpu {g_tpu / g_cpu:6.2f}")
    imp, client, first = startup()
    print(f"start-up, warm cache:         import {imp:6.2f} s  client start {client:6.2f} s  first op after it "
          f"{first:6.3f} s")


if __name__ == "__main__":
    main()
