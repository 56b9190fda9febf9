"""Fused scaled-dot-product attention: the OVERRIDEABLE backend of F.scaled_dot_product_attention.

csrc/aten/attention.cc answers SDPBackend.OVERRIDEABLE for tpu inputs it applies to (3-D or 4-D,
one float dtype, grouped-query heads, an additive bias broadcastable to (B, H, L, S)), so
PyTorch's scaled_dot_product_attention calls `_scaled_dot_product_fused_attention_overrideable`
and autograd its `_backward`. Like FlashAttention's kernels, the forward returns only the output
and the row log-sum-exp (B, H, L) float32 — not the (B, H, L, S) probabilities — and the
backward recomputes the probabilities from it and regenerates the dropout mask from the
(philox_seed, philox_offset) pair the forward returns (here: the tpu Generator's Threefry
(seed, offset) state, as 0-dim int64 tensors). So a compiled training step saves O(L) per row
instead of O(L*S), which is what lets GPT-2 small at 8 x 1024 tokens fit a 16 GB v5e.

Semantics follow PyTorch's math composite (_scaled_dot_product_attention_math): scale defaults to
1/sqrt(E); is_causal keeps key j for query i where j <= i (top-left aligned, tril(ones(L, S)));
a row whose every key is masked gives 0 (_safe_softmax), with log-sum-exp -inf; dropout keeps a
probability with chance 1-p and scales it by 1/(1-p). Grouped-query attention maps query head h
to key/value head h // (Hq / Hk), as repeat_interleave does. Half-precision inputs are computed in
float32 and rounded once, like every tpu lowering.
"""
from __future__ import annotations

import math

import torch

from .elementwise import compute_dtype
from .linalg import dot
from .random import uniform01
from .reduction import reduce_max, reduce_sum
from .registry import register


def _meta(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, scale=None):
    """PyTorch's meta result with philox_seed / philox_offset on the query's device (PyTorch's
    meta kernel puts them on "meta"; the backward takes them as tpu tensors)."""
    if query.dim() not in (3, 4):
        raise RuntimeError("query must be 3D or 4D")
    lead = tuple(query.shape[:-3]) or (1,)
    out = query.new_empty((*query.shape[:-1], value.shape[-1]))
    lse = torch.empty((*lead, query.shape[-3], query.shape[-2]), dtype=torch.float32, device=query.device)
    seed = torch.empty((), dtype=torch.int64, device=query.device)
    offset = torch.empty((), dtype=torch.int64, device=query.device)
    return out, lse, None, None, query.shape[-2], key.shape[-2], seed, offset, None


def _draws(query, key, value, attn_bias=None, dropout_p=0.0, *rest):
    """Generator counters the forward uses: one per (B, H, L, S) probability when dropping out."""
    if dropout_p == 0:
        return 0
    lead = math.prod(query.shape[:-3])
    return lead * query.shape[-3] * query.shape[-2] * key.shape[-2]


def _four_d(b, x):
    return b.reshape(x, (1, *x.shape)) if x.rank == 3 else x


def _heads(b, x, hq):
    """(B, Hk, S, D) -> (B, Hq, S, D): key/value head h // (Hq / Hk) for query head h."""
    bs, hk, s, d = x.shape
    if hk == hq:
        return x
    g = hq // hk
    return b.reshape(b.broadcast_in_dim(x, (bs, hk, g, s, d), [0, 1, 3, 4]), (bs, hq, s, d))


