import os
import subprocess
import sys

import pytest
import torch

import torch_tpu

from helpers import ADD4_PROGRAM, run_python


def test_device_basics():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    x = torch.ones(3).tpu()
    assert x.is_tpu and x.device == torch.device("tpu", 0)
    assert not torch.ones(1).is_tpu
    assert torch_tpu.runtime.platform() == "cpu"
    assert torch_tpu.runtime.api_version() >= (0, 57)
    assert torch.accelerator.current_accelerator().type == "tpu"
    torch.tpu.synchronize()


def test_device_index_and_guard():
    n = torch.tpu.device_count()
    assert n >= 2  # the CPU plugin exposes several devices
    y = torch.ones(2, device="tpu:1")
    assert y.device.index == 1
    assert (y + 1).device.index == 1
    with torch.tpu.device(1):
        assert torch.tpu.current_device() == 1
        z = torch.zeros(2, device="tpu")
        assert z.device.index == 1
    assert torch.tpu.current_device() == 0
    torch.testing.assert_close(y.cpu(), torch.ones(2))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_cpu_plugin_device_count():
    """The CPU plugin exposes the usable cores clamped to [2, 4] devices unless
    TORCH_TPU_CPU_DEVICE_COUNT says otherwise; a bad value raises on first use, naming the variable."""
    if torch_tpu.runtime.platform() != "cpu":
        pytest.skip("the CPU plugin's option")
    code = "import torch, torch_tpu; print(torch.tpu.device_count())"
    assert int(run_python(code, TORCH_TPU_CPU_DEVICE_COUNT="").split()[-1]) == \
        min(4, max(2, len(os.sched_getaffinity(0))))
    assert int(run_python(code, TORCH_TPU_CPU_DEVICE_COUNT="3").split()[-1]) == 3
    bad = ("import torch, torch_tpu\n"
           "try:\n"
           "    torch.ones(1, device='tpu')\n"
           "except RuntimeError as e:\n"
           "    print(e)\n")
    assert "TORCH_TPU_CPU_DEVICE_COUNT must be a positive integer" in \
        run_python(bad, TORCH_TPU_CPU_DEVICE_COUNT="two")


@pytest.mark.multiprocess
def test_cpu_only_program_does_not_start_the_runtime():
    """The autograd engine asks every backend for its device count on the first backward(); with
    the CPU plugin that count is the configured one, so a CPU-only program (torch_tpu imported, or
    autoloaded) starts no PJRT client and prints no "No TPU here" warning. The count is the same
    once the plugin runs."""
    if torch_tpu.runtime.platform() != "cpu":
        pytest.skip("the CPU plugin's option")
    code = ("import warnings, torch, torch_tpu\n"
            "warnings.simplefilter('error')\n"  # a warning (the 'No TPU here' one) fails the run
            "x = torch.randn(3, requires_grad=True)\n"
            "(x * 2).sum().backward()\n"
            "print(torch.tpu.is_initialized(), torch.tpu.device_count(), torch.tpu.is_initialized())\n"
            "warnings.simplefilter('ignore')\n"
            "torch.ones(1, device='tpu')\n"
            "print(torch.tpu.is_initialized(), torch.tpu.device_count())\n")
    out = run_python(code, TORCH_TPU_CPU_DEVICE_COUNT="3").split("\n")
    assert out[0] == "False 3 False"
    assert out[1] == "True 3"


def test_bad_device_index():
    with pytest.raises((IndexError, RuntimeError), match="tpu device index|invalid tpu device index"):
        torch.empty(2, device="tpu:99")
    with pytest.raises((IndexError, RuntimeError)):
        torch.tpu.set_device(99)
    assert torch.tpu.current_device() == 0


def test_mixed_devices_error():
    a = torch.ones(2, device="tpu:0")
    b = torch.ones(2, device="tpu:1")
    with pytest.raises(RuntimeError, match="same device"):
        a + b
    with pytest.raises(RuntimeError, match="same device"):
        a + torch.ones(2)
    torch.testing.assert_close(a.cpu(), torch.ones(2))


