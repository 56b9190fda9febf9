"""PyTorch's core ATen opset runs natively on tpu: every overload has a lowering or a tpu kernel, or
is one of PyTorch's composite kernels whose ops do; none needs the CPU fallback."""
import pytest
import torch

import torch_tpu
from helpers import TPU
from opinfo.core_aten import classify, core_overloads, overload_name

aten = torch.ops.aten


def test_every_core_op_is_native():
    kinds = {overload_name(op): classify(op) for op in core_overloads()}
    assert len(kinds) > 180
    bad = sorted(n for n, k in kinds.items() if k in ("missing", "decomposed"))
    assert not bad, f"core ATen ops without a native tpu implementation: {bad}"


def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


# A call of each composite core overload: (overload, function of the device, compare values?).
COMPOSITE = [
    ("_to_copy", lambda d: aten._to_copy(_x(3, 4).to(d), dtype=torch.float16), True),
    ("adaptive_avg_pool1d", lambda d: aten.adaptive_avg_pool1d(_x(2, 3, 10).to(d), [4]), True),
    ("arange.start_step", lambda d: aten.arange.start_step(1, 10, 2, device=d), True),
    ("avg_pool1d", lambda d: aten.avg_pool1d(_x(2, 3, 10).to(d), [3], [2]), True),
    ("diagonal", lambda d: aten.diagonal(_x(4, 5).to(d), 1) * 1, True),
    ("expand", lambda d: aten.expand(_x(3, 1).to(d), [3, 4]) * 1, True),
    ("full", lambda d: aten.full([2, 3], 1.5, device=d), True),
    ("full_like", lambda d: aten.full_like(_x(2, 3).to(d), 7), True),
    ("permute", lambda d: aten.permute(_x(2, 3, 4).to(d), [2, 0, 1]) + 1, True),
    ("rand", lambda d: aten.rand([64], device=d).clamp(0, 1).shape, False),
    ("randn", lambda d: aten.randn([64], device=d).isfinite().all(), False),
    ("randperm", lambda d: aten.randperm(16, device=d).sort().values, True),
    ("scalar_tensor", lambda d: aten.scalar_tensor(3.5, device=d), True),
    ("select.int", lambda d: aten.select.int(_x(3, 4).to(d), 1, 2) * 2, True),
    ("slice.Tensor", lambda d: aten.slice.Tensor(_x(6, 4).to(d), 0, 1, 5, 2) * 2, True),
    ("slice_scatter", lambda d: aten.slice_scatter(_x(6, 4).to(d), _x(2, 4).to(d) + 1, 0, 1, 5, 2), True),
    ("sort", lambda d: aten.sort(_x(5, 6).to(d), 1), True),
    ("split_with_sizes", lambda d: [t * 1 for t in aten.split_with_sizes(_x(6, 4).to(d), [2, 4])], True),
    ("squeeze.dim", lambda d: aten.squeeze.dim(_x(3, 1).to(d), 1) * 1, True),
    ("squeeze.dims", lambda d: aten.squeeze.dims(_x(1, 3, 1).to(d), [0, 2]) * 1, True),
    ("unsqueeze", lambda d: aten.unsqueeze(_x(3).to(d), 0) * 1, True),
    ("upsample_bilinear2d.vec", lambda d: aten.upsample_bilinear2d.vec(_x(1, 2, 3, 4).to(d), [6, 8], False, None),
     True),
    ("upsample_nearest2d.vec", lambda d: aten.upsample_nearest2d.vec(_x(1, 2, 3, 4).to(d), [6, 8], None), True),
    ("var.dim", lambda d: aten.var.dim(_x(4, 5).to(d), [1]), True),
]


@pytest.mark.parametrize("name,fn,compare", COMPOSITE, ids=[c[0] for c in COMPOSITE])
def test_composite_core_op_stays_on_tpu(name, fn, compare):
    before = sum(torch_tpu.metrics.fallback_counts().values())
    got = fn(TPU)
    assert sum(torch_tpu.metrics.fallback_counts().values()) == before, torch_tpu.metrics.fallback_counts()
    if compare:
        want = fn(torch.device("cpu"))
        got, want = (got, want) if isinstance(got, (list, tuple)) else ([got], [want])
        for g, w in zip(got, want):
            assert g.device.type == "tpu"
            torch.testing.assert_close(g.cpu(), w)
    else:
        assert bool(got) if isinstance(got, torch.Tensor) else got == torch.Size([64])


def test_every_composite_core_op_is_exercised():
    composite = {overload_name(op) for op in core_overloads() if classify(op) == "composite"}
    composite = {n for n in composite if not n.startswith("sym_")}  # SymInt queries: no tensors made
    assert composite <= {c[0] for c in COMPOSITE}, composite - {c[0] for c in COMPOSITE}
