"""torch.nn's transformer modules in eval mode on tpu give CPU's results: TransformerEncoder's
nested-tensor fast path (eval, no grad, a padding mask) meets `_nested_tensor_from_mask`, which
nested tensors on tpu cannot run; integrations/nn_transformer.py gives that path its result (padded
positions zeroed before the encoder's norm, as CPU's nested path pads them)."""
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