def test_memory_stats_and_generator():
    stats = torch.tpu.memory_stats()
    assert set(stats) >= {"plugin.bytes_in_use", "plugin.peak_bytes_in_use", "allocated_bytes.all.current"}
    g = torch.tpu.default_generator()
    assert g.device.type == "tpu"
    torch.tpu.manual_seed(5)
    assert torch.tpu.initial_seed() == 5
    state = torch.tpu.get_rng_state()
    torch.tpu.set_rng_state(state)


def _run(code, env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env},
                          timeout=120)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_lazy_start_and_plugin_errors(tmp_path):
    r = _run("import torch, torch_tpu; from torch_tpu import _C; print(_C.runtime.started())", {})
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
    bad = tmp_path / "not_a_plugin.so"
    bad.write_text("hello")
    r = _run("import torch, torch_tpu; print(torch.tpu.is_available()); torch.ones(1, device='tpu')",
             {"TORCH_TPU_PJRT_PLUGIN": str(bad)})
    assert r.stdout.strip() == "False"
    assert str(bad) in r.stderr and "TORCH_TPU_PJRT_PLUGIN" in r.stderr
    r = _run("import torch, torch_tpu; torch.ones(1, device='tpu')", {"TORCH_TPU_PJRT_PLUGIN": "/nonexistent/p.so"})
    assert r.returncode != 0 and "not found" in r.stderr and "/nonexistent/p.so" in r.stderr
    r = _run("import torch, torch_tpu; torch.ones(1, device='tpu')", {"TORCH_TPU_PJRT_PLUGIN": "tpu"})
    assert r.returncode != 0 and "libtpu" in r.stderr


_FOREIGN_PLUGIN_C = r"""
#include <stddef.h>
/* PJRT_Api's first fields (struct_size, extension_start, pjrt_api_version), as pjrt_c_api.h
   lays them out, with a major version no release has. */
struct version { size_t struct_size; void* extension_start; int major_version; int minor_version; };
struct api { size_t struct_size; void* extension_start; struct version pjrt_api_version; };
static struct api the_api = {sizeof(struct api), 0, {sizeof(struct version), 0, 99, 0}};
const struct api* GetPjrtApi(void) { return &the_api; }
"""


def _shared_library(tmp_path, name, source):
    c = tmp_path / f"{name}.c"
    c.write_text(source)
    so = tmp_path / f"{name}.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(c)], check=True, capture_output=True, timeout=60)
    return so


