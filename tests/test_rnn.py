"""nn.LSTM / nn.GRU and their cells on tpu against CPU: forward, gradients of the input, the initial
state and every parameter (issue 50: the fused cells ATen calls on accelerators had no lowering).
Every test runs with the CPU fallback off, so each op is lowered."""
import copy

import pytest
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

TPU = torch.device("tpu")

CONFIGS = [dict(), dict(num_layers=2), dict(bidirectional=True), dict(batch_first=True),
           dict(bias=False), dict(num_layers=2, bidirectional=True, batch_first=True)]


def _leaf(t, dev):
    """A fresh leaf copy of t on dev that requires grad."""
    return t.detach().clone().to(dev).requires_grad_()


def _grads(model, x, h0):
    """(output, final state, grads of x, h0 and the parameters) after a loss that reads every output."""
    out, state = model(x, h0)
    states = state if isinstance(state, tuple) else (state,)
    loss = out.pow(2).sum() + sum(s.sin().sum() for s in states)
    loss.backward()
    return [out, *states, x.grad, *[h.grad for h in (h0 if isinstance(h0, tuple) else (h0,))],
            *[p.grad for p in model.parameters()]]


def _compare(cpu_model, make_inputs, tol=2e-5):
    tpu_model = copy.deepcopy(cpu_model).to(TPU)
    x, h0 = make_inputs("cpu")
    xt, h0t = make_inputs(TPU)
    for c, t in zip(_grads(cpu_model, x, h0), _grads(tpu_model, xt, h0t)):
        torch.testing.assert_close(t.cpu(), c, atol=tol, rtol=tol)


def _inputs(cell, cfg, seq=5, batch=3, width=8, hidden=16):
    layers = cfg.get("num_layers", 1) * (2 if cfg.get("bidirectional") else 1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(seq, batch, width, generator=g)
    if cfg.get("batch_first"):
        x = x.transpose(0, 1).contiguous()
    h = torch.randn(layers, batch, hidden, generator=g)
    c = torch.randn(layers, batch, hidden, generator=g)

    def make(dev):
        xs, hs, cs = (_leaf(t, dev) for t in (x, h, c))
        return xs, ((hs, cs) if cell == "LSTM" else hs)
    return make


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_rnn_matches_cpu(cell, cfg, no_fallback):
    torch.manual_seed(0)
    _compare(getattr(nn, cell)(8, 16, **cfg), _inputs(cell, cfg))


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_packed_sequences_match_cpu(cell, no_fallback):
    torch.manual_seed(0)
    model = getattr(nn, cell)(8, 16, num_layers=2, bidirectional=True)
    lengths = torch.tensor([5, 3, 2])
    base = _inputs(cell, {"num_layers": 2, "bidirectional": True})

    class Packed(nn.Module):
        def __init__(self, rnn):
            super().__init__()
            self.rnn = rnn

        def forward(self, x, h0):
            out, state = self.rnn(pack_padded_sequence(x, lengths), h0)
            return pad_packed_sequence(out)[0], state
    _compare(Packed(model), base)


@pytest.mark.parametrize("cell", ["LSTMCell", "GRUCell"])
@pytest.mark.parametrize("bias", [True, False])
def test_cells_match_cpu(cell, bias, no_fallback):
    torch.manual_seed(0)
    model = getattr(nn, cell)(8, 16, bias=bias)
    g = torch.Generator().manual_seed(1)
    x, h, c = (torch.randn(3, n, generator=g) for n in (8, 16, 16))

    def make(dev):
        xs, hs, cs = (_leaf(t, dev) for t in (x, h, c))
        return xs, ((hs, cs) if cell == "LSTMCell" else hs)

    class AsLayer(nn.Module):  # (x, state) -> (output, state), as _grads reads a layer
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x, state):
            r = self.m(x, state)
            return (r[0], r) if isinstance(r, tuple) else (r, r)
    _compare(AsLayer(model), make)


