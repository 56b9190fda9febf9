"""torch_tpu.aot: TPU topologies, steps compiled for them by libtpu without a TPU, their reports, the
executable cache key a TPU runtime finds, refusals, Mosaic kernels and the topology-aware mesh on
libtpu's own device descriptions."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu
from torch_tpu import aot, compile_cache, plugins, runtime
from torch_tpu.distributed import mesh as tm
from torch_tpu import tpu_refusals

from tests.helpers import strict_env

pytestmark = [pytest.mark.libtpu,
              pytest.mark.skipif(not plugins.TPU.find(), reason="libtpu is not installed (pip install 'torch_tpu[tpu]')")]

HERE = os.path.dirname(os.path.abspath(__file__))


def _mlp(device):
    torch.manual_seed(0)
    with torch.device(device):
        return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))


def _train_step(model, opt):
    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


# -- topologies -----------------------------------------------------------------------------------
def test_v5e_topology_devices_and_memory():
    t = aot.topology("v5e:2x2")
    assert [d.id for d in t.devices] == [0, 1, 2, 3]
    assert sorted(d.coords for d in t.devices) == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    assert {d.kind for d in t.devices} == {"TPU v5 lite"}
    assert all(d.core_on_chip == 0 and d.slice_index is None for d in t.devices)
    assert 16e9 < t.device_memory_bytes < 17e9
    assert aot.topology("v5e:2x2") is t  # one description per name


def test_v4_has_two_cores_per_chip_and_slices_have_their_own_ids():
    v4 = aot.topology("v4:2x2x1")
    assert len(v4.devices) == 8 and sorted({d.core_on_chip for d in v4.devices}) == [0, 1]
    two = aot.topology("v5e:2x2", num_slices=2)
    assert sorted(d.slice_index for d in two.devices) == [0] * 4 + [1] * 4
    assert len({d.id for d in two.devices}) == 8


def test_unknown_topology_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="v9:1x1"):
        aot.topology("v9:1x1")
    with pytest.raises(ValueError, match="generation"):
        aot.topology("v5e")
    with pytest.raises(ValueError, match="num_slices"):
        aot.topology("v5e:1x1", num_slices=0)


# -- compiling a step -------------------------------------------------------------------------------
@pytest.mark.slow
def test_meta_training_step_compiles_every_graph_and_runs_nothing():
    model = _mlp("meta")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 256, device="meta"), torch.randint(0, 10, (64,), device="meta")
    report = aot.compile(_train_step(model, opt), x, y, topology="v5e:1x1")
    names = [p.name.split(" [")[0] for p in report.programs]
    assert names == ["forward graph", "backward graph", "inference graph"], report
    assert report.ok, str(report)
    fw, bw, sgd = report.programs
    # 64x256x512 + 64x512x10 multiply-adds forward, about twice that backward.
    assert fw.flops >= 2 * 64 * (256 * 512 + 512 * 10)
    assert bw.flops >= fw.flops
    params = sum(p.numel() * 4 for p in model.parameters())
    assert sgd.argument_bytes >= 2 * params  # parameters and their gradients
    assert sgd.alias_bytes >= params          # the update is written in place (donated)
    assert report.fits and report.peak_bytes >= 2 * params
    assert all(p.device.type == "meta" for p in model.parameters())
    assert all(p.grad is None for p in model.parameters())  # zero_grad ran: the step finished
    table = str(report)
    assert "forward graph" in table and "backward graph" in table and "fits" in table


def test_traced_backward_compiles_forward_and_backward_as_one_program():
    # torch._dynamo.config.trace_autograd_ops (README, "torch.compile"): the step's forward and
    # backward are one TPU program, the optimizer's another; XLA keeps the activations between them
    # inside one program (fewer bytes than three programs).
    def report_of(traced):
        model = _mlp("meta")
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        x, y = torch.randn(64, 256, device="meta"), torch.randint(0, 10, (64,), device="meta")

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            loss = loss.detach()
            opt.step()
            return loss
        torch._dynamo.reset()  # the config is not among Dynamo's guards
        torch._dynamo.config.trace_autograd_ops = traced
        try:
            return aot.compile(step, x, y, topology="v5e:1x1")
        finally:
            torch._dynamo.config.trace_autograd_ops = False
            torch._dynamo.reset()
    fused, usual = report_of(True), report_of(False)
    assert fused.ok and usual.ok, (fused, usual)
    assert len(fused.programs) == 2 and len(usual.programs) > 2, (fused, usual)
    # named for what it is (AOTAutograd hands it to its inference compiler): not "inference graph"
    assert [p.name.split(" [")[0] for p in fused.programs] == ["forward+backward graph", "inference graph"], fused
    assert fused.flops == pytest.approx(usual.flops, rel=0.05)
    assert fused.bytes_accessed < usual.bytes_accessed


def test_tpu_training_step_writes_nothing():
    model = _mlp("tpu")
    before = [p.detach().cpu().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 256, device="tpu"), torch.randint(0, 10, (64,), device="tpu")
    report = aot.compile(_train_step(model, opt), x, y, topology="v5e:1x1")
    assert report.ok, str(report)
    assert any(p.name.startswith("backward") for p in report.programs)
    for b, p in zip(before, model.parameters()):
        assert torch.equal(b, p.detach().cpu())


@pytest.mark.slow
def test_live_bytes_count_the_steps_tensors_not_what_our_programs_keep():
    """A program's live bytes are the step's other tensors on its device. Our lowered graphs kept the
    meta example tensors of their values, which on the meta device counted as alive: a GPT-2 small
    step (8 x 1024, AdamW) read 17.3 GiB, "DOES NOT FIT" a v5e, where 13.3 GiB is right."""
    model = _mlp("meta")
    x, y = torch.randn(64, 256, device="meta"), torch.randint(0, 10, (64,), device="meta")
    assert aot.compile(_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1)), x, y,
                       topology="v5e:1x1").ok
    other = _mlp("meta")

    @torch.no_grad()
    def forward(x):
        return other(x)
    (fw,) = aot.compile(forward, x, topology="v5e:1x1").programs
    # alive beside the forward's arguments (x, other's parameters): the first model and y
    assert fw.live_bytes == sum(p.numel() * 4 for p in model.parameters()) + y.numel() * 8, fw


def test_a_model_that_does_not_fit_says_so():
    # 1.6e9 float32 parameters (6.4 GB) and their gradients and AdamW's two moments: 25.6 GB > 16.9 GB.
    with torch.device("meta"):
        model = nn.Linear(40000, 40000, bias=False)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(8, 40000, device="meta")

    def step(x):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    report = aot.compile(step, x, topology="v5e:1x1")
    assert not report.fits and report.peak_bytes > report.device_memory_bytes
    assert report.headroom_bytes < 0
    assert "DOES NOT FIT" in str(report)
    # libtpu itself refuses the optimizer's program: its temporaries exceed the chip's memory.
    failed = [p for p in report.programs if p.error]
    assert [p.name.split(" [")[0] for p in failed] == ["inference graph"], str(report)
    assert "HBM" in failed[0].error
    bigger = aot.compile(step, x, topology="v6e:1x1")  # 33.5 GB per chip
    assert bigger.ok and bigger.fits, str(bigger)


def test_unlowerable_graph_is_a_failed_program_not_an_exception():
    def f(x):
        return torch.linalg.eig(x)[0].real.sum() + x.sum()  # eig has no tpu lowering
    report = aot.compile(f, torch.randn(4, 4, device="meta"), topology="v5e:1x1")
    assert not report.ok
    failed = [p for p in report.programs if p.error]
    assert failed and "eig" in failed[0].error


def test_complex128_fft_is_refused_with_op_and_dtype():
    report = aot.compile(lambda x: torch.fft.fft(x) * 2, torch.randn(8, dtype=torch.complex128, device="meta"),
                         topology="v5e:1x1")
    assert not report.ok
    assert "stablehlo.fft" in report.programs[0].error and "complex128" in report.programs[0].error
    ok = aot.compile(lambda x: torch.fft.fft(x) * 2, torch.randn(8, dtype=torch.complex64, device="meta"))
    assert ok.ok, str(ok)


def test_refusal_rules():
    assert plugins.TPU.refusal is tpu_refusals.refusal  # the plugin table names TPU's rules
    assert plugins.CPU.refusal is None and plugins.CUDA.refusal is None
    fft = ('%v1 = "stablehlo.fft"(%arg0) {fft_type = #stablehlo<fft_type RFFT>, fft_length = array<i64: 8>} : '
           '(tensor<8xf64>) -> tensor<5xcomplex<f64>>')
    assert "float64" in tpu_refusals.refusal(fft)
    assert tpu_refusals.refusal(fft.replace("f64", "f32")) is None
    ar = ('%v2 = "stablehlo.all_reduce"(%v1) ({...}) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : '
          '(tensor<4xf32>) -> tensor<4xf32>')
    assert "device 1" in tpu_refusals.refusal(ar)
    assert tpu_refusals.refusal(ar, num_devices=2) is None
    dot = ('%v5 = "stablehlo.dot_general"(%v1, %v4) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions '
           '= [1], rhs_contracting_dimensions = [0]>} : (tensor<2x3xi64>, tensor<3x2xi64>) -> tensor<2x2xi64>')
    assert "int64" in tpu_refusals.refusal(dot) and "stablehlo.dot_general" in tpu_refusals.refusal(dot)
    assert tpu_refusals.refusal(dot.replace("i64", "i32")) is None
    algo = ('%4 = stablehlo.dot_general %1, %2, contracting_dims = [1] x [0], algorithm = <lhs_precision_type = f32, '
            'rhs_precision_type = f32, accumulation_type = f32, lhs_component_count = 1, rhs_component_count = 1, '
            'num_primitive_operations = 1, allow_imprecise_accumulation = false> : (tensor<2x3xf32>, tensor<3x2xf32>) '
            '-> tensor<2x2xf32>')
    assert "F32_F32_F32" in tpu_refusals.refusal(algo) and "HIGHEST" in tpu_refusals.refusal(algo)
    assert tpu_refusals.refusal(algo.replace("num_primitive_operations = 1", "num_primitive_operations = 6")) is None


def test_int64_matmul_is_refused_for_tpu_where_libtpu_rejects_it():
    # libtpu itself rejects it ("... not contain X64 element types ... not implemented"): the report
    # says why in the user's terms instead.
    report = aot.compile(lambda a, b: a @ b, torch.ones(4, 4, dtype=torch.long, device="meta"),
                         torch.ones(4, 4, dtype=torch.long, device="meta"))
    assert not report.ok and "int64" in report.programs[0].error, str(report)
    assert aot.compile(lambda a, b: a @ b, torch.ones(4, 4, dtype=torch.int32, device="meta"),
                       torch.ones(4, 4, dtype=torch.int32, device="meta")).ok


def test_attention_forward_compiles_for_tpu():
    # A decoder block's forward (attention's softmax: a max-reduce, exp, divide, then more matmuls)
    # crashed libtpu 0.0.52's fusion pass while the max-reduce's body carried explicit is-NaN selects;
    # the body is the bare stablehlo.maximum now (XLA's max propagates NaN).
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    from tiny_models import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(vocab=256, dim=64, ctx=32).to("meta")

    @torch.no_grad()
    def forward(i):
        return model(i)

    report = aot.compile(forward, torch.zeros(16, 32, dtype=torch.long, device="meta"), topology="v5e:1x1")
    assert report.ok, str(report)
    assert "stablehlo.select" not in report.programs[0].text.split('"stablehlo.maximum"')[1].split("stablehlo.return")[0]


def test_a_libtpu_crash_costs_one_program_not_the_process():
    # libtpu 0.0.52 (the version the `tpu` extra pins) dies of SIGSEGV in its fusion pass
    # (TpuPriorityFusionQueue) on this program: our old softmax lowering inside a decoder block,
    # reduced to the 35 ops that still crash it. A real crash, in a compile worker.
    with open(os.path.join(HERE, "data", "libtpu_0.0.52_fusion_crash.mlir")) as f:
        text = f.read()
    with pytest.raises(aot.CompilerCrash, match=r"libtpu crashed \(SIGSEGV\)") as crash:
        aot.topology("v5e:1x1").compile(text)
    path = str(crash.value).split("kept in ")[1].split(" for a bug report")[0]
    with open(path) as f:
        assert f.read() == text
    os.unlink(path)
    # This process never saw the crash, and the next program gets a fresh worker.
    ok = aot.compile(lambda x: x * 2 + 1, torch.randn(8, device="meta"), topology="v5e:1x1")
    assert ok.ok, str(ok)
    # A compile error that is libtpu's answer, not a crash, stays a RuntimeError with its message.
    with pytest.raises(RuntimeError, match="PJRT_Compile failed") as err:
        aot.topology("v5e:1x1").compile("module { this is not stablehlo }")
    assert not isinstance(err.value, aot.CompilerCrash)


# -- a TPU job that starts warm ----------------------------------------------------------------------
@pytest.mark.slow
def test_runtime_key_for_a_tpu_is_the_key_aot_writes(tmp_path):
    topo = aot.topology("v5e:1x1")
    # A TPU VM's runtime: platform "tpu", libtpu's version string for its client, its own install path.
    on_tpu = compile_cache.target_identity("tpu", topo.platform_version, tuple(topo._t.api_version),
                                     "/opt/venv/lib/python3.11/site-packages/libtpu/libtpu.so")
    assert on_tpu == topo.identity()
    # The XLA flag torch_tpu sets for the CPU plugin here (NaN-propagating max) is not part of the key
    # a TPU VM's runtime computes, where it is never set.
    assert "fast_min_max" in os.environ["XLA_FLAGS"] and "fast_min_max" not in on_tpu
    # The CPU plugin's executables are keyed by their file as well.
    assert compile_cache.target_identity("cpu", "v", (0, 81), "/a.so") != compile_cache.target_identity("cpu", "v", (0, 81), "/b.so")

    # strict eager: the programs compiled besides the graphs are per-op ones, as on a TPU VM by default
    with torch_tpu.eager_mode("strict"):
        model = _mlp("tpu")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step = _train_step(model, opt)
        x, y = torch.randn(64, 256, device="tpu"), torch.randint(0, 10, (64,), device="tpu")
        report = aot.compile(step, x, y, topology=topo, cache=tmp_path)
        assert report.cached == [str(tmp_path)]
        written = {p.name for p in tmp_path.iterdir()}
        assert {p.key + ".xla" for p in report.programs} <= written
        # The programs torch.compile(backend="tpu") builds for the same step, keyed for this target, are
        # exactly the entries written: a TPU job with this directory as its tier 3 compiles none of them.
        built = []
        runtime._SHADOW, previous = (lambda program, name: built.append(program)), runtime._SHADOW
        try:
            torch._dynamo.reset()
            torch.compile(step, backend="tpu")(x, y)
        finally:
            runtime._SHADOW = previous
        # (aot's trace ran the optimizer's first-step set-up once, so this run may trace one graph fewer.)
        assert len(built) >= 3 and set(built) <= {p.text for p in report.programs}
        assert {topo.key(t) + ".xla" for t in built} <= written


def _attention_step(model):
    def step(x):
        h = model(x)
        loss = (torch.softmax(h @ h.transpose(1, 2), -1) @ h).pow(2).mean()
        loss.backward()
        return loss
    return step


@pytest.mark.slow
def test_a_marked_length_compiles_every_bucket_of_its_range(tmp_path):
    """mark_dynamic(x, 1, min=2, max=64): the forward and the backward are compiled for the buckets 16,
    32 and 64 of the length, and the runtime's bucketed programs for lengths across that range (the
    job marking the same size) are exactly entries written to the cache."""
    topo = aot.topology("v5e:1x1")
    with torch_tpu.eager_mode("strict"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)).to("tpu")
        step = _attention_step(model)
        x = torch.randn(2, 20, 16, device="tpu")
        torch._dynamo.mark_dynamic(x, 1, min=2, max=64)
        report = aot.compile(step, x, topology=topo, cache=tmp_path)
        assert report.ok, str(report)
        names = [p.name for p in report.programs]
        assert [n.split(" bucket ")[1].split("<=")[1] for n in names] == ["16", "32", "64"] * 2, names
        assert all(n.startswith("forward") for n in names[:3]) and all(n.startswith("backward") for n in names[3:])
        built = []
        keep = lambda program, name: built.append(program) if " graph" in name else None  # noqa: E731  (not eager ops)
        runtime._SHADOW, previous = keep, runtime._SHADOW
        try:
            torch._dynamo.reset()
            f = torch.compile(step, backend="tpu")
            for n in (5, 20, 40, 64):
                x = torch.randn(2, n, 16, device="tpu")
                torch._dynamo.mark_dynamic(x, 1, min=2, max=64)
                f(x)
        finally:
            runtime._SHADOW = previous
        assert len(built) == 6 and set(built) == {p.text for p in report.programs}
        assert {topo.key(t) + ".xla" for t in built} <= {p.name for p in tmp_path.iterdir()}
        # Marked without a largest value: there is no range to compile; the report says what to do.
        torch._dynamo.reset()
        x = torch.randn(2, 20, 16, device="tpu")
        torch._dynamo.mark_dynamic(x, 1)
        report = aot.compile(step, x, topology=topo)
        assert not report.ok and "mark_dynamic(tensor, dim, min=..., max=...)" in report.programs[0].error


def test_a_bucketed_program_moves_rows_not_elements():
    """A bucketed graph's inputs and outputs cross its boundary compact and are relaid out inside it
    (dynamo/relayout.py). By rows, libtpu counts the bucketed forward + backward of an attention step at
    a small multiple of the static program's bytes (measured: about 2x); gathered element by element
    they were about 1000x (a TPU moves a gathered element as a whole tile)."""
    topo = aot.topology("v5e:1x1")
    torch.manual_seed(0)
    step = _attention_step(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)).to("meta"))
    moved = {}
    for marked in (False, True):
        torch._dynamo.reset()
        x = torch.randn(2, 64, 16, device="meta")
        if marked:
            torch._dynamo.mark_dynamic(x, 1, min=33, max=64)  # one bucket: 64
        report = aot.compile(step, x, topology=topo)
        assert report.ok, str(report)
        moved[marked] = sum(p.bytes_accessed for p in report.programs)
    assert moved[True] < 4 * moved[False], moved


def test_cache_argument_is_checked():
    with pytest.raises(TypeError, match="cache"):
        aot.compile(lambda x: x + 1, torch.randn(2, device="meta"), cache=3)


# -- Mosaic kernels ----------------------------------------------------------------------------------
def test_pallas_kernel_compiles_for_mosaic_on_tpu_targets():
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    from torch_tpu.pallas import jax_op

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + 1.0

    op = jax_op("aot_test::double_plus_one",
                lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x))
    import jax  # noqa: F401  (the lambda's jax.ShapeDtypeStruct)
    report = aot.compile(lambda x: op(x).sum(), torch.randn(8, 128, device="meta"), topology="v5e:1x1")
    assert report.ok, str(report)
    assert report.programs[0].mosaic_kernels == 1
    assert "tpu_custom_call" in report.programs[0].text
    # Locally (the CPU plugin) the same op still runs in interpret mode.
    x = torch.randn(8, 128, device="tpu")
    torch.testing.assert_close(op(x).cpu(), x.cpu() * 2 + 1)


# -- the topology-aware mesh on libtpu's descriptions ------------------------------------------------
def _neighbours(a, b) -> bool:
    pa, pb = a.coords + (a.core_on_chip,), b.coords + (b.core_on_chip,)
    if a.slice_index != b.slice_index:
        return False
    return sorted(abs(x - y) for x, y in zip(pa, pb))[-2:] == [0, 1]


@pytest.mark.parametrize("name, num_slices, shape, dcn", [
    ("v5e:2x2", 1, (2, 2), None),
    ("v5e:4x4", 1, (4, 4), None),
    ("v6e:4x4", 1, (4, 4), None),
    ("v4:2x2x2", 1, (2, 2, 2, 2), None),   # the last axis: the two cores of a chip
    ("v5p:2x2x2", 1, (2, 2, 2), None),     # megacore: one device per chip
    ("v5e:2x2", 2, (2, 2), (2, 1)),
])
def test_topology_aware_mesh_on_libtpu_topologies(name, num_slices, shape, dcn):
    devices = aot.topology(name, num_slices=num_slices).devices
    kwargs = {"topology": "multi_slice", "dcn_mesh_shape": dcn} if dcn else {}
    layout = tm.rank_layout([d.description for d in devices], shape, **kwargs)
    assert sorted(layout.flatten().tolist()) == list(range(len(devices)))
    # Slice s is the block of axis 0 at s * shape[0] (its DCN position, outside the mesh axis).
    blocks = [layout] if dcn is None else list(layout.reshape(dcn[0], *shape))
    for block in blocks:
        assert len({devices[r].slice_index for r in block.flatten().tolist()}) == 1
        for axis in range(block.dim()):  # along every mesh axis, consecutive ranks are ICI neighbours
            for line in block.movedim(axis, -1).reshape(-1, block.shape[axis]).tolist():
                for r, s in zip(line, line[1:]):
                    assert _neighbours(devices[r], devices[s]), (name, axis, devices[r], devices[s])


# -- collectives across a topology's devices ------------------------------------------------------------
# What each tpu_dist collective becomes on a TPU (torch_tpu.lowering.collectives, the programs that
# device_collectives runs on the CPU plugin's devices): (kind, dtype, options).
_COLLECTIVES = [("all_reduce", torch.float32, {}), ("all_reduce", torch.bfloat16, {"op": "avg"}),
                ("all_reduce", torch.int32, {"op": "max"}), ("all_reduce", torch.int32, {"op": "band"}),
                ("reduce", torch.float32, {"root": 1}), ("broadcast", torch.float32, {"root": 1}),
                ("broadcast", torch.bool, {}), ("broadcast", torch.complex64, {}), ("all_gather", torch.float32, {}),
                ("reduce_scatter", torch.float32, {}), ("all_to_all", torch.bfloat16, {}), ("permute", torch.float32, {})]


@pytest.mark.parametrize("name, num_slices, every", [("v5e:2x2", 1, True), ("v4:2x2x2", 1, False),
                                                     ("v5e:2x2", 2, False)])
def test_collectives_compile_across_every_device_of_a_topology(name, num_slices, every):
    # One replica per device, on the topology's own device ids (multi-slice ids included): 4, 16 and
    # 2 x 4 devices. Every program on v5e:2x2; one of each kind on the others.
    from torch_tpu.lowering import collectives
    topo = aot.topology(name, num_slices=num_slices)
    ids = [d.id for d in topo.devices]
    n = len(ids)
    seen = set()
    for kind, dtype, kw in _COLLECTIVES:
        if not every and kind in seen:
            continue
        seen.add(kind)
        if kind == "permute":
            kw = {"pairs": [(i, (i + 1) % n) for i in range(n)]}
        text = collectives.program(kind, (4 * n, 2), dtype, n, **kw)
        c = topo.compile(text, devices=ids)
        assert c["serialized"] and c["cost"]["bytes accessed"] > 0, (name, kind, dtype, kw)
    if every:  # two groups of two: the groups' devices need not be the program's all
        text = collectives.program("all_reduce", (8,), torch.float32, n, groups=[[0, 2], [1, 3]])
        assert topo.compile(text, devices=ids)["serialized"]
    # Replica groups beyond the devices given are refused before libtpu sees them.
    text = collectives.program("all_reduce", (8,), torch.float32, n)
    with pytest.raises(TypeError, match=f"names device {n - 1}"):
        topo.compile(text, devices=ids[:-1])
    with pytest.raises(ValueError, match="distinct device ids"):
        topo.compile(collectives.program("all_reduce", (8,), torch.float32, 2), devices=[ids[0], ids[0]])


def test_collective_broadcast_is_refused_for_tpu():
    # TPU has no collective_broadcast; tpu_dist's broadcast is an all_reduce (lowering/collectives.py).
    text = ('module @b {\n  func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n    %0 = '
            '"stablehlo.collective_broadcast"(%x) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : '
            '(tensor<4xf32>) -> tensor<4xf32>\n    "func.return"(%0) : (tensor<4xf32>) -> ()\n  }\n}\n')
    topo = aot.topology("v5e:2x2")
    with pytest.raises(TypeError, match="all_reduce"):
        topo.compile(text, devices=[d.id for d in topo.devices][:2])


@pytest.fixture
def fake_world():
    """A 4-rank job seen from rank 0, with nothing to talk to: PyTorch's fake process group (how a
    sharded step is traced on one machine)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("cpu:fake,tpu:fake", store=FakeStore(), rank=0, world_size=4)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_replica_groups_of_mesh_dimensions(fake_world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch_tpu.lowering.collectives import group_replicas
    mesh = init_device_mesh("tpu", (2, 2))
    assert group_replicas(mesh.get_group(0).group_name) == ([[0, 2], [1, 3]], 4)
    assert group_replicas(mesh.get_group(1).group_name) == ([[0, 1], [2, 3]], 4)
    import torch.distributed as dist
    assert group_replicas(dist.group.WORLD.group_name) == ([[0, 1, 2, 3]], 4)
    odd = dist.new_group([0, 1, 3])
    with pytest.raises(ValueError, match="does not tile"):
        group_replicas(odd.group_name)


def test_a_graph_with_collectives_is_one_program_over_the_jobs_devices(fake_world):
    # Functional collectives on a 2 x 2 mesh, compiled into the graph's own module for v5e:2x2:
    # replica k runs rank k, each mesh dimension's groups as replica groups.
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("tpu", (2, 2))
    rows, cols = mesh.get_group(0), mesh.get_group(1)

    def f(x, w):
        y = funcol.all_reduce(x @ w, "sum", rows)
        z = funcol.all_gather_tensor(y, 0, cols)
        return funcol.reduce_scatter_tensor(z.relu(), "avg", 0, cols).sum()
    report = aot.compile(f, torch.randn(8, 4, device="meta"), torch.randn(4, 4, device="meta"), topology="v5e:2x2")
    assert report.ok, report
    (prog,) = report.programs
    assert prog.replicas == 4 and prog.flops > 0
    assert "replica_groups = dense<[[0, 2], [1, 3]]>" in prog.text
    assert "replica_groups = dense<[[0, 1], [2, 3]]>" in prog.text
    # Four ranks do not fit one device: said in the report, not raised.
    small = aot.compile(f, torch.randn(8, 4, device="meta"), torch.randn(4, 4, device="meta"), topology="v5e:1x1")
    assert not small.ok and "4 ranks" in small.programs[0].error


def test_a_pipeline_stages_graph_spans_its_stages_ranks(fake_world):
    # Stage groups {0, 1} and {2, 3}: rank 0's graph runs on ranks 0 and 1 only (the other stage runs
    # other programs), a mesh's groups on the whole world.
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch_tpu.lowering.collectives import replica_span
    stage = dist.new_group([0, 1])
    dist.new_group([2, 3])  # the other stage's group (rank 0 is not in it)
    pairs = dist.new_group([0, 2])
    assert replica_span([stage.group_name]) == [0, 1]
    assert replica_span([stage.group_name], rank=1) == [0, 1]
    assert replica_span([stage.group_name, pairs.group_name]) == [0, 1, 2, 3]
    report = aot.compile(lambda x: funcol.all_reduce(x * 2, "sum", stage), torch.randn(8, device="meta"),
                         topology="v5e:2x2")
    assert report.ok, report
    (prog,) = report.programs
    assert prog.replicas == 2 and prog.ranks == (0, 1)
    assert "replica_groups = dense<[[0, 1]]>" in prog.text


@pytest.mark.slow
def test_tensor_parallel_training_step_compiles_for_tpu(fake_world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("tpu", (4,))
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).to("tpu")
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    report = aot.compile(step, torch.randn(16, 64, device="tpu"), topology="v5e:2x2")
    assert report.ok, report
    forward = [p for p in report.programs if p.name.startswith("forward")]
    # RowwiseParallel's output all_reduce runs inside the forward program, across the 4 devices.
    assert forward and forward[0].replicas == 4 and '"stablehlo.all_reduce"' in forward[0].text


# -- shadow mode ----------------------------------------------------------------------------------------
def _shadow_job(tmp_path, source: str):
    """Runs `source` as a script under shadow mode (v5e:1x1) with a report file; returns (its stdout,
    the report's path). Fails on a non-zero exit."""
    script = tmp_path / "job.py"
    script.write_text(source)
    log = tmp_path / "shadow.jsonl"
    env = strict_env(dict(os.environ, TORCH_TPU_SHADOW_TOPOLOGY="v5e:1x1", TORCH_TPU_SHADOW_REPORT=str(log),
                          TORCH_TPU_DISK_CACHE="0"))  # (strict: the reports below name per-op programs)
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout, log


@pytest.mark.multiprocess
@pytest.mark.slow
def test_shadow_mode_compiles_every_program_for_tpu(tmp_path):
    stdout, log = _shadow_job(
        tmp_path,
        "import torch, torch_tpu\n"
        "from torch_tpu import aot\n"
        "x = torch.randn(16, 16, device='tpu')\n"
        "(x @ x + 1).relu().sum().item()\n"
        "torch.compile(lambda a: (a * 2).sin(), backend='tpu')(x).cpu()\n"
        "torch.fft.fft(torch.randn(8, dtype=torch.complex128, device='tpu')).cpu()\n"
        "r = aot.shadow_report()\n"
        "print('COMPILED', r.compiled)\n"
        "print('REFUSED', [f.program for f in r.refused])\n"
        "print('FAILED', [f.program for f in r.failures if not f.refused])\n")
    lines = dict(line.split(" ", 1) for line in stdout.splitlines() if line.split(" ")[0] in
                 ("COMPILED", "REFUSED", "FAILED"))
    assert int(lines["COMPILED"]) >= 5, stdout
    assert "fft" in lines["REFUSED"], stdout
    assert lines["FAILED"] == "[]", stdout
    total = aot.shadow.summarize(str(log))
    assert total.compiled == int(lines["COMPILED"]) and len(total.refused) == 1


@pytest.mark.multiprocess
@pytest.mark.slow
def test_programs_queued_at_exit_are_compiled_by_summarize(tmp_path):
    # The job exits while its shadow compiles are queued (each made slow here): exit does not wait;
    # the queued programs are left in <report>.pending/ and `python -m torch_tpu.aot` compiles them.
    stdout, log = _shadow_job(
        tmp_path,
        "import time, torch, torch_tpu\n"
        "from torch_tpu import aot\n"
        "sh = aot.shadow._active\n"
        "fast = sh.topology.compile\n"
        "sh.topology.compile = lambda program, **kw: (time.sleep(0.5), fast(program, **kw))[1]\n"
        "for k in range(6):\n"
        "    torch.ones(k + 1, device='tpu').sum().item()\n"
        "print('SEEN', len(sh.seen))\n")
    seen = int(next(line.split()[1] for line in stdout.splitlines() if line.startswith("SEEN")))
    line = json.loads(log.read_text())
    left = os.listdir(str(log) + ".pending")
    assert seen >= 6 and line["pending"] == len(left) and line["compiled"] + line["pending"] == seen, (line, seen)
    total = aot.shadow.summarize(str(log))
    assert total.compiled == seen and not total.failures and total.pending == 0, total
    assert total.after_exit == len(left) and not os.listdir(str(log) + ".pending")


def test_shadow_report_when_off_says_how_to_turn_it_on():
    if aot.shadow._active is not None:
        pytest.skip("shadow mode is on in this process")
    with pytest.raises(RuntimeError, match="TORCH_TPU_SHADOW_TOPOLOGY"):
        aot.shadow_report()
