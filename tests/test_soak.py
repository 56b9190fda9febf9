"""Long jobs whose shapes vary keep host and device memory flat: every in-memory cache is a bounded
LRU (csrc/runtime/lru_cache.h), reported by torch_tpu.metrics.host_caches(). The CI budget is a few
hundred steps; benchmarks/bench_soak.py runs the 5,000-step version."""
import gc

import pytest
import torch

import torch_tpu
from torch_tpu.dynamo import backend
from torch_tpu.testing import cycling_training


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.slow
def test_cycling_batch_shapes_keep_host_and_device_memory_flat(mode):
    marks = cycling_training(steps=7 * 8, shapes=8, mode=mode)
    assert marks[-1][1] == marks[0][1], marks  # parameters and AdamW's state: the same tensors every cycle
    # Host memory from the second cycle on: in a pytest worker that had run other test files first,
    # fused eager's second cycle once took 139 MB more (1190 -> 1328 MB) and then stayed flat to the
    # megabyte for four cycles: a one-time growth, not a per-cycle leak, which the five cycles after
    # it would show. Alone (a fresh process), every cycle is flat from the first (725-726 MB).
    rss1, rss_end = marks[1][0], marks[-1][0]
    assert rss_end <= rss1 * 1.10, [(r / 2**20, d) for r, d in marks]


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
