"""aten::_grouped_mm (torch.nn.functional.grouped_mm, Mixture-of-Experts layers) on tpu against
PyTorch's CPU kernel: every layout forward and backward, eager (strict, fused) and compiled,
float32 and bfloat16 (float16 eager), empty groups, rows past the last offset, and CPU's errors."""
import re

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_tpu
from helpers import TPU, check, to_tpu

G = 4
OFFS = torch.tensor([3, 3, 10, 16], dtype=torch.int32)    # group 1 is empty


def operands(layout, dtype):
    """(mat_a, mat_b, offs) of a layout: 2d3d (the MoE forward), 3d2d, 2d2d (the weight gradient),
    3d3d (batched, no offs); grouped dims of size 16, all groups ending at the last offset."""
    shapes = {"2d3d": ((16, 8), (G, 8, 24)), "3d2d": ((G, 8, 24), (24, 16)),
              "2d2d": ((8, 16), (16, 24)), "3d3d": ((G, 8, 16), (G, 16, 24))}[layout]
    a, b = (torch.randn(s, dtype=dtype).requires_grad_() for s in shapes)
    return a, b, (None if layout == "3d3d" else OFFS)


LAYOUTS = ["2d3d", "3d2d", "2d2d", "3d3d"]
DTYPES = [torch.float32, torch.bfloat16]


