"""torch.compile(backend="tpu"): whole graphs lowered by the eager registry, against eager tpu."""
import copy
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from tiny_models import BasicBlock, TinyGPT  # noqa: E402

TPU = torch.device("tpu")
TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def counts():
    return torch_tpu.metrics.counters()


def mlp():
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 5))


def digits_cnn():
    from train_digits import DigitsCNN
    return DigitsCNN()


CASES = {
    "mlp": (mlp, lambda g: torch.randn(6, 12, generator=g), lambda out, g: out.pow(2).mean()),
    "digits_cnn": (digits_cnn, lambda g: torch.rand(8, 1, 8, 8, generator=g),
                   lambda out, g: F.cross_entropy(out, torch.randint(0, 10, (8,), generator=g).to(TPU))),
    "gpt_block": (TinyGPT, lambda g: torch.randint(0, 64, (2, 16), generator=g),
                  lambda out, g: F.cross_entropy(out.flatten(0, 1), torch.randint(0, 64, (32,), generator=g).to(TPU))),
    "resnet_block": (BasicBlock, lambda g: torch.randn(2, 8, 8, 8, generator=g), lambda out, g: out.square().mean()),
}


def twins(make):
    torch.manual_seed(0)
    base = make()
    return copy.deepcopy(base).to(TPU), copy.deepcopy(base).to(TPU)


@pytest.mark.parametrize("name", list(CASES))
def test_outputs_and_gradients_match_eager(name):
    make, make_input, loss_fn = CASES[name]
    eager, compiled_model = twins(make)
    compiled = torch.compile(compiled_model, backend="tpu")
    x = make_input(torch.Generator().manual_seed(1)).to(TPU)
    before = counts()
    out_e = eager(x)
    out_c = compiled(x)
    torch.testing.assert_close(out_c.cpu(), out_e.cpu(), **TOL)
    loss_fn(out_e, torch.Generator().manual_seed(2)).backward()
    loss_fn(out_c, torch.Generator().manual_seed(2)).backward()
    for (n, pe), (_, pc) in zip(eager.named_parameters(), compiled_model.named_parameters()):
        torch.testing.assert_close(pc.grad.cpu(), pe.grad.cpu(), **TOL, msg=lambda m: f"{n}: {m}")
    for (n, be), (_, bc) in zip(eager.named_buffers(), compiled_model.named_buffers()):
        torch.testing.assert_close(bc.cpu(), be.cpu(), **TOL, msg=lambda m: f"buffer {n}: {m}")
    after = counts()
    assert after["graph_eager_fallbacks"] == before["graph_eager_fallbacks"]
    assert after["compiled_graphs"] >= before["compiled_graphs"] + 2  # forward and backward
    assert after["fallbacks"] == before["fallbacks"], torch_tpu.metrics.fallback_counts()
    assert "stablehlo" in torch_tpu.dynamo.last_stablehlo()


@pytest.mark.parametrize("name", ["mlp", "digits_cnn", "gpt_block"])
@pytest.mark.slow
def test_compiled_training_follows_eager(name):
    """Forward, backward and optimizer.step() all inside the compiled function."""
    make, make_input, loss_fn = CASES[name]
    models = twins(make)
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-3) for m in models]

    def step(model, opt, x, g_seed):
        opt.zero_grad()
        loss = loss_fn(model(x), torch.Generator().manual_seed(g_seed))
        loss.backward()
        opt.step()
        return loss

    compiled_step = torch.compile(step, backend="tpu")
    before = counts()
    losses = {"eager": [], "compiled": []}
    for i in range(30):  # the curve length: 30 compiled steps
        x = make_input(torch.Generator().manual_seed(100 + i % 3)).to(TPU)
        losses["eager"].append(step(models[0], opts[0], x, i % 3).item())
        losses["compiled"].append(compiled_step(models[1], opts[1], x, i % 3).item())
    assert losses["compiled"] == pytest.approx(losses["eager"], rel=2e-3, abs=2e-4), losses
    assert losses["compiled"][-1] < losses["compiled"][0]
    for pe, pc in zip(models[0].parameters(), models[1].parameters()):
        # Adam turns gradients that are zero up to rounding (a conv bias before BatchNorm, the key
        # bias of attention) into full-size steps of either sign: compare the others.
        real = pe.grad.abs().cpu() > 1e-5
        torch.testing.assert_close(pc.detach().cpu()[real], pe.detach().cpu()[real], atol=2e-3, rtol=2e-3)
    assert counts()["graph_eager_fallbacks"] == before["graph_eager_fallbacks"]


