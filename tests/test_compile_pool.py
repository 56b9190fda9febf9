"""The compile pool (csrc/runtime/compile_pool.h): strict eager queues an op whose program is new at
once and compiles it on the pool's threads; launches wait for it on the launcher thread."""
import os
import uuid

import pytest
import torch

import torch_tpu
from torch_tpu import _C


@pytest.fixture(autouse=True)
def strict():
    """Strict eager, whatever mode the suite runs in: these tests launch programs by hand on tensors
    made just before and count strict eager's compiles (the fused test enters fused mode itself)."""
    with torch_tpu.eager_mode("strict"):
        yield


def _program(n: int, c: float) -> str:
    return (f"module @m {{ func.func public @main(%a: tensor<{n}xf32>) -> tensor<{n}xf32> {{\n"
            f"  %c = stablehlo.constant dense<{c}> : tensor<{n}xf32>\n"
            f"  %0 = stablehlo.add %a, %c : tensor<{n}xf32>\n"
            f"  return %0 : tensor<{n}xf32> }} }}")


def _launch(exe, x, name):
    spec = _C.eager.FreshSpec(tuple(x.shape), x.dtype)
    return _C.testing.launch(exe, [x], [None], [spec], 0, name)[0]


def _key() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex  # a program no process has compiled


def test_a_pending_program_runs_once_compiled():
    exe = _C.runtime.compile_async(_key(), _program(5, 1.5), "aten::pooled", b"", [(torch.float32, [5])])
    assert exe.num_outputs == 1  # known from the program text, before the compile ends
    out = _launch(exe, torch.arange(5.0, device="tpu"), "aten::pooled")
    assert out.cpu().tolist() == [1.5, 2.5, 3.5, 4.5, 5.5]


def test_a_compile_error_fails_its_launch_at_the_next_sync_and_keeps_values():
    """A program the plugin cannot compile: the op that asked for it is named at the next sync (with the
    program), its output has no value, and tensors that had one keep it."""
    x = torch.arange(4.0, device="tpu")
    exe = _C.runtime.compile_async(_key(), _program(4, 1.0).replace("stablehlo.add", "stablehlo.not_an_op"),
                                   "aten::broken", b"", [(torch.float32, [4])])
    out = _launch(exe, x, "aten::broken")
    with pytest.raises(RuntimeError, match=r"(?s)tpu: compiling aten::broken failed.*--- program ---"):
        torch.tpu.synchronize()
    with pytest.raises(RuntimeError, match="tpu tensor without a value.*aten::broken"):
        out.cpu()
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert (x + 1).cpu().tolist() == [1.0, 2.0, 3.0, 4.0]  # the queue goes on


def test_outputs_that_differ_from_the_compiled_program_fail_its_launches():
    """The outputs a pending executable promises are checked against the compiled program: a launch
    never writes a result of another shape than its sinks were given."""
    exe = _C.runtime.compile_async(_key(), _program(3, 2.0), "aten::misdeclared", b"", [(torch.float32, [4])])
    _launch(exe, torch.zeros(4, device="tpu"), "aten::misdeclared")
    with pytest.raises(RuntimeError, match="internal error: the compiled program returns"):
        torch.tpu.synchronize()


def test_one_key_asked_twice_compiles_once():
    key, text = _key(), _program(6, 3.0)
    x = torch.zeros(6, device="tpu")
    before = torch_tpu.metrics.counters()["compiles"]
    a = _C.runtime.compile_async(key, text, "aten::twice", b"", [(torch.float32, [6])])
    b = _C.runtime.compile_async(key, text, "aten::twice", b"", [(torch.float32, [6])])
    assert torch_tpu.metrics.counters()["compiles"] == before + 1  # counters wait for the pool
    for exe in (a, b):
        assert _launch(exe, x, "aten::twice").cpu().tolist() == [3.0] * 6


