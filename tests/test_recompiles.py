"""Programs counted by cause, and the warning when an op or graph keeps making programs for new
shapes (torch_tpu/eager/recompiles.py; issue 49: recompiles must be visible)."""
import warnings

import pytest
import torch

import torch_tpu
from torch_tpu import recompiles

TPU = torch.device("tpu")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_RECOMPILE_WARN", "4")
    torch_tpu._C.eager.plan_cache_clear()  # every call below makes its plan (another test's may exist)
    recompiles.reset()
    yield
    recompiles.reset()


def test_programs_are_counted_by_cause():
    torch.sinh(torch.ones(3, 5, device=TPU))                          # first
    torch.sinh(torch.ones(4, 5, device=TPU))                          # new shape
    torch.sinh(torch.ones(4, 5, device=TPU, dtype=torch.float64))     # new dtype
    torch.sinh(torch.ones(5, 4, device=TPU).t())                      # new layout (transposed)
    torch.sinh(torch.ones(6, 5, device=TPU)[1:5])                     # new layout (offset)
    torch.sinh(torch.ones(6, 5, device=TPU)[2:6])                     # the same program
    assert torch_tpu.metrics.program_causes()["aten::sinh"] == {"first": 1, "new shape": 1, "new dtype": 1,
                                                                 "new layout": 2}