def test_tpu_kernels_run_between_graphs_are_not_traced():
    """loss.backward() breaks the graph (Dynamo's default): the autograd engine then runs tpu ops
    eagerly, through our Python kernels, while the compiled function is active. Dynamo must run those
    kernels as they are, not trace each into a graph of its own: three graphs (forward, backward,
    optimizer step), each run once per step."""
    make, _, _ = CASES["gpt_block"]
    torch.manual_seed(0)
    model = make().to(TPU)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 64, (2, 16)).to(TPU)
    targets = torch.randint(0, 64, (32,)).to(TPU)

    def step():
        opt.zero_grad()
        loss = F.cross_entropy(model(x).flatten(0, 1), targets)
        loss.backward()
        opt.step()
        return loss

    compiled = torch.compile(step, backend="tpu")
    before = counts()
    for _ in range(3):
        compiled()
    after = counts()
    assert after["compiled_graphs"] - before["compiled_graphs"] == 3
    assert after["graph_executions"] - before["graph_executions"] == 9


@pytest.mark.parametrize("kind", ["autograd_grad", "backward_then_step"])
def test_same_graphs_and_breaks_as_cpu_whatever_the_backend(kind):
    """torch._dynamo.explain (its own backend, not "tpu") sees the graphs and breaks CPU has: the
    eager code between graphs runs our kernels as they are (_state.run_as_is), whichever backend
    compiled the function."""
    def explain(device):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
        params = list(model.parameters())
        opt = torch.optim.SGD(params, lr=0.1)
        x, y = torch.randn(4, 8).to(device), torch.randn(4, 1).to(device)

        def grad_step(x, y):
            loss = (model(x) - y).square().mean()
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p.sub_(0.1 * g)
            return loss

        def backward_step(x, y):  # the peers' compiled step
            opt.zero_grad()
            loss = (model(x) - y).square().mean()
            loss.backward()
            loss = loss.detach()
            opt.step()
            return loss
        torch._dynamo.reset()
        e = torch._dynamo.explain(grad_step if kind == "autograd_grad" else backward_step)(x, y)
        return e.graph_count, e.graph_break_count, [r.reason.split("\n")[0] for r in e.break_reasons]
    with warnings.catch_warnings():  # what tracing into our kernels said
        warnings.filterwarnings("error", message=".*Dynamo does not know how to trace", category=UserWarning)
        tpu = explain(TPU)
    assert tpu == explain("cpu")


def test_traced_backward_gives_one_forward_backward_graph():
    """With PyTorch's torch._dynamo.config.trace_autograd_ops, loss.backward() is traced into the
    graph: forward and backward become one inference graph (no autograd-engine backward graph), and
    30 steps follow eager training."""
    make, make_input, _ = CASES["gpt_block"]
    models = twins(make)
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-3) for m in models]

    def step(model, opt, x, targets):
        opt.zero_grad()
        loss = F.cross_entropy(model(x).flatten(0, 1), targets)
        loss.backward()
        loss = loss.detach()  # the optimizer's graph break must not carry a consumed autograd graph
        opt.step()
        return loss

    with torch._dynamo.config.patch(trace_autograd_ops=True):
        compiled_step = torch.compile(step, backend="tpu")
        before = counts()
        losses = {"eager": [], "compiled": []}
        for i in range(30):
            x = make_input(torch.Generator().manual_seed(100 + i % 3)).to(TPU)
            g = torch.randint(0, 64, (32,), generator=torch.Generator().manual_seed(i % 3)).to(TPU)
            losses["eager"].append(step(models[0], opts[0], x, g).item())
            losses["compiled"].append(compiled_step(models[1], opts[1], x, g).item())
    after = counts()
    assert losses["compiled"] == pytest.approx(losses["eager"], rel=2e-3, abs=2e-4), losses
    # forward+backward, and the optimizer step: two graphs, each run once per step
    assert after["compiled_graphs"] - before["compiled_graphs"] == 2
    assert after["graph_executions"] - before["graph_executions"] == 60
    for pe, pc in zip(models[0].parameters(), models[1].parameters()):
        real = pe.grad.abs().cpu() > 1e-5
        torch.testing.assert_close(pc.detach().cpu()[real], pe.detach().cpu()[real], atol=2e-3, rtol=2e-3)