def test_double_backward_matches_cpu(no_fallback):
    """With create_graph, PyTorch differentiates the cell through its composite backward."""
    torch.manual_seed(0)
    cpu = nn.GRU(4, 6)
    tpu = copy.deepcopy(cpu).to(TPU)
    x = torch.randn(3, 2, 4)
    res = []
    for m, dev in ((cpu, "cpu"), (tpu, TPU)):
        xs = _leaf(x, dev)
        (gx,) = torch.autograd.grad(m(xs)[0].pow(2).sum(), xs, create_graph=True)
        gx.pow(2).sum().backward()
        res.append((gx.detach().cpu(), m.weight_hh_l0.grad.cpu()))
    for c, t in zip(*res):
        torch.testing.assert_close(t, c, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_cell_rounds_once(dtype, no_fallback):
    """Half-precision cells compute in float32 and round once, as CUDA's kernels: against CPU's
    float32 result rounded, the error is a rounding of the inputs' precision."""
    torch.manual_seed(0)
    m = nn.LSTMCell(8, 16).to(dtype)
    x = torch.randn(4, 8).to(dtype)
    ref = copy.deepcopy(m).float()(x.float())
    got = copy.deepcopy(m).to(TPU)(x.to(TPU))
    for r, t in zip(ref, got):
        assert t.dtype == dtype
        torch.testing.assert_close(t.cpu().float(), r, atol=2e-2, rtol=2e-2)


def test_compiled_lstm_matches_cpu():
    torch.manual_seed(0)
    cpu = nn.LSTM(8, 16, num_layers=2)
    tpu = copy.deepcopy(cpu).to(TPU)
    x = torch.randn(5, 3, 8)
    f = torch.compile(lambda m, x: m(x)[0].pow(2).sum(), backend="tpu")
    loss_c, loss_t = cpu(x)[0].pow(2).sum(), f(tpu, x.to(TPU))
    loss_c.backward()
    loss_t.backward()
    torch.testing.assert_close(loss_t.cpu(), loss_c, atol=1e-4, rtol=1e-5)
    for pc, pt in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(pt.grad.cpu(), pc.grad, atol=2e-5, rtol=2e-5)


def test_bad_cell_arguments_raise():
    """The fused cell's own checks (CUDA's): a state of the wrong width is a clear RuntimeError."""
    gates = torch.randn(3, 64, device=TPU)
    with pytest.raises(RuntimeError, match=r"previous state must have shape \(3, 16\)"):
        torch.ops.aten._thnn_fused_lstm_cell(gates, gates, torch.randn(3, 15, device=TPU))
    with pytest.raises(RuntimeError, match="differ in shape"):
        torch.ops.aten._thnn_fused_gru_cell(torch.randn(3, 48, device=TPU), torch.randn(3, 47, device=TPU),
                                            torch.randn(3, 16, device=TPU))


@pytest.mark.parametrize("cell", ["LSTMCell", "GRUCell"])
def test_bfloat16_cells_forward_and_gradients(cell, no_fallback):
    """bfloat16 cells (computed in float32, rounded once) against CPU's float32 cell on the same
    rounded weights and inputs: outputs and gradients within bfloat16's precision."""
    torch.manual_seed(0)
    m = getattr(nn, cell)(8, 16).to(torch.bfloat16)
    ref, got = copy.deepcopy(m).float(), copy.deepcopy(m).to(TPU)
    x = torch.randn(4, 8).to(torch.bfloat16)
    xr, xt = _leaf(x.float(), "cpu"), _leaf(x, TPU)
    outs = []
    for model, inp in ((ref, xr), (got, xt)):
        r = model(inp)
        (r[0] if isinstance(r, tuple) else r).float().sin().sum().backward()
        outs.append([(r[0] if isinstance(r, tuple) else r), inp.grad, *[p.grad for p in model.parameters()]])
    for r, t in zip(*outs):
        assert t.dtype == torch.bfloat16
        torch.testing.assert_close(t.cpu().float(), r.float(), atol=3e-2, rtol=3e-2)