@pytest.mark.parametrize("threads", [0, 2])
def test_strict_eager_gives_the_same_results_and_counts_with_or_without_the_pool(threads):
    """A step of new shapes: the same values, and the same programs counted (metrics wait for the
    pool), whether programs compile on the calling thread or on the pool."""
    torch.manual_seed(0)
    n, m = 37 + threads, 9 + threads  # shapes no other test compiles
    w = torch.randn(n, m)
    x = torch.randn(5, n)
    _C.runtime.set_compile_threads(threads)
    try:
        torch_tpu.metrics.reset()
        wt, xt = w.to("tpu"), x.to("tpu")
        y = torch.softmax(torch.tanh(xt @ wt) * 3, dim=-1).sum(0)
        compiles = torch_tpu.metrics.counters()["compiles"]
        got = y.cpu()
    finally:
        _C.runtime.set_compile_threads(torch_tpu.runtime._compile_threads())
    torch.testing.assert_close(got, torch.softmax(torch.tanh(x @ w) * 3, dim=-1).sum(0))
    assert compiles == 5, compiles  # mm, tanh, mul, softmax, sum: each a new program (uploads are transfers)


def test_pool_threads_are_named():
    exe = _C.runtime.compile_async(_key(), _program(2, 0.5), "aten::named", b"", [(torch.float32, [2])])
    _launch(exe, torch.zeros(2, device="tpu"), "aten::named").cpu()
    # (threads XLA starts while compiling inherit the name)
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    assert "tpu-compile" in names, names


@pytest.mark.multiprocess
def test_a_failed_launch_leaves_the_index_status_usable():
    """The device's index-error status (read and written by every op that checks indices) has a value
    from its start: a failed launch that was to write it (here, a program that did not compile) must
    not leave it without one, which made every later indexing op fail with that launch's error."""
    import subprocess
    import sys
    code = (
        "import torch, torch_tpu, uuid\n"
        "from torch_tpu import _C\n"
        "status = _C.eager.index_status(0)\n"
        "text = 'module @m { func.func public @main() -> tensor<3xi64> { %0 = stablehlo.bogus : tensor<3xi64>\\n"
        "return %0 : tensor<3xi64> } }'\n"
        "exe = _C.runtime.compile_async(uuid.uuid4().hex * 2, text, 'aten::broken', b'', [(torch.int64, [3])])\n"
        "_C.testing.launch(exe, [], [status], [], 0, 'aten::broken')\n"
        "try:\n"
        "    torch.tpu.synchronize()\n"
        "    raise SystemExit('the failed compile was not raised')\n"
        "except RuntimeError as e:\n"
        "    assert 'compiling aten::broken failed' in str(e), e\n"
        "t = torch.arange(5.0, device='tpu')\n"
        "print(t[torch.tensor([1, 3], device='tpu')].tolist())\n")
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[1.0, 3.0]"


def test_fused_runs_compile_on_the_pool(monkeypatch):
    """Fused eager hands a run's new program to the pool too: the run is queued at once, and a compile
    error is the run's error at the sync, naming it, with the tensors it read keeping their values."""
    from torch_tpu.eager import fused
    text = fused._text

    def broken(records, outputs):
        t, ext, types = text(records, outputs)
        return t.replace("stablehlo.multiply", "stablehlo.not_an_op"), ext, types
    monkeypatch.setattr(fused, "_text", broken)
    x = torch.arange(44.0, device="tpu").reshape(4, 11)  # a shape no other test fuses
    with torch_tpu.eager_mode("fused"):
        y = x * 3 + 1
        with pytest.raises(RuntimeError, match=r"(?s)tpu: compiling fused run \(2 ops\) failed.*--- program ---"):
            torch.tpu.synchronize()
    monkeypatch.setattr(fused, "_text", text)
    assert x.cpu().tolist() == torch.arange(44.0).reshape(4, 11).tolist()
    with torch_tpu.eager_mode("fused"):
        z = (x * 2 + 1).sum()  # the queue goes on
    assert z.item() == 44 + 2 * sum(range(44))
    del y
