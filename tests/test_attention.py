"""F.scaled_dot_product_attention on tpu: the fused OVERRIDEABLE backend (lowering/attention.py,
csrc/aten/attention.cc) against CPU's result and gradients, its dropout, its choice rules, and what
a compiled training step saves for backward."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_tpu
from torch_tpu import plugins

OVERRIDEABLE = int(SDPBackend.OVERRIDEABLE)


def _attend(device, q, k, v, dtype=torch.float32, mask_grad=False, **kw):
    """(output, dq, dk, dv[, dmask]) on `device` for a fixed output gradient."""
    q, k, v = (t.detach().to(device, dtype).requires_grad_() for t in (q, k, v))
    mask = kw.pop("attn_mask", None)
    if mask is not None:
        mask = mask.to(device)
        if mask_grad:
            mask = mask.detach().to(dtype).requires_grad_()
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    weight = torch.linspace(-1, 1, o.numel(), dtype=o.dtype).reshape(o.shape).to(device)
    (o * weight).sum().backward()
    out = [o, q.grad, k.grad, v.grad] + ([mask.grad] if mask_grad else [])
    return [t.detach().float().cpu() for t in out]


def _inputs(b=2, hq=4, hk=4, lq=7, s=9, e=8, ev=5):
    g = torch.Generator().manual_seed(0)
    shape = (b,) if b else ()
    return (torch.randn(*shape, hq, lq, e, generator=g), torch.randn(*shape, hk, s, e, generator=g),
            torch.randn(*shape, hk, s, ev, generator=g))


def _fully_masked_row():
    m = torch.rand(2, 1, 7, 9, generator=torch.Generator().manual_seed(1)) > 0.3
    m[0, 0, 3] = False  # a query that sees no key: PyTorch's math gives it 0, and 0 gradients
    return m


CASES = {
    "plain": ({}, {}),
    "causal": ({}, {"is_causal": True}),
    "scale": ({}, {"scale": 0.3}),
    "float_bias": ({}, {"attn_mask": torch.randn(7, 9, generator=torch.Generator().manual_seed(2))}),
    "bool_mask_fully_masked_row": ({}, {"attn_mask": _fully_masked_row()}),
    "grouped_query": ({"hq": 8, "hk": 2}, {"enable_gqa": True}),
    "three_d": ({"b": 0}, {"is_causal": True}),
    "square_causal": ({"lq": 9}, {"is_causal": True}),
}


@pytest.mark.parametrize("case", CASES)
def test_fused_attention_matches_cpu(case):
    shape, kw = CASES[case]
    q, k, v = _inputs(**shape)
    on_tpu = {n: x.to("tpu") if isinstance(x, torch.Tensor) else x for n, x in kw.items()}
    assert torch.ops.aten._fused_sdp_choice(q.to("tpu"), k.to("tpu"), v.to("tpu"), **on_tpu) == OVERRIDEABLE
    want = _attend("cpu", q, k, v, **kw)
    with torch.profiler.profile() as prof:
        got = _attend("tpu", q, k, v, **kw)
    names = {e.name for e in prof.events()}
    assert "aten::_scaled_dot_product_fused_attention_overrideable" in names
    assert "aten::_scaled_dot_product_fused_attention_overrideable_backward" in names
    assert "aten::_softmax" not in names  # no (B, H, L, S) probabilities from the math composite
    for name, w, g in zip(("output", "dq", "dk", "dv"), want, got):
        assert not g.isnan().any(), name
        torch.testing.assert_close(g, w, atol=2e-6, rtol=2e-5, msg=name)


def test_gradient_of_a_float_bias_is_summed_over_its_broadcast_dims():
    q, k, v = _inputs()
    bias = torch.randn(1, 4, 7, 1, generator=torch.Generator().manual_seed(3))
    want = _attend("cpu", q, k, v, attn_mask=bias, mask_grad=True)
    got = _attend("tpu", q, k, v, attn_mask=bias, mask_grad=True)
    assert got[4].shape == bias.shape
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=2e-6, rtol=2e-5)


def test_bfloat16_is_computed_in_float32_and_rounded_once():
    q, k, v = _inputs()
    ref = _attend("cpu", q.double(), k.double(), v.double(), dtype=torch.float64, is_causal=True)
    got = _attend("tpu", q, k, v, dtype=torch.bfloat16, is_causal=True)
    for w, g in zip(ref, got):
        torch.testing.assert_close(g, w.float(), atol=2e-2, rtol=2e-2)


def _dropout_run(p, seed, q, k, v):
    torch.manual_seed(seed)
    q, k, v = (t.to("tpu").requires_grad_() for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
    return q, k, v, o


def test_dropout_mask_is_reproducible_and_the_backward_regenerates_it():
    q, k, v = (t.double() for t in _inputs())
    _, _, v1, o1 = _dropout_run(0.3, 7, q, k, v)
    _, _, _, o2 = _dropout_run(0.3, 7, q, k, v)
    _, _, _, o3 = _dropout_run(0.3, 8, q, k, v)
    assert torch.equal(o1.cpu(), o2.cpu()) and not torch.equal(o1.cpu(), o3.cpu())
    # out = (P * Z) V is linear in V, so <out, G> = <V, dV> exactly when the backward's mask Z is
    # the forward's (up to the float32 log-sum-exp the backward recomputes P from); a different mask
    # breaks the identity by far more.
    grad = torch.linspace(-1, 1, o1.numel(), dtype=torch.float64).reshape(o1.shape)
    o1.backward(grad.to("tpu"))
    lhs = float((o1.detach().cpu() * grad).sum())
    rhs = float((v1.detach().cpu() * v1.grad.cpu()).sum())
    assert abs(lhs - rhs) < 1e-6 * max(1.0, abs(lhs)), (lhs, rhs)


def test_dropout_drops_the_given_fraction_of_probabilities():
    # V = identity (S = Ev) makes the output the dropped-out probabilities themselves.
    q = torch.randn(2, 4, 64, 8, generator=torch.Generator().manual_seed(0))
    k = torch.randn(2, 4, 64, 8, generator=torch.Generator().manual_seed(1))
    v = torch.eye(64).expand(2, 4, 64, 64).contiguous()
    torch.manual_seed(0)
    o = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), dropout_p=0.25).cpu()
    dropped = float((o == 0).float().mean())
    assert abs(dropped - 0.25) < 0.02, dropped
    keep = F.scaled_dot_product_attention(q, k, v)  # the probabilities, scaled by 1/(1-p) where kept
    torch.testing.assert_close(o[o != 0], keep[o != 0] / 0.75, atol=1e-6, rtol=1e-5)


def test_compiled_attention_step_equals_eager_with_dropout():
    q, k, v = _inputs()

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.3)

    before = torch_tpu.metrics.counters()["graph_eager_fallbacks"]
    runs = []
    for fn in (f, torch.compile(f, backend="tpu")):
        torch.manual_seed(3)
        qt, kt, vt = (t.to("tpu").requires_grad_() for t in (q, k, v))
        o = fn(qt, kt, vt)
        o.sum().backward()
        runs.append([o.detach().cpu(), qt.grad.cpu(), kt.grad.cpu(), vt.grad.cpu()])
    assert torch_tpu.metrics.counters()["graph_eager_fallbacks"] == before
    for e, c in zip(*runs):
        torch.testing.assert_close(c, e, atol=1e-6, rtol=1e-5)


def test_math_backend_when_asked_and_a_clear_error_when_nothing_applies():
    q, k, v = (t.to("tpu") for t in _inputs())
    with sdpa_kernel(SDPBackend.MATH):
        assert torch.ops.aten._fused_sdp_choice(q, k, v) == int(SDPBackend.MATH)
    # 5-D inputs: only the math composite takes them
    q5 = q.unsqueeze(0)
    assert torch.ops.aten._fused_sdp_choice(q5, q5, q5) == int(SDPBackend.MATH)
    with sdpa_kernel(SDPBackend.OVERRIDEABLE):
        assert torch.ops.aten._fused_sdp_choice(q, k, v) == OVERRIDEABLE
        with pytest.raises(RuntimeError, match="No available kernel for scaled_dot_product_attention on tpu"):
            F.scaled_dot_product_attention(q5, q5, q5)
    # heads that differ without enable_gqa: PyTorch's own error, from the math composite
    qg = torch.randn(2, 8, 7, 8, device="tpu")
    assert torch.ops.aten._fused_sdp_choice(qg, k, v) == int(SDPBackend.MATH)


@pytest.mark.skipif(not plugins.TPU.find(), reason="libtpu is not installed (pip install 'torch_tpu[tpu]')")
@pytest.mark.libtpu
@pytest.mark.slow
def test_a_compiled_attention_step_saves_no_probabilities_for_backward():
    from torch_tpu import aot
    b, h, n, e = 1, 2, 512, 16
    probs = b * h * n * n * 4  # one (B, H, L, S) float32 tensor: 2 MiB

    def step(q, k, v):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1)
        o.sum().backward()
        return o.detach()

    args = [torch.randn(b, h, n, e, device="meta", requires_grad=True) for _ in range(3)]
    report = aot.compile(step, *args, topology="v5e:1x1")
    assert report.ok, str(report)
    fw = next(p for p in report.programs if p.name.startswith("forward"))
    assert fw.output_bytes < probs / 4, str(report)  # q, k, v, output, log-sum-exp: 0.3 MiB