def test_optimizer_step_updates_parameters_in_place():
    torch.manual_seed(0)
    p = torch.randn(5, 3, device=TPU, requires_grad=True)
    p.grad = torch.ones(5, 3, device=TPU)
    opt = torch.optim.SGD([p], lr=0.5, momentum=0.9)
    expected = p.detach().cpu() - 0.5
    ptr = p.data_ptr()
    torch.compile(opt.step, backend="tpu")()
    assert p.data_ptr() == ptr
    torch.testing.assert_close(p.detach().cpu(), expected)
    text = torch_tpu.dynamo.last_stablehlo()
    assert "tf.aliasing_output" in text  # the parameter's old buffer is donated


def test_optimizer_math_on_buffers_as_they_are():
    """torch.optim's foreach math on N-D parameters runs on the storages' buffers in their own shapes,
    with no reshape between them: XLA then updates each donated parameter and state in place (a
    reshape at the boundary made XLA:TPU copy every state). Same values as CPU."""
    torch.manual_seed(0)
    ref = [torch.randn(5, 3), torch.randn(2, 3, 4), torch.randn(7)]
    grads = [torch.randn_like(p) for p in ref]
    cpu = [p.clone().requires_grad_() for p in ref]
    tpu = [p.to(TPU).requires_grad_() for p in ref]
    for ps in (cpu, tpu):
        for p, g in zip(ps, grads):
            p.grad = g.to(p.device)
    opt_cpu = torch.optim.AdamW(cpu, lr=0.1, foreach=True)
    opt_tpu = torch.optim.AdamW(tpu, lr=0.1, foreach=True)
    step = torch.compile(opt_tpu.step, backend="tpu")
    for _ in range(2):
        opt_cpu.step()
        step()
    for c, t in zip(cpu, tpu):
        torch.testing.assert_close(t.detach().cpu(), c.detach())
    text = torch_tpu.dynamo.last_stablehlo()
    main = text[text.index("@main("):text.index(")", text.index("@main("))]
    assert "tensor<5x3xf32> {tf.aliasing_output" in main and "tensor<2x3x4xf32> {tf.aliasing_output" in main
    reshaped = [line for line in text.splitlines() if "stablehlo.reshape" in line
                and ("tensor<5x3xf32>" in line or "tensor<2x3x4xf32>" in line)]
    assert not reshaped, reshaped[:3]


def test_outputs_aliasing_inputs_are_views():
    def f(x, y):
        return x, x.t(), y[1:], (x * 2).sum()

    x = torch.randn(3, 4, device=TPU)
    y = torch.randn(5, device=TPU)
    a, b, c, s = torch.compile(f, backend="tpu")(x, y)
    assert a is x
    assert b._base is x or b.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert c.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    torch.testing.assert_close(s.cpu(), (x.cpu() * 2).sum())


def test_input_mutation_and_noncontiguous_inputs():
    def f(x, buf):
        buf.add_(x.sum(0))
        return x.relu() * 2

    x = torch.randn(4, 6).t()  # non-contiguous input
    buf = torch.zeros(8)[::2]  # a strided view, mutated
    xt, buft_base = x.to(TPU), torch.zeros(8, device=TPU)
    buft = buft_base[::2]
    out = torch.compile(f, backend="tpu")(xt, buft)
    ref = f(x, buf)
    torch.testing.assert_close(out.cpu(), ref)
    torch.testing.assert_close(buft_base.cpu(), torch.zeros(8).index_put_((torch.arange(0, 8, 2),), x.sum(0)))


def test_transposed_inputs_are_read_in_place():
    """A transposed (permuted dense) input, such as a weight AOTAutograd saves for the backward, is
    read from its storage in that layout: no copy is launched. The same layout at an offset of a
    larger storage (Dynamo's guards do not tell them apart) is copied into the layout first."""
    def f(w, x):
        return x @ w + 1

    w, x = torch.randn(5, 3), torch.randn(4, 5)
    wt, xt = w.t().contiguous().to(TPU).t(), x.to(TPU)
    assert wt.stride() == (1, 5)
    compiled = torch.compile(f, backend="tpu")
    compiled(wt, xt)
    before = counts()["executions"]
    out = compiled(wt, xt)
    assert counts()["executions"] - before == 1  # the graph alone
    torch.testing.assert_close(out.cpu(), f(w, x))
    big = torch.randn(4, 5)
    shifted = big.to(TPU)[1:].t()  # strides (1, 5), offset 5
    torch.testing.assert_close(compiled(shifted, xt).cpu(), f(big[1:].t(), x))

    def g(w, x):  # a written input stays dense: its result replaces the storage's buffer
        w.mul_(2)
        return x @ w

    wt2 = w.t().contiguous().to(TPU).t()
    out = torch.compile(g, backend="tpu")(wt2, xt)
    torch.testing.assert_close(wt2.cpu(), w * 2)
    torch.testing.assert_close(out.cpu(), x @ (w * 2))


