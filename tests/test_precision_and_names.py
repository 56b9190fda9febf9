"""Float32 matmul precision as the programs' precision_config, and Google TorchTPU's user-facing
names (torch_tpu._internal.execution_mode, torch.tpu.precision, torch.tpu._get_cache_stats)."""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu.eager import state as _state
from torch_tpu._internal.execution_mode import EagerMode, eager_mode, get_eager_mode, set_eager_mode

TPU = "tpu"


@pytest.fixture(autouse=True)
def _restore_precision():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def _eager_text(fn):
    torch_tpu._C.eager.plan_cache_clear()  # built now, not found: last_program_text is this op's
    with torch_tpu.eager_mode("strict"):  # one program per op: the op's own text
        fn().cpu()
    return _state.last_program_text


@pytest.mark.parametrize("setting,level", [("highest", "HIGHEST"), ("high", "HIGH"), ("medium", "DEFAULT")])
def test_float32_matmul_precision_reaches_dots_and_convolutions(setting, level):
    torch.set_float32_matmul_precision(setting)
    a = torch.randn(8, 8, device=TPU)
    img, w = torch.randn(1, 2, 5, 5, device=TPU), torch.randn(3, 2, 3, 3, device=TPU)
    for fn in (lambda: a @ a, lambda: F.conv2d(img, w)):
        text = _eager_text(fn)
        assert f"#stablehlo<precision {level}>" in text
    # the CPU plugin computes every level exactly: same value as CPU
    torch.testing.assert_close((a @ a).cpu(), a.cpu() @ a.cpu(), rtol=1e-5, atol=1e-5)


def test_other_dtypes_keep_highest():
    torch.set_float32_matmul_precision("medium")
    a = torch.randn(4, 4, device=TPU, dtype=torch.float64)
    assert "#stablehlo<precision HIGHEST>" in _eager_text(lambda: a @ a)


def test_compiled_graphs_follow_a_change_of_setting():
    a = torch.randn(8, 8, device=TPU)
    f = torch.compile(lambda x: x @ x, backend="tpu")
    torch.set_float32_matmul_precision("highest")
    f(a)
    assert "#stablehlo<precision HIGHEST>" in torch_tpu.dynamo.last_stablehlo()
    torch.set_float32_matmul_precision("medium")
    torch.testing.assert_close(f(a).cpu(), a.cpu() @ a.cpu(), rtol=1e-5, atol=1e-5)
    assert "#stablehlo<precision DEFAULT>" in torch_tpu.dynamo.last_stablehlo()


def test_a_relowered_graph_keeps_its_devices(monkeypatch):
    """A change of setting lowers a graph again for the same devices: a graph with collectives keeps
    its replicas (it was re-made for one device, issue 54)."""
    from torch_tpu.dynamo.lower_graph import GraphProgram
    torch.set_float32_matmul_precision("highest")
    from torch.fx.experimental.proxy_tensor import make_fx
    a = torch.randn(4, 4, device=TPU)
    prog = GraphProgram(make_fx(lambda x: torch.mm(x, x), tracing_mode="fake")(a), "t")
    replicas = object()  # what a collective graph's program was compiled for
    prog.replicas = replicas
    seen = []
    monkeypatch.setattr(GraphProgram, "__init__", lambda self, gm, name, replicas=None, bucketing=None: seen.append(replicas))
    torch.set_float32_matmul_precision("medium")
    prog([a])  # (the stand-in __init__ rebuilds nothing: the old program runs)
    assert seen == [replicas]


def test_torch_tpu_precision_context():
    torch.set_float32_matmul_precision("highest")
    a = torch.randn(8, 8, device=TPU)
    with torch.tpu.precision(torch.tpu.Precision.HIGH):
        assert torch.get_float32_matmul_precision() == "high"
        assert "#stablehlo<precision HIGH>" in _eager_text(lambda: a @ a)
    assert torch.get_float32_matmul_precision() == "highest"
    with pytest.raises(TypeError, match="torch.tpu.Precision"):
        with torch.tpu.precision("high"):
            pass


def test_execution_mode_names():
    assert EagerMode.DEFER_NEVER.value == "strict"
    with eager_mode(EagerMode.DEFER_AND_FUSE):
        assert get_eager_mode() is EagerMode.DEFER_AND_FUSE and torch_tpu.get_eager_mode() == "fused"
        x = torch.ones(3, device=TPU) + 1
    with eager_mode(EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        assert torch_tpu.get_eager_mode() == "debug"
    torch.testing.assert_close(x.cpu(), torch.full((3,), 2.0))
    before = torch_tpu.get_eager_mode()
    try:
        set_eager_mode(EagerMode.DEFER_AND_FUSE)
        assert torch_tpu.get_eager_mode() == "fused"
    finally:
        torch_tpu.set_eager_mode(before)
    with pytest.raises(ValueError, match="unknown eager mode"):
        set_eager_mode("eager")


def test_get_cache_stats():
    stats = torch.tpu._get_cache_stats()
    assert {"memory_hits", "disk_hits", "misses"} <= set(stats)