def test_new_shapes_past_the_threshold_warn_once_naming_the_op_and_shapes(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_RECOMPILE_WARN", "0")
    xs = [torch.ones(n, 3, device=TPU) for n in range(1, 9)]  # (their programs before the count starts)
    recompiles.reset()
    monkeypatch.setenv("TORCH_TPU_RECOMPILE_WARN", "4")
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        for x in xs:
            torch.cosh(x)
    mine = [w for w in got if "sizes of a dimension that changes" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in got]
    text = str(mine[0].message)
    assert "aten::cosh" in text and "TORCH_TPU_RECOMPILE_WARN" in text
    assert "dimension 0 of argument 0: sizes 1, 2, 3, 4; shapes [*, 3]" in text, text
    assert mine[0].filename == __file__  # the user's line


def test_no_warning_when_turned_off(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_RECOMPILE_WARN", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in range(1, 9):
            torch.tanh(torch.ones(n, 2, device=TPU))
    assert torch_tpu.metrics.program_causes()["aten::tanh"]["new shape"] == 7


def test_a_compiled_graph_with_symbolic_shapes_counts_its_per_shape_programs(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_SHAPE_BUCKETS", "off")  # per shape (bucketed: the test below)
    torch._dynamo.reset()
    f = torch.compile(lambda x: (x * 2).sum(), backend="tpu", dynamic=True)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        for n in range(3, 9):  # (n never 2: (2, 2) would be another graph, its sizes one symbol)
            f(torch.ones(n, 2, device=TPU))
    graphs = {k: v for k, v in torch_tpu.metrics.program_causes().items() if not k.startswith("aten::")}
    assert len(graphs) == 1 and list(graphs.values())[0] == {"first": 1, "new shape": 5}, graphs
    assert any("compiled graph" in str(w.message) and "sizes of a dimension that changes" in str(w.message) for w in got)


def test_a_bucketed_graph_counts_new_buckets_not_new_shapes():
    torch._dynamo.reset()
    f = torch.compile(lambda x: (x * 2).sum(), backend="tpu", dynamic=True)
    for n in (3, 5, 7, 20):  # buckets 16, 16, 16, 32 of one symbolic graph
        f(torch.ones(n, 2, device=TPU))  # (n never 2: equal sizes would share a symbol)
    graphs = {k: v for k, v in torch_tpu.metrics.program_causes().items() if not k.startswith("aten::")}
    assert list(graphs.values()) == [{"first": 1, "new bucket": 1}], graphs


def test_two_graphs_of_one_kind_are_counted_apart():
    """generate()'s prefill and decode step are both "inference" graphs: each is its own entry (by
    Dynamo's compile id), so neither's first program reads as a new dtype or arguments of the other."""
    torch._dynamo.reset()
    f = torch.compile(lambda x: (x * 2).sum(), backend="tpu", dynamic=True)
    g = torch.compile(lambda x: (x + 1).mean(), backend="tpu", dynamic=True)
    f(torch.ones(3, 2, device=TPU))
    g(torch.ones(3, 2, device=TPU))
    graphs = {k: v for k, v in torch_tpu.metrics.program_causes().items() if not k.startswith("aten::")}
    assert len(graphs) == 2 and all(k.startswith("inference graph [") for k in graphs), graphs
    assert list(graphs.values()) == [{"first": 1}, {"first": 1}], graphs


def test_a_models_layers_of_many_shapes_do_not_warn_its_changing_length_does(monkeypatch):
    """Different layers (and .to(device) copying their parameters) make programs of many shapes once:
    no warning (a fresh user's digits run and LSTM training warned). A batch whose length changes
    every step does warn."""
    monkeypatch.setenv("TORCH_TPU_RECOMPILE_WARN", "10")
    widths = [24, 22, 20, 18, 16, 14, 12, 10, 8]  # 8 layers of 8 widths
    layers = [torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:])]
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        model = torch.nn.Sequential(*layers).to(TPU)
        model(torch.randn(4, 24, device=TPU)).sum().backward()
        assert not [w for w in got if "sizes of a dimension" in str(w.message)], [str(w.message) for w in got]
        for n in range(5, 17):
            model(torch.randn(n, 24, device=TPU)).sum().backward()
    assert [w for w in got if "sizes of a dimension" in str(w.message)]


@pytest.mark.parametrize("name", ["mobilenet_v3_large", "efficientnet_b7", "densenet121", "regnet_y_3_2gf"])
def test_torchvision_models_parameter_shapes_do_not_warn_at_the_default(monkeypatch, name):
    """SGD's momentum clones and init's normal_ make one program per parameter shape: mobilenet_v3's 44
    (8 depthwise kernels (C, 1, 3, 3) differing in C alone) warned under a count of programs; densenet121's
    bottlenecks (128, C, 1, 1) have the most of torchvision's, 30 values of C."""
    torchvision = pytest.importorskip("torchvision")
    monkeypatch.delenv("TORCH_TPU_RECOMPILE_WARN")  # the default threshold
    shapes = [tuple(p.shape) for p in getattr(torchvision.models, name)().parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for shape in shapes:
            recompiles.note("aten::clone", ("float32",), (shape,), ((True, True),))
    lengths = iter(range(17, 100))
    with pytest.warns(UserWarning, match="32 sizes of a dimension that changes"):
        for _ in range(32):  # the same op with a length that changes: its 32nd size warns
            recompiles.note("aten::clone", ("float32",), ((8, next(lengths), 64),), ((True, True),))


def test_dynamic_none_counts_the_static_program_and_the_symbolic_graphs():
    """PyTorch's default dynamic=None compiles the first shape statically, then recompiles the graph
    with symbolic sizes: both are programs the process made (the static one was left out)."""
    torch._dynamo.reset()
    f = torch.compile(lambda x: (x * 2).sum(), backend="tpu")
    for n in (3, 4, 5, 6):
        f(torch.ones(n, 2, device=TPU))
    graphs = {k: v for k, v in torch_tpu.metrics.program_causes().items() if not k.startswith("aten::")}
    assert graphs == {"inference graph [0/0]": {"first": 1}, "inference graph [0/1]": {"first": 1}}, graphs


def test_a_bad_threshold_names_the_setting(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_RECOMPILE_WARN", "off")
    with pytest.raises(ValueError, match="TORCH_TPU_RECOMPILE_WARN='off': expected a number of sizes"):
        recompiles.note("aten::clone", ("float32",), ((8, 17, 64),), ((True, True),))