def test_channels_last_and_transposed_outputs_keep_strides():
    def f(x):
        return (x + 1).permute(0, 2, 3, 1), x.mT * 2

    x = torch.randn(2, 3, 4, 5, device=TPU)
    a, b = torch.compile(f, backend="tpu")(x)
    ea, eb = f(x.cpu())  # the strides PyTorch's CPU kernels give
    assert a.stride() == ea.stride() and b.stride() == eb.stride()
    torch.testing.assert_close(a.cpu(), ea.cpu())
    torch.testing.assert_close(b.cpu(), eb.cpu())


def test_permuted_output_is_a_tensor_of_its_own():
    """A channels-last result is a new tensor with those strides, not a view (as CPU's), so autograd
    lets the caller update it in place."""
    x = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    xt = x.to(TPU).requires_grad_()
    y = torch.compile(lambda x: x * 2, backend="tpu")(xt)
    assert not y._is_view() and y.stride() == x.stride()
    y.add_(1)  # raised "Output 0 of CompiledFunction is a view and is being modified inplace"
    y.sum().backward()
    assert xt.grad.stride() == x.stride()
    torch.testing.assert_close(y.detach().cpu(), x * 2 + 1)


def test_dropout_uses_the_tpu_generator():
    def f(x):
        return F.dropout(x, 0.5, training=True)

    x = torch.ones(64, 64, device=TPU)
    cf = torch.compile(f, backend="tpu")
    torch.tpu.manual_seed(3)
    a = cf(x).cpu()
    b = cf(x).cpu()
    torch.tpu.manual_seed(3)
    a2 = cf(x).cpu()
    assert torch.equal(a, a2) and not torch.equal(a, b)
    assert set(a.unique().tolist()) <= {0.0, 2.0} and 0.4 < (a == 0).float().mean() < 0.6


def test_graph_break_still_runs():
    def f(x):
        y = x.sin() * 2
        print("graph break here")
        if y.sum().item() > -1e9:  # data-dependent control flow: another break
            y = y + 1
        return y.cos()

    x = torch.randn(4, 4, device=TPU)
    out = torch.compile(f, backend="tpu")(x)
    torch.testing.assert_close(out.cpu(), (x.cpu().sin() * 2 + 1).cos(), **TOL)
    explain = torch._dynamo.explain(f)(x)
    assert explain.graph_break_count >= 1


def test_new_shapes_recompile():
    f = torch.compile(lambda x: (x * x).sum(-1), backend="tpu", dynamic=False)
    for n in (3, 5, 7):
        x = torch.randn(n, 4, device=TPU)
        torch.testing.assert_close(f(x).cpu(), (x.cpu() * x.cpu()).sum(-1), **TOL)


def test_dynamic_shapes_are_specialized_per_shape(caplog):
    """A graph that cannot be bucketed (roll along its symbolic dimension) runs one program per shape."""
    fn = lambda x: torch.tanh(x).roll(1, 0) + x.shape[0]  # noqa: E731
    f = torch.compile(fn, backend="tpu", dynamic=True)
    before = counts()["compiled_graphs"]
    with caplog.at_level("INFO", logger="torch_tpu.dynamo"):
        for n in (3, 5, 3):
            x = torch.randn(n, 2, device=TPU)
            torch.testing.assert_close(f(x).cpu(), fn(x.cpu()), **TOL)
    assert counts()["compiled_graphs"] - before == 2  # one per distinct shape
    assert "per concrete input shape" in caplog.text


_LIBS = []


def _no_lowering_op():
    """tpu_test::twice: an op with a tpu kernel but no lowering (defined once per process)."""
    if not _LIBS:
        lib = torch.library.Library("tpu_test", "DEF")
        lib.define("twice(Tensor x) -> Tensor")
        lib.impl("twice", lambda x: x + x, "PrivateUse1")
        lib.impl("twice", lambda x: torch.empty_like(x), "Meta")
        _LIBS.append(lib)
    return _LIBS[0]