@pytest.mark.parametrize("kind", ["truncated", "no_entry_point", "foreign_version"])
@pytest.mark.multiprocess
def test_corrupt_or_foreign_plugin_is_a_clear_error(tmp_path, kind):
    """A damaged copy of the real plugin, a library that is not a PJRT plugin and a plugin of an
    unknown C API version: tpu is unavailable, and using it raises an error naming the file, what is
    wrong and TORCH_TPU_PJRT_PLUGIN (no crash)."""
    if kind == "truncated":
        from torch_tpu import plugins
        real = open(plugins.CPU.find(), "rb").read()
        plugin = tmp_path / "damaged_plugin.so"
        plugin.write_bytes(real[: len(real) // 3])
        expected = "Cannot load"
    elif kind == "no_entry_point":
        plugin = _shared_library(tmp_path, "not_pjrt", "int answer(void) { return 42; }\n")
        expected = "is not a PJRT plugin: it has no GetPjrtApi symbol"
    else:
        plugin = _shared_library(tmp_path, "foreign", _FOREIGN_PLUGIN_C)
        expected = "reports C API 99.0; TorchTPU supports"
    r = _run("import torch, torch_tpu; print(torch.tpu.is_available(), flush=True); torch.ones(1, device='tpu')",
             {"TORCH_TPU_PJRT_PLUGIN": str(plugin)})
    assert r.returncode == 1 and r.stdout.strip() == "False", r.stderr[-2000:]
    assert expected in r.stderr and str(plugin) in r.stderr and "TORCH_TPU_PJRT_PLUGIN" in r.stderr, r.stderr[-2000:]


@pytest.mark.multiprocess
def test_cpu_platform_warning_once():
    r = _run("import warnings, torch, torch_tpu\n"
             "with warnings.catch_warnings(record=True) as w:\n"
             "    warnings.simplefilter('always')\n"
             "    torch.ones(1, device='tpu'); torch.ones(1, device='tpu')\n"
             "print(sum('CPU PJRT plugin' in str(x.message) for x in w))", {})
    assert r.stdout.strip() == "1", r.stderr


@pytest.mark.parametrize("first", ["torch.tpu.get_device_name()", "torch.tpu.get_device_properties(0)",
                                   "torch.tpu.memory_stats()", "torch.ones(1, device='tpu')"])
@pytest.mark.multiprocess
@pytest.mark.slow
def test_cpu_platform_warning_is_a_python_warning_whatever_starts_the_client(first):
    """However the client starts (a device query or a tensor), the platform warning is one Python
    UserWarning, which Python's filters silence (c10's own stderr line ignored them)."""
    code = f"import torch, torch_tpu\n{first}\nprint('done')"
    r = _run(code, {})
    assert r.returncode == 0 and r.stderr.count("No TPU here") == 1 and "UserWarning: No TPU here" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "No TPU here" not in r.stderr, r.stderr


@pytest.mark.multiprocess
@pytest.mark.slow
def test_plugin_start_prints_no_info_logs_and_other_ranks_no_platform_warning():
    # The CPU plugin logs at INFO while its client starts ("I0000 ... cpu_device_count set via
    # create_options") after absl's notice that logging is not initialised: both left out. The
    # platform warning is said once per job, by rank 0 (or a process that is not part of one).
    code = "import torch, torch_tpu; print((torch.ones(2, device='tpu') + 1).tolist())"
    # A clean environment: what earlier tests of this worker left in os.environ (in one full-suite
    # run, something silenced the plugin's INFO lines) must not decide what the plugin prints.
    clean = {k: os.environ[k] for k in ("PATH", "HOME", "PYTHONPATH", "TORCH_TPU_CACHE_DIR") if k in os.environ}

    def run_clean(code, env):
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env},
                              timeout=120)
    r = run_clean(code, {})
    assert r.returncode == 0 and r.stdout.strip() == "[2.0, 2.0]", r.stderr
    assert "I0000" not in r.stderr and "absl::InitializeLog" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "No TPU here" in lines[0] and len(lines[0]) < 160, r.stderr  # one short line
    r = run_clean(code, {"RANK": "1"})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = run_clean(code, {"RANK": "1", "TORCH_TPU_PLUGIN_LOGS": "1"})  # the plugin's own logs, when asked for
    assert r.returncode == 0 and "cpu_device_count" in r.stderr, r.stderr


# An op with no lowering (its pooling regions come from random samples; see the closing notes).
def _unlowered(device):
    x = torch.arange(16.0).reshape(1, 1, 4, 4).to(device)
    samples = torch.full((1, 1, 2), 0.5).to(device)
    return torch.ops.aten.fractional_max_pool2d(x, [2, 2], [2, 2], samples)


def test_fallback_disabled_names_op(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "0")
    x = torch.ones(3, device="tpu")
    with pytest.raises(NotImplementedError, match="aten::fractional_max_pool2d"):
        _unlowered("tpu")
    torch.testing.assert_close(x.cpu(), torch.ones(3))


