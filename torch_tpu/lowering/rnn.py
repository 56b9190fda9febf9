"""The fused LSTM and GRU cells PyTorch's recurrent layers call on accelerators.

`nn.LSTM`, `nn.GRU`, `nn.LSTMCell` and `nn.GRUCell` (ATen's RNN.cpp) compute each step's gate
matrix products with `linear` and hand the elementwise rest of the cell to `_thnn_fused_lstm_cell` /
`_thnn_fused_gru_cell` on CUDA and PrivateUse1 devices; these have CUDA kernels only (no CPU
kernel to fall back to). Their semantics follow those kernels (aten/src/ATen/native/cuda/RNN.cu):

LSTM, gates (N, 4H) = input_gates + hidden_gates (+ input_bias + hidden_bias), chunked along dim 1
in the order i, f, g, o:  i, f, o = sigmoid(.), g = tanh(.);  cy = f * cx + i * g;
hy = o * tanh(cy).  The workspace (N, 4H) keeps the activated gates [i, f, g, o] for the backward.

GRU, input_gates and hidden_gates (N, 3H) chunked as r, z, n (reset, update, new):
r = sigmoid(ir + hr), z = sigmoid(iz + hz), n = tanh(in + r * hn);  hy = n + z * (hx - n).
The workspace (N, 5H) keeps [r, z, n, hx, hn] (hn with its bias) for the backward.

Half-precision cells compute in float32 and round once (CUDA's accscalar_t). Only these lowerings
read the workspaces, so their layout is ours; it matches CUDA's shape (what `empty_like` and
PyTorch's meta kernels promise)."""
from __future__ import annotations

import torch

from .elementwise import compute_dtype
from .reduction import reduce_sum
from .registry import register


def _chunks(b, v, n: int, cd):
    """v (N, n*H) -> n Values (N, H), in compute dtype cd."""
    v = b.convert(v, cd)
    rows, width = v.shape
    h = width // n
    return [b.slice(v, [0, k * h], [rows, (k + 1) * h]) for k in range(n)]


def _with_bias(b, gates, bias, cd):
    """gates (N, W) + bias (W,) broadcast over rows; gates unchanged when bias is None."""
    if bias is None:
        return b.convert(gates, cd)
    return b.add(b.convert(gates, cd), b.broadcast_in_dim(b.convert(bias, cd), gates.shape, [1]))


def _one_minus(b, v):
    return b.subtract(b.full_like(v, 1.0), v)


def _sigmoid(b, v):
    return b.unary("logistic", v)


def _out(b, v, t):
    return b.reshape(b.convert(v, t.dtype), t.shape)


def _check_cell_sizes(op, input_gates, hidden_gates, input_bias, hidden_bias, factor, prev):
    """CUDA's checks of a fused cell's arguments (RNN.cu's checkSizes): 2-d gates of one shape, biases
    of the gates' width, a previous state (N, width / factor), all on one device. RuntimeError
    otherwise. (PyTorch's meta kernel of the LSTM cell fails on a missing bias instead.)"""
    def check(ok, what):
        torch._check(ok, lambda: f"{op}: {what}")
    check(input_gates.dim() == 2, f"input_gates must be 2-d, got {input_gates.dim()}-d")
    check(input_gates.shape == hidden_gates.shape,
          f"input_gates {tuple(input_gates.shape)} and hidden_gates {tuple(hidden_gates.shape)} differ in shape")
    width = input_gates.shape[1]
    check((input_bias is None) == (hidden_bias is None), "input_bias and hidden_bias must be given together")
    for bias in (input_bias, hidden_bias):
        if bias is not None:
            check(bias.dim() == 1 and bias.numel() == width, f"a bias must have shape ({width},), got {tuple(bias.shape)}")
    check(prev.dim() == 2 and prev.numel() == input_gates.shape[0] * width // factor,
          f"the previous state must have shape ({input_gates.shape[0]}, {width // factor}), got {tuple(prev.shape)}")
    check(all(t.device == input_gates.device for t in (hidden_gates, input_bias, hidden_bias, prev) if t is not None),
          "expected all inputs to be on the same device")


