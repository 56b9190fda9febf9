"""Long jobs whose shapes vary keep host and device memory flat: every in-memory cache is a bounded
LRU (csrc/runtime/lru_cache.h), reported by torch_tpu.metrics.host_caches(). The CI budget is a few
hundred steps; benchmarks/bench_soak.py runs the 5,000-step version."""
import gc

import pytest
import torch

import torch_tpu
from torch_tpu.dynamo import backend


def _rss_bytes() -> int:
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


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.slow
def test_cycling_batch_shapes_keep_host_and_device_memory_flat(mode):
    marks = cycling_training(steps=6 * 8, shapes=8, mode=mode)
    (rss0, dev0), (rss1, dev1) = marks[0], marks[-1]
    assert dev1 == dev0, marks  # parameters and AdamW's state: the same tensors every cycle
    assert rss1 <= rss0 * 1.10, [(r / 2**20, d) for r, d in marks]


def test_every_cache_is_bounded_and_counted():
    caches = torch_tpu.metrics.host_caches()
    for name in ("plans", "executables in memory", "scalar operand buffers", "fused programs"):
        s = caches[name]
        assert 0 <= s["entries"] <= s["capacity"], (name, s)
        assert s["max_bytes"] == 0 or 0 <= s["bytes"] <= s["max_bytes"], (name, s)
    for name in ("plans", "executables in memory", "fused programs"):  # they hold programs
        assert caches[name]["max_bytes"] == 1 << 30, (name, caches[name])
    if caches["executables in memory"]["entries"]:  # each program counted by what it holds
        assert caches["executables in memory"]["bytes"] > 0


def test_a_python_lru_cache_bounded_by_bytes():
    c = torch_tpu._C.runtime.LruCache("test python bytes", 10, 100)
    for i in range(4):
        c.put(i, f"value {i}", bytes=40)
    assert len(c) == 2 and c.get(0) is None and c.get(1) is None and c.get(3) == "value 3"
    s = torch_tpu.metrics.host_caches()["test python bytes"]
    assert (s["entries"], s["bytes"], s["max_bytes"], s["evictions"]) == (2, 80, 100, 2), s


def test_an_executable_says_what_it_holds():
    exe = torch_tpu.runtime.compile(
        "func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %0 = stablehlo.add %a, %a : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}\n", "bytes probe")
    assert exe.held_bytes > 0


def test_a_graph_with_symbolic_shapes_keeps_its_most_recent_programs(monkeypatch):
    # Past PER_SHAPE_PROGRAMS a graph's least recently used shape goes; coming back re-traces it.
    monkeypatch.setattr(backend, "PER_SHAPE_PROGRAMS", 3)
    monkeypatch.setenv("TORCH_TPU_SHAPE_BUCKETS", "off")  # one program per shape (buckets: test_shape_buckets)
    torch._dynamo.reset()
    gc.collect()  # earlier tests' graph caches go now, not while this one counts entries
    torch_tpu.metrics.reset()  # (other graphs' caches still alive keep their entries, not their counts)
    before = torch_tpu.metrics.host_caches().get("compiled graph shapes", {"entries": 0, "capacity": 0})

    @torch.compile(backend="tpu", dynamic=True)
    def f(x):
        return (x * 2 + 1).sum(0)

    for n in [2, 3, 4, 5, 6, 2, 3]:
        x = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
        torch.testing.assert_close(f(x.to("tpu")).cpu(), (x * 2 + 1).sum(0))
    s = torch_tpu.metrics.host_caches()["compiled graph shapes"]
    assert s["entries"] - before["entries"] == 3 and s["capacity"] - before["capacity"] == 3, (before, s)
    assert s["evictions"] == 4 and s["misses"] == 7 and s["hits"] == 0, s
    torch._dynamo.reset()