def test_fallback_counted():
    torch_tpu.metrics.reset()
    y = _unlowered("tpu")  # no lowering: runs on CPU, counted
    assert y[0].device.type == "tpu"
    assert torch_tpu.metrics.fallback_counts().get("aten::fractional_max_pool2d.output", 0) == 1
    torch.testing.assert_close(y[0].cpu(), _unlowered("cpu")[0])


def test_work_on_a_second_device_and_between_devices():
    a = torch.arange(4.0, device="tpu")
    b = a.to("tpu:1")
    assert b.device.index == 1
    torch.testing.assert_close(b.cpu(), torch.arange(4.0))
    c = torch.empty(4, device="tpu:1").copy_(a * 2)
    torch.testing.assert_close(c.cpu(), torch.arange(4.0) * 2)
    torch.testing.assert_close(torch.arange(3, device="tpu:1").cpu(), torch.arange(3))
    torch.testing.assert_close(torch.linspace(0, 1, 5, device="tpu:1").cpu(), torch.linspace(0, 1, 5))
    r = torch.empty(0, device="tpu:1")
    r.resize_(3)  # grows its storage on tpu:1, whatever the current device is
    r.fill_(2)
    torch.testing.assert_close((r + 1).cpu(), torch.full((3,), 3.0))


def test_pinned_memory_with_tpu_as_accelerator():
    p = torch.ones(4).pin_memory()
    torch.testing.assert_close(p.to("tpu", non_blocking=True).cpu(), torch.ones(4))


def test_launch_errors_surface_at_the_next_host_read():
    """Launches are issued by the runtime's launcher thread: an error PJRT reports when issuing one
    (here a 3-element argument for a 4-element parameter) is raised by the next host read, naming
    the op, and only once."""
    exe = torch_tpu.runtime.compile(ADD4_PROGRAM)
    x = torch.zeros(3, device="tpu")
    out = torch_tpu._C.testing.launch(exe, [x], [None], [torch_tpu._C.eager.FreshSpec((4,), torch.float32)], 0, "my_test_op")
    assert out[0].shape == (4,)
    with pytest.raises(RuntimeError, match="my_test_op"):
        torch.tpu.synchronize()
    torch.tpu.synchronize()  # reported once
    y = torch.ones(4, device="tpu")
    torch_tpu._C.testing.launch(exe, [y], [None], [torch_tpu._C.eager.FreshSpec((4,), torch.float32)], 0, "ok")  # the queue still works
    assert (y + y).cpu().tolist() == [2.0] * 4
    # The thread is named, so that top, perf and py-spy tell its CPU time from PJRT's own threads.
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    assert names.count("tpu-launcher") == 1


@pytest.mark.multiprocess
@pytest.mark.slow
def test_launches_on_the_calling_thread():
    """TORCH_TPU_ASYNC_LAUNCH=0: launches are issued by the caller, and their errors raised there."""
    prog = ("import warnings; warnings.filterwarnings('ignore'); import torch, torch_tpu\n"
            "from tests.helpers import ADD4_PROGRAM\n"
            "exe = torch_tpu.runtime.compile(ADD4_PROGRAM)\n"
            "x = torch.arange(4., device='tpu')\n"
            "print((x * 2 + 1).sum().item())\n"
            "try:\n"
            "    torch_tpu._C.testing.launch(exe, [torch.zeros(3, device='tpu')], [None], [torch_tpu._C.eager.FreshSpec((4,), torch.float32)], 0, 'bad')\n"
            "except RuntimeError as e:\n"
            "    print('raised by the launch:', 'bad' in str(e))\n")
    out = run_python(prog, TORCH_TPU_ASYNC_LAUNCH="0")
    assert out.strip().splitlines() == ["16.0", "raised by the launch: True"]


