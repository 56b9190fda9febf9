"""torch.nn's transformer modules in eval mode on tpu give CPU's results: TransformerEncoder's
nested-tensor fast path (eval, no grad, a padding mask) meets `_nested_tensor_from_mask`, which
nested tensors on tpu cannot run; integrations/nn_transformer.py gives that path its result (padded
positions zeroed before the encoder's norm, as CPU's nested path pads them). MultiheadAttention's and
TransformerEncoderLayer's fused inference kernels (lowering/fast_path.py) run on tpu, not on the CPU
fallback."""
import copy

import pytest
import torch
import torch.nn as nn

import torch_tpu
from torch_tpu.lowering.nested import NestedTensorUnsupported

MASK = torch.tensor([[0, 0, 0, 0, 0], [0, 0, 0, 1, 1], [0, 0, 0, 0, 1]], dtype=torch.bool)  # left-aligned rows


def _both(module, *args, **kwargs):
    """module(*args) on CPU and on tpu (a deep copy), without grad."""
    with torch.no_grad():
        ref = module(*args, **kwargs)
        tpu = copy.deepcopy(module).to("tpu")
        got = tpu(*[a.to("tpu") for a in args], **{k: v.to("tpu") for k, v in kwargs.items()})
    return got.cpu(), ref


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("float_mask", [False, True])
def test_encoder_eval_with_a_padding_mask_is_cpus_nested_result(batch_first, norm, float_mask):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, 0.0, batch_first=batch_first)
    enc = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(16) if norm else None).eval()
    x = torch.randn(3, 5, 16) if batch_first else torch.randn(5, 3, 16)
    mask = MASK.float().masked_fill(MASK, float("-inf")) if float_mask else MASK
    got, ref = _both(enc, x, src_key_padding_mask=mask)
    torch.testing.assert_close(got, ref, atol=2e-6, rtol=1e-5)
    if batch_first:  # (PyTorch takes the nested path only then: use_nested_tensor needs batch_first)
        expected = enc.norm(torch.zeros(16)) if norm else torch.zeros(16)
        torch.testing.assert_close(ref[1, 3:], expected.expand(2, 16).detach())  # CPU's nested path pads so


def test_encoder_eval_mask_not_left_aligned_and_training_are_pytorchs_own_paths():
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, 0.0, batch_first=True), 2).eval()
    x = torch.randn(3, 5, 16)
    ragged = MASK.clone()
    ragged[0, 0] = True  # padding first: CPU's fast path declines it (mask_check) and runs dense
    got, ref = _both(enc, x, src_key_padding_mask=ragged)
    torch.testing.assert_close(got, ref, atol=2e-6, rtol=1e-5)
    enc.train()
    enc_t = copy.deepcopy(enc).to("tpu")
    torch.testing.assert_close(enc_t(x.to("tpu"), src_key_padding_mask=MASK.to("tpu")).detach().cpu(),
                               enc(x, src_key_padding_mask=MASK).detach(), atol=2e-6, rtol=1e-5)


def test_seq2seq_transformer_greedy_decoding_with_padding_masks():
    """nn.Transformer (an encoder with a final norm, a decoder) in eval: logits of a padded batch and
    greedy decoding, as a validation pass runs them."""
    torch.manual_seed(0)
    model = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=32,
                           dropout=0.0, batch_first=True).eval()
    src, tgt = torch.randn(3, 5, 16), torch.randn(3, 4, 16)
    causal = nn.Transformer.generate_square_subsequent_mask(4)
    got, ref = _both(model, src, tgt, tgt_mask=causal, src_key_padding_mask=MASK, memory_key_padding_mask=MASK)
    torch.testing.assert_close(got, ref, atol=2e-6, rtol=1e-5)
    model_t = copy.deepcopy(model).to("tpu")
    with torch.no_grad():
        outs = []
        for m, s in ((model, src), (model_t, src.to("tpu"))):
            mem = m.encoder(s, src_key_padding_mask=MASK.to(s.device))
            y = s[:, :1]
            for _ in range(3):
                step = m.decoder(y, mem, memory_key_padding_mask=MASK.to(s.device))
                y = torch.cat([y, step[:, -1:]], dim=1)
            outs.append(y.cpu())
    torch.testing.assert_close(outs[1], outs[0], atol=2e-6, rtol=1e-5)


def test_a_nested_tensor_of_tpu_tensors_is_refused_naming_the_op():
    x, m = torch.randn(2, 3, 4, device="tpu"), torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool, device="tpu")
    with pytest.raises(NotImplementedError, match="_nested_tensor_from_mask: nested tensors are not supported") as e:
        torch._nested_tensor_from_mask(x, m)
    assert isinstance(e.value, NestedTensorUnsupported)
    assert torch_tpu.metrics.fallback_counts().get("aten::_nested_tensor_from_mask", 0) == 0


