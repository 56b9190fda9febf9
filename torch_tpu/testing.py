"""Workloads that tests and benchmarks share (tests/test_soak.py runs a short version of what
benchmarks/bench_soak.py runs long), so neither imports the other through sys.path."""
from __future__ import annotations

import torch

import torch_tpu


def _rss_bytes() -> int:
    """This process's resident set size in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def cycling_training(steps: int, shapes: int, mode: str = "strict", seed: int = 0, on_cycle=None):
    """Trains a small MLP with AdamW on tpu, the batch size cycling through `shapes` values.
    Returns per finished cycle (host RSS bytes, torch.tpu.memory_allocated() bytes); on_cycle() is
    called after each."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sizes = [3 + 2 * i for i in range(shapes)]
    marks = []
    with torch_tpu.eager_mode(mode):
        for step in range(steps):
            n = sizes[step % shapes]
            x = torch.randn(n, 16, device="tpu")
            y = torch.randint(0, 4, (n,), device="tpu")
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % shapes == shapes - 1:
                loss.item()  # the cycle's work done
                marks.append((_rss_bytes(), torch.tpu.memory_allocated()))
                if on_cycle is not None:
                    on_cycle()
    return marks