@pytest.mark.multiprocess
def test_a_child_forked_after_start_gets_an_error_not_a_hang():
    """PJRT's client and threads do not survive fork(): a child forked after the runtime started
    raises RuntimeError (naming the 'spawn' start method) where it would otherwise wait forever, and
    exits cleanly with the parent's tpu tensors still alive; the parent goes on working."""
    prog = ("import os, sys, warnings; warnings.filterwarnings('ignore'); import torch, torch_tpu\n"
            "a = torch.arange(3.0, device='tpu') + 1\n"
            "assert not torch.tpu._is_in_bad_fork()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    print('child bad fork', torch.tpu._is_in_bad_fork(), torch.tpu.device_count() > 0, flush=True)\n"
            "    for f in (lambda: torch.ones(2, device='tpu').cpu(), a.cpu, lambda: (a * 2).cpu(),\n"
            "              torch.tpu.synchronize):\n"
            "        try:\n"
            "            f()\n"
            "            print('child no error', flush=True)\n"
            "        except RuntimeError as e:\n"
            "            print('child error', 'forked' in str(e) and 'spawn' in str(e), flush=True)\n"
            "    sys.exit(0)\n"  # a normal exit: the inherited tensors are released, not waited on
            "_, status = os.waitpid(pid, 0)\n"
            "print('parent', status, (a * 2).cpu().tolist())\n")
    out = run_python(prog).splitlines()
    assert out == ["child bad fork True True"] + ["child error True"] * 4 + ["parent 0 [2.0, 4.0, 6.0]"]


@pytest.mark.libtpu
@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_child_forked_after_libtpu_loaded_exits_with_its_status():
    """libtpu's exit handler flushes its log sink through a logger thread that a forked child does not
    have, and hung the child forever (torch_tpu.aot or shadow mode loads libtpu in the parent): the
    child ends without the plugins' exit handlers, with the status it exits with."""
    pytest.importorskip("libtpu")
    prog = ("import os, sys, warnings; warnings.filterwarnings('ignore'); import torch, torch_tpu\n"
            "from torch_tpu import aot\n"
            "aot.topology('v5e:1x1')\n"  # loads libtpu here
            "a = torch.arange(3.0, device='tpu') + 1\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    print('child', flush=True)\n"
            "    sys.exit(3)\n"
            "_, status = os.waitpid(pid, 0)\n"
            "print('parent', os.waitstatus_to_exitcode(status), a.cpu().tolist())\n")
    assert run_python(prog).splitlines() == ["child", "parent 3 [1.0, 2.0, 3.0]"]


def test_outputs_of_a_failed_launch_have_no_value_and_in_place_targets_keep_theirs():
    """A launch that fails when issued changes nothing: a tensor it would have updated in place keeps
    its value, and a tensor it would have created has none, so reading it, or anything computed from
    it, raises the failure (naming the op) instead of silently reading zeros."""
    exe = torch_tpu.runtime.compile(ADD4_PROGRAM)
    y = torch.ones(4, device="tpu")
    with torch_tpu.eager_mode("strict"):  # debug mode would raise at the launch, fused mode defer it
        out = torch_tpu._C.testing.launch(exe, [torch.zeros(3, device="tpu")], [None], [torch_tpu._C.eager.FreshSpec((4,), torch.float32)], 0,
                                   "my_failing_op")[0]
        z = out * 2
        y.add_(out)
        with pytest.raises(RuntimeError, match="my_failing_op"):
            torch.tpu.synchronize()
    for t in (out, z):
        with pytest.raises(RuntimeError, match="tpu tensor without a value: the tpu op my_failing_op"):
            t.cpu()
    assert y.cpu().tolist() == [1.0] * 4
    with torch_tpu.eager_mode("fused"):  # a fused group reading `out` fails as a whole: its new tensors
        w = torch.ones(4, device="tpu")  # have no value either (they are not left as zeros)
        w2 = w + out
        for t in (w2, w):
            with pytest.raises(RuntimeError, match="tpu tensor without a value: .*my_failing_op"):
                t.cpu()
    out = torch.full((4,), 3.0, device="tpu")  # recomputed into a new tensor: usable again
    assert (out * 2).cpu().tolist() == [6.0] * 4