@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("masks", ["none", "padding", "attn", "both"])
@pytest.mark.parametrize("embed,heads", [(16, 2), (12, 2)])  # head_dim 8 takes the sdpa path (no weights, no mask); 6 not
def test_multihead_attention_fast_path_runs_on_tpu_as_cpu(need_weights, average, masks, embed, heads):
    """nn.MultiheadAttention(batch_first=True) in eval without grad calls _native_multi_head_attention:
    outputs and weights equal CPU's, including CPU's NaN for a row whose every key is masked."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(embed, heads, batch_first=True).eval()
    x = torch.randn(3, 5, embed)
    padding = torch.zeros(3, 5, dtype=torch.bool)
    padding[0, 3:] = True
    padding[1, :] = True  # every key masked: NaN on CPU
    attn = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    kw = {"need_weights": need_weights, "average_attn_weights": average}
    if masks in ("padding", "both"):
        kw["key_padding_mask"] = padding
    if masks in ("attn", "both"):
        kw["attn_mask"] = attn
    torch_tpu.metrics.reset()
    with torch.no_grad():
        ref = mha(x, x, x, **kw)
        tpu = copy.deepcopy(mha).to("tpu")
        xt = x.to("tpu")
        got = tpu(xt, xt, xt, **{k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
    assert torch_tpu.metrics.fallback_counts() == {}
    torch.testing.assert_close(got[0].cpu(), ref[0], atol=1e-6, rtol=1e-5, equal_nan=True)
    if ref[1] is None:
        assert got[1] is None
    else:
        torch.testing.assert_close(got[1].cpu(), ref[1], atol=1e-6, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("masks", ["none", "padding", "causal"])
def test_encoder_layer_fast_path_runs_on_tpu_as_cpu(norm_first, activation, masks):
    """nn.TransformerEncoderLayer(batch_first=True) in eval without grad calls
    _transformer_encoder_layer_fwd: CPU's result, with no CPU fallback."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, 0.0, activation=activation, batch_first=True,
                                       norm_first=norm_first).eval()
    x = torch.randn(3, 6, 32)
    kw = {}
    if masks == "padding":
        kw["src_key_padding_mask"] = torch.tensor([[0] * 6, [0] * 4 + [1] * 2, [0] * 5 + [1]], dtype=torch.bool)
    elif masks == "causal":
        kw["src_mask"] = nn.Transformer.generate_square_subsequent_mask(6) < 0
    torch_tpu.metrics.reset()
    got, ref = _both(layer, x, **kw)
    assert torch_tpu.metrics.fallback_counts() == {}
    torch.testing.assert_close(got, ref, atol=2e-6, rtol=1e-5)


def test_left_aligned_mask_check_runs_on_tpu_as_cpu():
    """TransformerEncoder's question before its nested path (_nested_tensor_from_mask_left_aligned):
    CPU's answers and errors, computed on tpu (no CPU fallback)."""
    torch_tpu.metrics.reset()
    x = torch.randn(2, 3, 4)
    for rows in ([[1, 1, 0], [1, 0, 0]], [[1, 0, 1], [1, 0, 0]], [[0, 1, 1], [1, 0, 0]], [[0, 0, 0], [1, 1, 1]]):
        m = torch.tensor(rows, dtype=torch.bool)
        assert torch._nested_tensor_from_mask_left_aligned(x.to("tpu"), m.to("tpu")) == \
            torch._nested_tensor_from_mask_left_aligned(x, m)
    for mask, match in ((torch.ones(2, 4, dtype=torch.bool), "Mask size should match input size"),
                        (torch.ones(2, 3), "Expected mask to be of ScalarType Bool, but got Float instead")):
        with pytest.raises(RuntimeError, match=match):
            torch._nested_tensor_from_mask_left_aligned(x, mask)
        with pytest.raises(RuntimeError, match=match):
            torch._nested_tensor_from_mask_left_aligned(x.to("tpu"), mask.to("tpu"))
    assert torch_tpu.metrics.fallback_counts() == {}


def test_compiled_inference_through_the_fast_path_is_lowered_and_bucketed():
    """torch.compile(backend="tpu") of an encoder in eval under no_grad traces PyTorch's fused layer
    kernel (_transformer_encoder_layer_fwd): it is decomposed as eager runs it, so the graph lowers
    (no eager fallback) and compiles once per bucket of a changing length; results equal CPU's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, 0.0, batch_first=True), 2,
                                enable_nested_tensor=False).eval()
    f = torch.compile(copy.deepcopy(enc).to("tpu"), backend="tpu")
    torch_tpu.metrics.reset()
    before = torch_tpu.metrics.counters()["graph_eager_fallbacks"]
    for k, n in enumerate((17, 20, 23, 29)):
        if k == 2:
            graphs = torch_tpu.metrics.counters()["compiled_graphs"]
        x = torch.randn(4, n, 32)
        mask = torch.zeros(4, n, dtype=torch.bool)
        mask[1, n - 3:] = True
        with torch.no_grad():
            got = f(x.to("tpu"), src_key_padding_mask=mask.to("tpu"))
            torch.testing.assert_close(got.cpu(), enc(x, src_key_padding_mask=mask), atol=2e-6, rtol=1e-5)
    assert torch_tpu.metrics.counters()["compiled_graphs"] == graphs, "a length in a seen bucket compiled a graph"
    assert torch_tpu.metrics.counters()["graph_eager_fallbacks"] == before
    assert torch_tpu.metrics.fallback_counts() == {}
    torch._dynamo.reset()