def grouped(a, b, offs):
    return F.grouped_mm(a, b, offs=offs)


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("dtype", DTYPES + [torch.float16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_eager(layout, dtype, mode, no_fallback):
    with torch_tpu.eager_mode(mode):
        check(grouped, *operands(layout, dtype))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_transposed_operands(layout, no_fallback):
    """Column-major operands, as the backward formulas pass them."""
    a, b, offs = operands(layout, torch.float32)
    a = a.detach().mT.contiguous().mT.requires_grad_()
    b = b.detach().mT.contiguous().mT.requires_grad_()
    check(grouped, a, b, offs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_compiled(layout, dtype, no_fallback):
    """The forward graph and AOTAutograd's backward graph, whose _grouped_mm calls take the other
    layouts, each lowered whole."""
    a, b, offs = operands(layout, dtype)
    cpu = grouped(a, b, offs)
    gw = torch.randn(cpu.shape, dtype=dtype)
    cpu_grads = torch.autograd.grad(cpu, (a, b), gw)
    ta, tb, toffs = to_tpu([a, b, offs])
    got = torch.compile(grouped, backend="tpu", fullgraph=True)(ta, tb, toffs)
    grads = torch.autograd.grad(got, (ta, tb), gw.to(TPU))
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1.3e-5)
    torch.testing.assert_close(got.detach().cpu(), cpu.detach(), **tol)
    for g, c in zip(grads, cpu_grads):
        torch.testing.assert_close(g.cpu(), c, **tol)


def per_group(a, b, offs, layout):
    """The result group by group with mm, zeros where no group reaches (CPU leaves those
    uninitialised)."""
    start, out = 0, None
    if layout == "2d3d":
        out = torch.zeros(a.shape[0], b.shape[-1])
        for g, end in enumerate(offs.tolist()):
            out[start:end] = a[start:end] @ b[g]
            start = end
    else:
        out = torch.zeros(a.shape[1], b.shape[1])
        for g, end in enumerate(offs.tolist()):
            out[:, start:end] = a[g] @ b[:, start:end]
            start = end
    return out


@pytest.mark.parametrize("layout", ["2d3d", "3d2d"])
def test_past_last_offset(layout, no_fallback):
    """Rows (2d3d) or columns (3d2d) past the last offset are 0, and so is their gradient."""
    a, b, _ = operands(layout, torch.float32)
    offs = torch.tensor([0, 5, 5, 9], dtype=torch.int32)
    ta, tb = to_tpu([a, b])
    out = F.grouped_mm(ta, tb, offs=offs.to(TPU))
    torch.testing.assert_close(out.detach().cpu(), per_group(a.detach(), b.detach(), offs, layout))
    # a dense gradient: CPU's backward, like tpu's, refuses out.sum()'s expanded one (strides 0)
    ga, gb = torch.autograd.grad(out, (ta, tb), torch.randn(out.shape, device=TPU))
    rows = ga[9:] if layout == "2d3d" else gb[:, 9:]
    assert not rows.abs().sum().item()


def test_empty_offsets(no_fallback):
    """No group at all: the 2d2d result has no matrices, the 2d3d one is all 0."""
    a = torch.randn(4, 8)
    assert F.grouped_mm(a.to(TPU), torch.randn(8, 8, device=TPU), offs=OFFS[:0].to(TPU)).shape == (0, 4, 8)
    out = F.grouped_mm(a.to(TPU), torch.randn(0, 8, 8, device=TPU), offs=OFFS[:0].to(TPU))
    assert out.shape == (4, 8) and not out.abs().sum().item()


def bad_inputs():
    f32 = torch.float32
    r = torch.randn
    return [
        (r(16, 8, dtype=torch.float64), r(G, 8, 8, dtype=torch.float64), OFFS, None),   # dtype
        (r(16, 8), r(G, 8, 8).bfloat16(), OFFS, None),                                     # mixed dtypes
        (r(G, 8, 8), r(G, 8, 8).bfloat16(), None, None),
        (r(16), r(G, 8, 8), OFFS, None),                                                   # rank
        (r(16, 8), r(G, 4, 8), OFFS, None),                                                # contraction
        (r(16, 6), r(G, 6, 8), OFFS, None),                                                # 16-byte strides
        (r(16, 16), r(G, 8, 8), OFFS, None),                  # a[:, ::2] (below): no dense last two dims
        (r(16, 8), r(G, 8, 8), None, None),                                                # offs needed
        (r(G, 8, 8), r(G, 8, 8), OFFS, None),                                              # offs not needed
        (r(16, 8), r(G, 8, 8), OFFS.long(), None),
        (r(16, 8), r(G, 8, 8), OFFS[None], None),
        (r(16, 8), r(G + 1, 8, 8), OFFS, None),                                            # group counts
        (r(G, 8, 8), r(G + 1, 8, 8), None, None),
        (r(16, 8), r(G, 8, 8), OFFS, torch.bfloat16),                                      # out_dtype
    ]


@pytest.mark.parametrize("case", range(len(bad_inputs())))
def test_errors_match_cpu(case):
    a, b, offs, out_dtype = bad_inputs()[case]
    ta, tb, toffs = to_tpu([a, b, offs])
    if case == 6:  # the view is taken on each device (a copy to tpu would be dense)
        a, ta = a[:, ::2], ta[:, ::2]
    with pytest.raises(RuntimeError) as cpu:
        F.grouped_mm(a, b, offs=offs, out_dtype=out_dtype)
    with pytest.raises(RuntimeError, match=re.escape(str(cpu.value))):
        F.grouped_mm(ta, tb, offs=toffs, out_dtype=out_dtype)


def test_compiled_error_matches_cpu():
    a, b = torch.randn(16, 8), torch.randn(G + 1, 8, 8)
    fn = torch.compile(lambda a, b, offs: F.grouped_mm(a, b, offs=offs), backend="tpu", fullgraph=True)
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match="matrix batch sizes have to match"):
        fn(*to_tpu([a, b, OFFS]))


def test_fake_rule_is_tpu_only():
    """Fake float32 tpu tensors get a result; CPU ones still meet PyTorch's own meta kernel."""
    with FakeTensorMode():
        a, b, offs = torch.empty(16, 8), torch.empty(G, 8, 8), torch.empty(G, dtype=torch.int32)
        out = F.grouped_mm(a.to(TPU), b.to(TPU), offs=offs.to(TPU))
        assert out.shape == (16, 8) and out.device.type == "tpu"
        with pytest.raises(RuntimeError, match="Expected inputs of BF16 type"):
            F.grouped_mm(a, b, offs=offs)
