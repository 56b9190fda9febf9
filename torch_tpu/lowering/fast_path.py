"""PyTorch's fused inference kernels for nn.MultiheadAttention and nn.TransformerEncoderLayer, as
composites of tpu ops.

In eval without gradients, nn.MultiheadAttention calls `_native_multi_head_attention` and
nn.TransformerEncoderLayer `_transformer_encoder_layer_fwd` on every device PyTorch lists for its
fast path, tpu among them. Neither has a lowering of its own: they took the CPU fallback (every call
moved the weights to the host: torchvision's ViT, an nn.Transformer's validation pass). Here they
run as the same steps CPU's kernels take (aten/src/ATen/native/transformers: attention.cpp,
transformer.cpp), each step a lowered tpu op:

- the input projection without its bias, then q = (q + q_bias) / sqrt(head_dim), k + k_bias,
  v + v_bias (_transform_bias_rescale_qkv), heads split as (B, H, T, head_dim);
- scores q k^T, softmax over the keys with the mask's True positions left out (a non-bool mask is
  made bool: nonzero is masked); mask_type 0 is an attention mask (T, S), 1 a key padding mask
  (B, S), 2 or None one broadcastable to (B, H, T, S); a row whose every key is masked gives NaN, as
  CPU's kernel does;
- probabilities times v, heads merged, the output projection with its bias;
- the second result: with need_weights and average_attn_weights the probabilities summed over heads
  and divided by their number (B, T, S), with need_weights alone all of them (B, H, T, S), without
  need_weights none (None); CPU's kernel then takes its scaled-dot-product path where it can
  (self-attention, no mask, head_dim a multiple of 8), and so does this one.
Shapes: query (B, T, E), key / value (B, S, E), qkv_weight (3E, E), qkv_bias (3E,), proj_weight
(E, E), proj_bias (E,), E = embed_dim = num_head * head_dim.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .registry import host_kernel


def _masked_softmax(scores, mask, mask_type):
    """softmax(scores, -1) with mask's True positions left out (a fully masked row is NaN, as CPU's)."""
    if mask is None:
        return torch.softmax(scores, -1)
    if mask.dtype != torch.bool:
        mask = mask != 0
    b, _, t, s = scores.shape
    if mask_type == 1:
        mask = mask.view(b, 1, 1, s)
    elif mask_type == 0 and mask.dim() == 2:
        mask = mask.view(1, 1, t, s)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), -1)


def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                proj_bias, mask=None, need_weights=True, average_attn_weights=True,
                                mask_type=None):
    """aten::_native_multi_head_attention on tpu tensors (the module docstring's steps):
    (output (B, T, E), weights or None)."""
    head_dim = embed_dim // num_head
    b, t = query.shape[0], query.shape[1]
    self_attention = query is key and key is value
    if self_attention and head_dim % 8 == 0 and not need_weights and mask is None and \
            query.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        x = F.linear(query, qkv_weight, qkv_bias)
        q, k, v = (c.view(b, -1, num_head, head_dim).transpose(1, 2) for c in x.chunk(3, -1))
        y = F.scaled_dot_product_attention(q, k, v)
        return F.linear(y.transpose(1, 2).reshape(b, -1, embed_dim), proj_weight, proj_bias), None
    w_q, w_k, w_v = qkv_weight.chunk(3, 0)
    b_q, b_k, b_v = qkv_bias.chunk(3, 0)
    if self_attention:
        q, k, v = torch.matmul(query, qkv_weight.t()).chunk(3, -1)
    else:
        q, k, v = torch.matmul(query, w_q.t()), torch.matmul(key, w_k.t()), torch.matmul(value, w_v.t())
    if q.numel() == 0 or k.numel() == 0:
        return torch.empty_like(query), None

    def heads(x, bias):
        return (x + bias).view(b, -1, num_head, head_dim).transpose(1, 2)
    q = heads(q, b_q) / math.sqrt(head_dim)
    k, v = heads(k, b_k), heads(v, b_v)
    probs = _masked_softmax(torch.matmul(q, k.transpose(-2, -1)), mask, mask_type)
    ctx = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, embed_dim)
    out = F.linear(ctx, proj_weight, proj_bias)
    if not need_weights:
        return out, None
    if average_attn_weights:
        probs = probs.sum(1) / num_head
    return out, probs


def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                  use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                                  norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                  mask_type=None):
    """aten::_transformer_encoder_layer_fwd on tpu tensors, as CPU's transformer.cpp: self-attention
    (the weights not needed) and its residual, then the feed-forward block (linear, GELU or ReLU,
    linear) and its residual, each with its layer norm before (norm_first) or after. src (B, T, E)."""
    def norm(x, w, bias):
        return F.layer_norm(x, (embed_dim,), w, bias, eps)
    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                    mask, False, True, mask_type)[0] + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    h = F.linear(x, ffn_weight_1, ffn_bias_1)
    x = F.linear(F.gelu(h) if use_gelu else F.relu(h), ffn_weight_2, ffn_bias_2) + residual
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)


host_kernel("_native_multi_head_attention", native_multi_head_attention)
host_kernel("_transformer_encoder_layer_fwd", transformer_encoder_layer_fwd)