def test_op_without_lowering_warns_and_runs_eagerly():
    lib = _no_lowering_op()  # noqa: F841  (keeps the op registered)

    def f(x):
        return torch.ops.tpu_test.twice(x.exp()) + 1

    x = torch.randn(3, device=TPU)
    before = counts()["graph_eager_fallbacks"]
    with pytest.warns(UserWarning, match=r"tpu_test::twice.*has no tpu lowering") as rec:
        out = torch.compile(f, backend="tpu")(x)
    assert any("test_compile.py" in str(w.message) for w in rec)  # names the user's line
    torch.testing.assert_close(out.cpu(), x.cpu().exp() * 2 + 1, **TOL)
    assert counts()["graph_eager_fallbacks"] == before + 1


def test_fullgraph_raises_on_op_without_lowering():
    lib = _no_lowering_op()  # noqa: F841

    def f(x):
        return torch.ops.tpu_test.twice(x) + 1

    with pytest.raises(Exception, match=r"tpu_test::twice"):
        torch.compile(f, backend="tpu", fullgraph=True)(torch.randn(3, device=TPU))


PROGRAM = r"""
import json, warnings
warnings.filterwarnings("ignore")
import torch, torch_tpu
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to("tpu")
torch.manual_seed(0)
for p in model.parameters():
    torch.nn.init.constant_(p, 0.1)
x = torch.linspace(-1, 1, 24, device="tpu").reshape(3, 8)
out = torch.compile(model, backend="tpu")(x)
out.sum().backward()
print(json.dumps({"out": out.sum().item(), **torch_tpu.compile_cache.stats(),
                  "graphs": torch_tpu.metrics.counters()["compiled_graphs"]}))
"""


@pytest.mark.multiprocess
@pytest.mark.slow
def test_second_process_loads_graphs_from_disk_cache(tmp_path):
    def run():
        env = {**os.environ, "TORCH_TPU_CACHE_DIR": str(tmp_path)}
        r = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    first = run()
    assert first["graphs"] >= 2 and first["misses"] >= 2
    second = run()
    assert second["out"] == first["out"]
    assert second["misses"] == 0 and second["disk_hits"] == first["misses"]


def test_backend_is_registered():
    assert "tpu" in torch._dynamo.list_backends()
    assert torch._dynamo.lookup_backend("tpu") is torch_tpu.dynamo.tpu_backend


@pytest.mark.multiprocess
def test_entry_points_resolve_backend_without_import(tmp_path):
    """As installed: torch's device autoload and Dynamo's backend entry point (pyproject.toml) make
    backend="tpu" work after `import torch` alone."""
    import tomllib
    root = os.path.join(os.path.dirname(__file__), "..")
    eps = tomllib.load(open(os.path.join(root, "pyproject.toml"), "rb"))["project"]["entry-points"]
    dist = tmp_path / "torch_tpu-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_tpu\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) for group, items in eps.items()))
    prog = ("import warnings; warnings.filterwarnings('ignore'); import torch\n"
            "f = torch.compile(lambda x: x.cos() * 2, backend='tpu')\n"
            "x = torch.ones(3, device='tpu')\n"
            "print(f(x).cpu().tolist())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.path.abspath(root)]),
           "TORCH_LOGS": "+torch_tpu"}
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "compiled inference graph" in r.stderr  # TORCH_LOGS shows what the backend compiled
    assert json.loads(r.stdout.strip().splitlines()[-1]) == pytest.approx([2 * torch.cos(torch.tensor(1.0)).item()] * 3)