def _lstm_cell_meta(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """(hy, cy, workspace (N, 4H)) after CUDA's checks."""
    _check_cell_sizes("_thnn_fused_lstm_cell", input_gates, hidden_gates, input_bias, hidden_bias, 4, cx)
    state = [torch.empty_like(cx, memory_format=torch.contiguous_format) for _ in range(2)]
    return state[0], state[1], torch.empty_like(input_gates, memory_format=torch.contiguous_format)


# -- LSTM --------------------------------------------------------------------------------------------
@register("_thnn_fused_lstm_cell", cpu_dtypes=False, meta=_lstm_cell_meta)
def lstm_cell(ctx, input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    b = ctx.b
    cd = compute_dtype(input_gates.dtype)
    gates = b.add(_with_bias(b, input_gates, input_bias, cd), _with_bias(b, hidden_gates, hidden_bias, cd))
    i, f, g, o = _chunks(b, gates, 4, cd)
    i, f, g, o = _sigmoid(b, i), _sigmoid(b, f), b.tanh(g), _sigmoid(b, o)
    cy = b.add(b.multiply(f, b.convert(cx, cd)), b.multiply(i, g))
    hy = b.multiply(o, b.tanh(cy))
    hy_t, cy_t, ws_t = ctx.out
    return _out(b, hy, hy_t), _out(b, cy, cy_t), _out(b, b.concatenate([i, f, g, o], 1), ws_t)


@register("_thnn_fused_lstm_cell_backward_impl", cpu_dtypes=False)
def lstm_cell_backward(ctx, grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """(grad_gates (N, 4H), grad_cx (N, H), grad_bias (4H,) or undefined). A missing grad_hy or
    grad_cy counts as zeros (PyTorch's meta returns nothing when both are missing)."""
    b = ctx.b
    if ctx.out[0] is None:
        return [None, None, None]
    cd = compute_dtype(cy.dtype)
    i, f, g, o = _chunks(b, workspace, 4, cd)
    cyv, cxv = b.convert(cy, cd), b.convert(cx, cd)
    zeros = b.full_like(cyv, 0.0)
    ghy = zeros if grad_hy is None else b.convert(grad_hy, cd)
    gcy = zeros if grad_cy is None else b.convert(grad_cy, cd)
    tanh_cy = b.tanh(cyv)
    gcx = b.add(gcy, b.multiply(b.multiply(ghy, o), _one_minus(b, b.multiply(tanh_cy, tanh_cy))))
    gi = b.multiply(b.multiply(gcx, g), b.multiply(i, _one_minus(b, i)))
    gf = b.multiply(b.multiply(gcx, cxv), b.multiply(f, _one_minus(b, f)))
    gg = b.multiply(b.multiply(gcx, i), _one_minus(b, b.multiply(g, g)))
    go = b.multiply(b.multiply(ghy, tanh_cy), b.multiply(o, _one_minus(b, o)))
    grad_gates = b.concatenate([gi, gf, gg, go], 1)
    gates_t, cx_t, bias_t = ctx.out
    grad_bias = None if bias_t is None else _out(b, reduce_sum(b, grad_gates, [0]), bias_t)
    return _out(b, grad_gates, gates_t), _out(b, b.multiply(gcx, f), cx_t), grad_bias


# -- GRU ---------------------------------------------------------------------------------------------
def _gru_cell_meta(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """CUDA's checks (gate widths 3 x hx's, matching sizes and biases), then (hy, workspace (N, 5H))."""
    _check_cell_sizes("_thnn_fused_gru_cell", input_gates, hidden_gates, input_bias, hidden_bias, 3, hx)
    hy = torch.empty_like(hx, memory_format=torch.contiguous_format)
    workspace = input_gates.new_empty((hx.shape[0], hx.shape[1] * 5))
    return hy, workspace


def _gru_cell_backward_meta(grad_hy, workspace, has_bias):
    torch._check(workspace.dim() == 2 and grad_hy.dim() == 2 and workspace.shape[0] == grad_hy.shape[0]
                 and workspace.shape[1] == 5 * grad_hy.shape[1],
                 lambda: f"_thnn_fused_gru_cell_backward: workspace of shape {tuple(workspace.shape)} does not "
                         f"match grad_hy of shape {tuple(grad_hy.shape)} (expected (N, 5 * H))")
    n, h = grad_hy.shape
    gates = [grad_hy.new_empty((n, 3 * h)) for _ in range(2)]
    grad_hx = torch.empty_like(grad_hy, memory_format=torch.contiguous_format)
    biases = [grad_hy.new_empty((3 * h,)) for _ in range(2)] if has_bias else [None, None]
    return gates[0], gates[1], grad_hx, biases[0], biases[1]


@register("_thnn_fused_gru_cell", cpu_dtypes=False, meta=_gru_cell_meta)
def gru_cell(ctx, input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    b = ctx.b
    cd = compute_dtype(input_gates.dtype)
    ir, iz, in_ = _chunks(b, _with_bias(b, input_gates, input_bias, cd), 3, cd)
    hr, hz, hn = _chunks(b, _with_bias(b, hidden_gates, hidden_bias, cd), 3, cd)
    hxv = b.convert(hx, cd)
    r, z = _sigmoid(b, b.add(ir, hr)), _sigmoid(b, b.add(iz, hz))
    n = b.tanh(b.add(in_, b.multiply(r, hn)))
    hy = b.add(n, b.multiply(z, b.subtract(hxv, n)))
    hy_t, ws_t = ctx.out
    return _out(b, hy, hy_t), _out(b, b.concatenate([r, z, n, hxv, hn], 1), ws_t)


@register("_thnn_fused_gru_cell_backward", cpu_dtypes=False, meta=_gru_cell_backward_meta)
def gru_cell_backward(ctx, grad_hy, workspace, has_bias):
    """(grad_input_gates (N, 3H), grad_hidden_gates (N, 3H), grad_hx (N, H), and with has_bias the
    two biases' (3H,) gradients: the gates' gradients summed over the batch)."""
    b = ctx.b
    cd = compute_dtype(grad_hy.dtype)
    r, z, n, hx, hn = _chunks(b, workspace, 5, cd)
    g = b.convert(grad_hy, cd)
    gz = b.multiply(b.multiply(g, b.subtract(hx, n)), b.multiply(z, _one_minus(b, z)))
    gn = b.multiply(b.multiply(g, _one_minus(b, z)), _one_minus(b, b.multiply(n, n)))
    gr = b.multiply(b.multiply(gn, hn), b.multiply(r, _one_minus(b, r)))
    grad_input = b.concatenate([gr, gz, gn], 1)
    grad_hidden = b.concatenate([gr, gz, b.multiply(gn, r)], 1)
    gi_t, gh_t, hx_t, bi_t, bh_t = ctx.out
    results = [_out(b, grad_input, gi_t), _out(b, grad_hidden, gh_t), _out(b, b.multiply(g, z), hx_t)]
    for grad, t in ((grad_input, bi_t), (grad_hidden, bh_t)):
        results.append(None if t is None else _out(b, reduce_sum(b, grad, [0]), t))
    return results