def _sum_groups(b, x, hk):
    """(B, Hq, S, D) -> (B, Hk, S, D): the sum over each key/value head's query heads."""
    bs, hq, s, d = x.shape
    if hk == hq:
        return x
    return reduce_sum(b, b.reshape(x, (bs, hk, hq // hk, s, d)), [2])


class _Scores:
    """The (B, H, L, S) scaled, biased and masked scores of one call, in compute dtype cd."""

    def __init__(self, b, q, k, bias, is_causal, scale, cd):
        self.b, self.cd = b, cd
        self.q, self.k = _four_d(b, b.convert(q, cd)), _four_d(b, b.convert(k, cd))
        bs, hq, ln, e = self.q.shape
        self.hk = self.k.shape[1]
        self.kq = _heads(b, self.k, hq)
        self.scale = 1.0 / math.sqrt(e) if scale is None else scale
        self.shape = (bs, hq, ln, self.k.shape[2])
        s = b.multiply(dot(b, self.q, self.kq, ([0, 1], [0, 1]), ([3], [3]), cd),
                       b.constant(self.scale, cd, self.shape))
        if bias is not None:
            s = b.add(s, b.broadcast_to(b.convert(bias, cd), self.shape))
        if is_causal:
            rows = b.iota(self.shape, 2)
            cols = b.iota(self.shape, 3)
            s = b.select(b.compare(cols, rows, "LE"), s, b.constant(-math.inf, cd, self.shape))
        self.s = s

    def row(self, r):
        """A (B, H, L) row statistic broadcast over S."""
        return self.b.broadcast_in_dim(r, self.shape, [0, 1, 2])


def _keep_scale(b, state, shape, p, cd):
    """Dropout's multiplier: 1/(1-p) where a probability is kept (chance 1-p), else 0."""
    keep = 1.0 - p
    u = uniform01(b, state, shape, torch.float32)
    kept = b.compare(u, b.constant(keep, torch.float32, shape), "LT")
    scale = b.constant(0.0 if keep == 0 else 1.0 / keep, cd, shape)
    return b.select(kept, scale, b.zeros_like(scale))


def _is_neg_inf(b, x):
    return b.compare(x, b.full_like(x, -math.inf), "EQ")


@register("_scaled_dot_product_fused_attention_overrideable", rng=True, meta=_meta, draws=_draws)
def sdpa_overrideable(ctx, query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                      return_debug_mask=False, scale=None, state=None):
    """(output (…, L, Ev) in the query's dtype, logsumexp (B, H, L) float32, None, None, L, S,
    philox_seed, philox_offset (0-dim int64), None). return_debug_mask is not supported."""
    if return_debug_mask:
        raise NotImplementedError("_scaled_dot_product_fused_attention_overrideable: return_debug_mask=True "
                                  "is not supported on tpu (the probabilities are never materialised)")
    b = ctx.b
    out_t = ctx.out[0]
    cd = compute_dtype(out_t.dtype)
    sc = _Scores(b, query, key, attn_bias, is_causal, scale, cd)
    m = reduce_max(b, sc.s, [3])
    m = b.select(_is_neg_inf(b, m), b.zeros_like(m), m)  # a fully masked row: exp(-inf - 0) = 0
    p = b.exp(b.subtract(sc.s, sc.row(m)))
    total = reduce_sum(b, p, [3])
    lse = b.add(m, b.log(total))  # -inf for a fully masked row
    empty = b.compare(total, b.zeros_like(total), "EQ")
    p = b.divide(p, sc.row(b.select(empty, b.full_like(total, 1.0), total)))
    if dropout_p:
        p = b.multiply(p, _keep_scale(b, state, sc.shape, dropout_p, cd))
    v = _heads(b, _four_d(b, b.convert(value, cd)), sc.shape[1])
    out = dot(b, p, v, ([0, 1], [0, 1]), ([3], [2]), cd)
    i64 = torch.int64
    if dropout_p:
        seed, offset = (b.reshape(b.bitcast_convert(b.slice(state, [i], [i + 1]), i64), ()) for i in (0, 1))
    else:
        seed, offset = b.constant(0, i64), b.constant(0, i64)
    return (b.convert(b.reshape(out, out_t.shape), out_t.dtype),
            b.reshape(b.convert(lse, torch.float32), ctx.out[1].shape), None, None, None, None, seed, offset, None)


@register("_scaled_dot_product_fused_attention_overrideable_backward")
def sdpa_overrideable_backward(ctx, grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp,
                               cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed,
                               philox_offset, scale=None):
    """(grad_query, grad_key, grad_value, grad_attn_bias): the probabilities recomputed from the
    log-sum-exp, the dropout mask regenerated from (philox_seed, philox_offset). A gradient that
    grad_input_mask leaves out is zeros; grad_attn_bias is summed over the dims the bias broadcasts."""
    b = ctx.b
    cd = compute_dtype(ctx.out[0].dtype)
    sc = _Scores(b, query, key, attn_bias, is_causal, scale, cd)
    lse = b.reshape(b.convert(logsumexp, cd), sc.shape[:3])
    lse = sc.row(lse)
    p = b.select(_is_neg_inf(b, lse), b.zeros_like(sc.s), b.exp(b.subtract(sc.s, lse)))
    g = _four_d(b, b.convert(grad_out, cd))
    v = _four_d(b, b.convert(value, cd))
    vq = _heads(b, v, sc.shape[1])
    dp = dot(b, g, vq, ([0, 1], [0, 1]), ([3], [3]), cd)  # dO V^T: (B, H, L, S)
    pd = p
    if dropout_p:
        state = b.concatenate([b.bitcast_convert(b.reshape(t, (1,)), torch.uint64)
                               for t in (philox_seed, philox_offset)], 0)
        z = _keep_scale(b, state, sc.shape, dropout_p, cd)
        pd, dp = b.multiply(p, z), b.multiply(dp, z)
    # softmax backward: dS = P * (dP - rowsum(P * dP))
    ds = b.multiply(p, b.subtract(dp, sc.row(reduce_sum(b, b.multiply(p, dp), [3]))))
    results = []
    want = list(grad_input_mask) + [False] * (4 - len(grad_input_mask))
    for i, t in enumerate(ctx.out):
        if t is None:
            results.append(None)
            continue
        if not want[i]:
            results.append(b.constant(0, t.dtype, t.shape))
            continue
        if i == 0:  # dQ = scale * dS K
            r = dot(b, b.multiply(ds, b.full_like(ds, sc.scale)), sc.kq, ([0, 1], [0, 1]), ([3], [2]), cd)
        elif i == 1:  # dK = scale * dS^T Q
            r = _sum_groups(b, dot(b, b.multiply(ds, b.full_like(ds, sc.scale)), sc.q,
                                   ([0, 1], [0, 1]), ([2], [2]), cd), sc.hk)
        elif i == 2:  # dV = (P * Z)^T dO
            r = _sum_groups(b, dot(b, pd, g, ([0, 1], [0, 1]), ([2], [2]), cd), sc.hk)
        else:
            r = _reduce_to(b, ds, t.shape)
        results.append(b.convert(b.reshape(r, t.shape), t.dtype))
    return tuple(results)


def _reduce_to(b, x, shape):
    """x summed over the dims that `shape` broadcasts (numpy rules, trailing dims aligned)."""
    lead = x.rank - len(shape)
    dims = [i for i in range(x.rank) if i < lead or (shape[i - lead] == 1 and x.shape[i] != 1)]
    return b.reshape(reduce_sum(b, x, dims) if dims else x, shape)
