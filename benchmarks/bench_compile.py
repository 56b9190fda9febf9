"""torch.compile(backend="tpu") against strict eager tpu and Inductor on CPU, side by side (ratios).

    python benchmarks/bench_compile.py [--steps 30]

1. a whole training step (forward, backward, AdamW step) of the GPT-style decoder block and of the
   digits CNN: compiled tpu (with torch._dynamo.config.trace_autograd_ops, forward and backward in
   one graph; and with Dynamo's defaults, the backward a second graph), strict eager tpu, torch.compile(backend="inductor") on CPU (skipped
   when Inductor cannot build, e.g. no C++ compiler), eager CPU;
2. host time to lower a ~1000-node ATen graph to StableHLO text (XLA's compile time excluded).
On a machine without a TPU, "tpu" is OpenXLA's CPU plugin.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore")
import torch_tpu  # noqa: E402
from tiny_models import TinyGPT  # noqa: E402
from train_digits import DigitsCNN  # noqa: E402


def _sync(dev):
    if dev.type == "tpu":
        torch.tpu.synchronize()


def _gpt_targets():
    g = torch.Generator().manual_seed(0)
    torch.randint(0, 64, (8, 16), generator=g)
    return torch.randint(0, 64, (8 * 16,), generator=g)


def _digits_targets():
    g = torch.Generator().manual_seed(0)
    torch.rand(64, 1, 8, 8, generator=g)
    return torch.randint(0, 10, (64,), generator=g)


def gpt_case(dev):
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 64, (8, 16), generator=g).to(dev)
    tgt = torch.randint(0, 64, (8 * 16,), generator=g).to(dev)
    return TinyGPT, idx, lambda out: F.cross_entropy(out.flatten(0, 1), tgt)


def digits_case(dev):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, 1, 8, 8, generator=g).to(dev)
    y = torch.randint(0, 10, (64,), generator=g).to(dev)
    return DigitsCNN, x, lambda out: F.cross_entropy(out, y)


def time_step(case, dev, backend, steps, trace_backward=False):
    """Seconds per training step (median of 3 timed runs of `steps` steps, after warm-up).
    trace_backward: compile with torch._dynamo.config.trace_autograd_ops, which traces
    loss.backward() into the graph (forward and backward: one graph)."""
    make, x, loss_fn = case(dev)
    torch.manual_seed(0)
    model = make().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x):
        opt.zero_grad()
        loss = loss_fn(model(x))
        loss.backward()
        loss = loss.detach()  # optimizer.step() breaks the graph: what crosses it must not need grad
        opt.step()
        return loss

    torch._dynamo.reset()
    with torch._dynamo.config.patch(trace_autograd_ops=trace_backward):
        fn = step if backend is None else torch.compile(step, backend=backend)
        for _ in range(3):
            fn(x)
        _sync(dev)
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(steps):
                loss = fn(x)
            loss.item()
            runs.append((time.perf_counter() - t0) / steps)
    return statistics.median(runs)


def lower_time(n_nodes=1000):
    """Host seconds to lower a graph of about n_nodes ATen nodes (an elementwise + matmul chain)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch_tpu.dynamo.lower_graph import GraphProgram

    def f(x, w):
        for i in range(n_nodes // 4):
            x = torch.tanh(x @ w) * 0.5 + x
        return x

    args = (torch.randn(16, 16, device="tpu"), torch.randn(16, 16, device="tpu"))
    gm = make_fx(f, tracing_mode="fake")(*args)
    nodes = len(gm.graph.nodes)
    prog = GraphProgram.__new__(GraphProgram)
    prog.name = "bench"
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        prog._lower(gm)
        best = min(best, time.perf_counter() - t0)
    return nodes, best, len(prog.text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args(argv)
    tpu, cpu = torch.device("tpu"), torch.device("cpu")
    print(f"platform: {torch_tpu.runtime.platform()}, torch {torch.__version__}, {os.cpu_count()} CPUs")
    for name, case in (("GPT-style decoder block", gpt_case), ("digits CNN (batch 64)", digits_case)):
        t_comp = time_step(case, tpu, "tpu", args.steps, trace_backward=True)
        t_split = time_step(case, tpu, "tpu", args.steps)
        t_eager = time_step(case, tpu, None, args.steps)
        t_cpu = time_step(case, cpu, None, args.steps)
        try:
            t_ind = time_step(case, cpu, "inductor", args.steps)
        except Exception as e:  # noqa: BLE001  (no C++ compiler, ...)
            t_ind = None
            why = str(e).strip().splitlines()[0][:100] if str(e).strip() else type(e).__name__
        print(f"\n{name}: training step (forward + backward + AdamW)")
        print(f"  compiled tpu          {t_comp * 1e3:8.2f} ms   (trace_autograd_ops: forward+backward one graph)")
        print(f"  compiled tpu, split   {t_split * 1e3:8.2f} ms   (Dynamo defaults: backward graph run by autograd)")
        print(f"  strict eager tpu      {t_eager * 1e3:8.2f} ms   compiled is {t_eager / t_comp:5.1f}x faster")
        if t_ind is not None:
            print(f"  inductor CPU          {t_ind * 1e3:8.2f} ms   compiled tpu / inductor = {t_comp / t_ind:5.2f}")
        else:
            print(f"  inductor CPU          skipped ({why})")
        print(f"  eager CPU             {t_cpu * 1e3:8.2f} ms   compiled tpu / eager CPU = {t_comp / t_cpu:5.2f}")
        try:
            import jax_reference
        except ImportError:
            print("  jax.jit               skipped (pip install jax to compare)")
        else:
            make, x, _ = case(cpu)
            torch.manual_seed(0)
            if case is gpt_case:
                t_jax = jax_reference.gpt_step_seconds(make(), x, _gpt_targets(), args.steps)
            else:
                t_jax = jax_reference.digits_step_seconds(make(), x, _digits_targets(), args.steps)
            print(f"  jax.jit (XLA CPU)     {t_jax * 1e3:8.2f} ms   compiled tpu / jax.jit = {t_comp / t_jax:5.2f}"
                  f" (target <= 1.1)")
    nodes, secs, chars = lower_time()
    print(f"\nlowering a {nodes}-node graph to StableHLO ({chars // 1024} KiB of text): {secs * 1e3:.1f} ms "
          f"(target < 1000 ms)")


if __name__ == "__main__":
    main()
