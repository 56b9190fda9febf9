"""torch.profiler on tpu: each device execution (eager op, fused run, compiled graph) is a PrivateUse1
event with its device time, linked to the op that launched it; each compile (and disk-cache load) is
a span in the CPU timeline; both reach key_averages() and export_chrome_trace()."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import torch_tpu
from torch_tpu import _C

BOTH = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


@pytest.fixture
def cold_cache(tmp_path):
    """An empty disk tier for the test: a program this process has not compiled yet is compiled, not
    loaded (whatever earlier runs left in the user's cache)."""
    torch_tpu.compile_cache.configure(str(tmp_path / "xla"))
    yield
    torch_tpu.compile_cache.configure()


def run_profiled(fn, activities=BOTH, mode="strict"):
    """The profile of fn() run in eager `mode` (per-op events need strict, whatever TORCH_TPU_EAGER_MODE says)."""
    with torch_tpu.eager_mode(mode), profile(activities=activities) as p:
        fn()
    return p


def device_events(p):
    return [e for e in p.events() if e.device_type == DeviceType.PrivateUse1]


def averages(p, device_type):
    return {a.key: a for a in p.key_averages() if a.device_type == device_type}


def chrome(p, tmp_path):
    path = tmp_path / "trace.json"
    p.export_chrome_trace(str(path))
    return json.loads(path.read_text())["traceEvents"]


def test_strict_eager_ops_are_device_events(tmp_path):
    x = torch.randn(6, 10, device="tpu")

    def step():
        (x * 2 + 1).sin().cpu()

    with torch_tpu.eager_mode("strict"):
        step()  # compiled here: the profile below sees executions only
    p = run_profiled(step)
    dev = averages(p, DeviceType.PrivateUse1)
    # Device rows are named by program (op and operands, as CUDA's by kernel), host rows by op.
    programs = ("aten::mul.Tensor<Float[6,10],cpu Long[]>", "aten::add.Tensor<Float[6,10],cpu Long[]>",
                "aten::sin<Float[6,10]>")
    for name in programs:
        assert name in dev, sorted(dev)
        assert dev[name].count == 1
        assert dev[name].self_device_time_total > 0
    # Each execution is linked to the op that launched it: the CPU op carries its device time.
    cpu = averages(p, DeviceType.CPU)
    for op in ("aten::mul", "aten::add", "aten::sin"):
        assert cpu[op].device_time_total > 0, op
    assert cpu["aten::_to_copy"].device_time_total == 0  # a download is not an execution
    assert not any(k.startswith("compile ") for k in cpu)  # nothing compiled this time

    events = chrome(p, tmp_path)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert sorted(e["name"] for e in kernels) == sorted(programs)
    cpu_ops = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op"}
    for k in kernels:
        assert k["dur"] > 0 and k["pid"] == 0  # the row of tpu:0
        launcher = cpu_ops[k["args"]["External id"]]
        assert k["args"]["ops"] == k["name"].split("<")[0]  # the op, as the trace's detail
        assert launcher["name"] == k["name"].split(".")[0].split("<")[0]
        assert k["ts"] >= launcher["ts"]  # it ran after its op queued it
    names = {(e["pid"], e["args"]["name"]) for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert (0, "tpu:0") in names


def test_backward_executions_are_linked_to_backward_ops():
    # The autograd engine runs tpu backward ops on its own device thread: their executions are
    # linked there too.
    w = torch.randn(8, 4, device="tpu", requires_grad=True)
    x = torch.randn(3, 8, device="tpu")

    def step():
        (x @ w).tanh().sum().backward()
        w.grad.sum().item()

    with torch_tpu.eager_mode("strict"):
        step()
    p = run_profiled(step)
    assert "aten::tanh_backward<Float[3,4],Float[3,4]>" in averages(p, DeviceType.PrivateUse1)
    cpu = averages(p, DeviceType.CPU)
    assert cpu["TanhBackward0"].device_time_total > 0
    assert cpu["aten::tanh_backward"].device_time_total > 0


@pytest.mark.parametrize("threads", [0, 2])
def test_compile_shows_the_first_time_only(cold_cache, threads):
    """A compile is a span the first time only; compiled on the calling thread (TORCH_TPU_COMPILE_THREADS=0)
    it is nested in the op that needed it, on the compile pool it is recorded from the pool's thread."""
    x = torch.randn(3, 7, 11 + threads, device="tpu")  # a shape no other test compiles

    def step():
        torch.atan(x).cpu()

    _C.runtime.set_compile_threads(threads)
    try:
        first = averages(run_profiled(step), DeviceType.CPU)
    finally:
        _C.runtime.set_compile_threads(torch_tpu.runtime._compile_threads())
    assert "compile aten::atan" in first, sorted(first)
    span = first["compile aten::atan"]
    assert span.count == 1 and span.cpu_time_total > 0
    if threads == 0:
        assert first["aten::atan"].cpu_time_total >= span.cpu_time_total  # nested in the op that needed it
    again = averages(run_profiled(step), DeviceType.CPU)
    assert not any(k.startswith(("compile ", "load ")) for k in again), sorted(again)


def test_fused_run_is_one_device_event(tmp_path):
    x = torch.randn(4, 9, device="tpu")

    def step():
        ((x * 3 + 1).cos() - x).cpu()

    with torch_tpu.eager_mode("fused"):
        step()
    p = run_profiled(step, mode="fused")
    dev = averages(p, DeviceType.PrivateUse1)
    assert dev and all(re.fullmatch(r"fused run \(\d+ ops\)", k) for k in dev), sorted(dev)  # no op ran alone
    assert all(a.self_device_time_total > 0 for a in dev.values())
    kernels = [e for e in chrome(p, tmp_path) if e.get("cat") == "kernel"]
    assert sum(int(re.search(r"\d+", k["name"]).group()) for k in kernels) == 4
    assert all(k["dur"] > 0 for k in kernels)
    ops = " ".join(k["args"]["ops"] for k in kernels)  # what each run fused
    for op in ("aten::mul.Tensor", "aten::add.Tensor", "aten::cos", "aten::sub.Tensor"):
        assert op in ops, ops


def test_fused_compile_is_named_after_the_run(cold_cache):
    x = torch.randn(5, 3, 2, device="tpu")

    def step():
        (x.exp() * x).sum().cpu()

    cpu = averages(run_profiled(step, mode="fused"), DeviceType.CPU)
    assert any(re.fullmatch(r"compile fused run \(\d+ ops\)", k) for k in cpu), sorted(cpu)


def test_compiled_graph_events(tmp_path, cold_cache):
    @torch.compile(backend="tpu")
    def f(a):
        return (a * 2).exp().sum(0)

    x = torch.randn(8, 5, device="tpu")
    first = run_profiled(lambda: f(x).cpu())
    cpu = averages(first, DeviceType.CPU)
    compiles = [k for k in cpu if re.fullmatch(r"compile inference graph \[\d+/\d+\]", k)]
    assert len(compiles) == 1, sorted(cpu)
    graph_id = compiles[0][len("compile "):]
    dev = averages(first, DeviceType.PrivateUse1)
    assert dev[f"compiled {graph_id}"].self_device_time_total > 0, sorted(dev)

    again = run_profiled(lambda: f(x).cpu())
    assert not any(k.startswith("compile ") for k in averages(again, DeviceType.CPU))
    [k] = [e for e in chrome(again, tmp_path) if e.get("cat") == "kernel"]
    assert k["name"] == f"compiled {graph_id}" and k["dur"] > 0


@pytest.mark.skipif(torch.tpu.device_count() < 2, reason="one tpu device")
def test_second_device_has_its_own_row(tmp_path):
    x = torch.randn(16, device="tpu:1")
    with torch_tpu.eager_mode("strict"):
        x.neg().cpu()
    p = run_profiled(lambda: x.neg().cpu())
    [k] = [e for e in chrome(p, tmp_path) if e.get("cat") == "kernel"]
    assert k["name"] == "aten::neg<Float[16]>" and k["pid"] == 1
    assert [e.device_index for e in device_events(p)] == [1]


def test_cpu_only_profile_has_no_device_events_and_stops_recording(cold_cache):
    x = torch.randn(2, 13, device="tpu")

    def step():
        torch.tanh(x).cpu()

    cpu_only = run_profiled(step, [ProfilerActivity.CPU])
    assert device_events(cpu_only) == []
    assert not torch_tpu._C.runtime.trace_recording()
    names = {a.key for a in cpu_only.key_averages()}
    assert "aten::tanh" in names and "compile aten::tanh" in names  # compiles are host spans
    # Executions between profiles are not recorded into the next one.
    with torch_tpu.eager_mode("strict"):
        for _ in range(3):
            step()
    p = run_profiled(step)
    assert [e.name for e in device_events(p)] == ["aten::tanh<Float[2,13]>"]
    assert not torch_tpu._C.runtime.trace_recording()  # launches are back to their no-profiler cost
    with torch_tpu.eager_mode("strict"):
        for _ in range(3):
            step()
    assert [e.name for e in device_events(run_profiled(step))] == ["aten::tanh<Float[2,13]>"]


def test_autograd_profiler_with_use_device():
    x = torch.randn(7, 3, device="tpu")
    with torch_tpu.eager_mode("strict"):
        torch.sqrt(x.abs()).cpu()
        with torch.autograd.profiler.profile(use_device="tpu", use_kineto=True) as p:
            torch.sqrt(x.abs()).cpu()
    dev = {e.name for e in p.function_events if e.device_type == DeviceType.PrivateUse1}
    assert {"aten::abs<Float[7,3]>", "aten::sqrt<Float[7,3]>"} <= dev, dev


PROGRAM = r"""
import json, warnings
warnings.filterwarnings("ignore")
import torch, torch_tpu
from torch.profiler import ProfilerActivity, profile
x = torch.randn(3, 5, device="tpu")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as p:
    torch.erf(x).cpu()
print(json.dumps({"cpu": [a.key for a in p.key_averages() if a.device_type.name == "CPU"],
                  "tpu": [a.key for a in p.key_averages() if a.device_type.name != "CPU"]}))
"""


@pytest.mark.multiprocess
@pytest.mark.slow
def test_disk_cache_hit_is_a_load_span(tmp_path):
    def names():
        # The load asked for by the op (a warm start would load it before the profiler starts).
        env = {**os.environ, "TORCH_TPU_CACHE_DIR": str(tmp_path), "TORCH_TPU_EAGER_MODE": "strict",
               "TORCH_TPU_WARM_START": "0"}
        r = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    first = names()
    assert "compile aten::erf" in first["cpu"] and "load aten::erf from the disk cache" not in first["cpu"]
    assert first["tpu"] == ["aten::erf<Float[3,5]>"]
    second = names()  # a new process: the memory tier is empty, the disk has the program
    assert "load aten::erf from the disk cache" in second["cpu"] and "compile aten::erf" not in second["cpu"]
    assert second["tpu"] == ["aten::erf<Float[3,5]>"]