@torch_tpu.eager_mode("strict")  # counts host syncs: debug mode waits after every launch
def test_graph_index_bounds_are_checked_on_the_device():
    """Index inputs of a compiled graph are bounds-checked inside the program, with no host sync (XLA
    alone would clamp): a bad index raises CPU's error at the next synchronisation, naming the op,
    and the inputs the graph writes keep their values."""
    emb = torch.randn(10, 4, device=TPU)
    f = torch.compile(lambda w, i: torch.nn.functional.embedding(i, w) * 2, backend="tpu")
    idx = torch.tensor([1, 2, 9], device=TPU)
    torch.testing.assert_close(f(emb, idx).cpu(), emb.cpu()[[1, 2, 9]] * 2)
    before = torch_tpu.metrics.counters()["host_syncs"]
    idx[0] = 10
    out = f(emb, idx)
    f(emb, torch.tensor([-11, 0], device=TPU))
    assert torch_tpu.metrics.counters()["host_syncs"] == before  # nothing downloaded to check
    with pytest.raises(IndexError, match="index out of range in self[\\s\\S]*aten::embedding"):
        out.cpu()
    torch.testing.assert_close(f(emb, idx.clamp(max=9)).cpu(), emb.cpu()[[9, 2, 9]] * 2)  # cleared

    def add_at(w, i):
        w.index_add_(0, i, torch.ones(i.shape[0], device=w.device))
        return w * 2

    w = torch.zeros(5, device=TPU)
    g = torch.compile(add_at, backend="tpu")
    g(w, torch.tensor([0, 1], device=TPU))
    g(w, torch.tensor([0, 7], device=TPU))
    with pytest.raises(RuntimeError, match="index 7 is out of bounds for dimension 0 with size 5"):
        torch.tpu.synchronize()
    torch.testing.assert_close(w.cpu(), torch.tensor([1., 1., 0., 0., 0.]))  # the bad call wrote nothing


def test_explain_reports_graphs_and_breaks():
    def f(x):
        y = torch.relu(x) * 2
        torch._dynamo.graph_break()
        return y.sum()

    x = torch.randn(4, device=TPU)
    report = torch._dynamo.explain(f)(x)
    assert report.graph_count == 2 and report.graph_break_count == 1
    torch.testing.assert_close(torch.compile(f, backend="tpu")(x).cpu(), f(x.cpu()))


def test_complex_views_and_fft_compile_whole():
    def f(x):
        c = torch.view_as_complex(x)
        y = torch.fft.fft(c * c, dim=-1)
        return torch.view_as_real(y).sum(-1), y.abs()

    x = torch.randn(3, 8, 2)
    got = torch.compile(f, backend="tpu", fullgraph=True)(x.to(TPU))
    for g, w in zip(got, f(x)):
        torch.testing.assert_close(g.cpu(), w, atol=1e-4, rtol=1e-4)


def test_graph_with_a_tensor_created_in_it_trains():
    """torch.tensor(data, device="tpu") inside a compiled function becomes a get_attr constant of
    the graph (lift_fresh_copy of it). AOTAutograd calls the compiler inside its FakeTensorMode, and
    the constant must still be copied for real: Hugging Face's GPT-2 forward graph, whose cache makes
    `torch.tensor([])`, failed to lower and ran eagerly without it."""
    def f(x):
        return torch.cat([torch.tensor([], device=x.device), x * 2]).square().sum()

    x = torch.randn(5, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_()
    got = torch.compile(f, backend="tpu", fullgraph=True)(xt)
    got.backward()
    want = f(x)
    want.backward()
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(xt.grad.cpu(), x.grad)


def test_sort_compiles_without_a_graph_break():
    """torch.sort in a graph is aten.sort.default (MoE routers sort their expert ids)."""
    def f(x):
        v, i = torch.sort(x, dim=-1, descending=True)
        return v * 2, i

    x = torch.tensor([[3.0, 1.0, 3.0, 2.0], [0.0, -1.0, 5.0, 0.0]])
    got = torch.compile(f, backend="tpu", fullgraph=True)(x.to("tpu"))
    want = f(x)
    torch.testing.assert_close(got[0].cpu(), want[0])
    assert torch.equal(got[1].cpu(), want[1])


def test_compile_modes_run_without_a_warning_and_an_unknown_mode_is_refused():
    # transformers compiles decode steps with mode="reduce-overhead": the same one-executable graph.
    import logging
    x = torch.randn(4, 3)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    dynamo_log = logging.getLogger("torch._dynamo")  # where "backend ignoring extra kwargs" is logged
    dynamo_log.addHandler(handler)
    try:
        for mode in ("reduce-overhead", "max-autotune"):
            torch._dynamo.reset()
            f = torch.compile(lambda t: t.sin() * 2 + 1, backend="tpu", mode=mode)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = f(x.to("tpu"))
            torch.testing.assert_close(out.cpu(), x.sin() * 2 + 1)
            said = [str(w.message) for w in caught] + [r.getMessage() for r in records]
            assert not [m for m in said if "mode" in m], said
    finally:
        dynamo_log.removeHandler(handler)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unrecognized mode='fastest'"):
        torch.compile(lambda t: t + 1, backend="tpu", mode="fastest")(x.to("tpu"))
