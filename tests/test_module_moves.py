"""Moving modules and parameters between CPU and tpu keeps shared parameters shared.

Module.to() / .tpu() / .cpu() / .half() / to_empty() keep a Parameter object (so tied weights stay
tied) only when torch._has_compatible_shallow_copy_type(old, new) is true, and `param.data = t`
needs the same; CUDA answers true between dense CPU and CUDA tensors, and so must tpu.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu  # noqa: F401


class TiedLM(nn.Module):
    """An embedding whose weight is also the output head's (GPT-2, T5, BERT's MLM head)."""

    def __init__(self, vocab=16, dim=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mid = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mid(self.emb(ids))))


def _tied(m):
    return m.head.weight is m.emb.weight


@pytest.mark.parametrize("move", [
    lambda m: m.to("tpu"),
    lambda m: m.tpu(),
    lambda m: m.to(torch.device("tpu", 0)),
    lambda m: m.to("tpu").to(torch.float64),
    lambda m: m.to("tpu").half(),
    lambda m: m.to("tpu").cpu(),
    lambda m: m.to("tpu").to("cpu").to("tpu"),
    lambda m: m.to_empty(device="tpu"),
], ids=["to", "tpu()", "to(device)", "to(dtype)", "half", "cpu()", "roundtrip", "to_empty"])
def test_tied_parameters_stay_one_object(move):
    m = TiedLM()
    ids_before = {id(p) for p in m.parameters()}
    moved = move(m)
    assert moved is m
    assert _tied(m)
    assert {id(p) for p in m.parameters()} == ids_before  # the same Parameter objects, as on CUDA
    assert len(list(m.parameters())) == 3  # emb/head weight counted once, mid weight and bias


def test_to_moves_values_and_gradients():
    m = TiedLM()
    ref = copy.deepcopy(m)
    m(torch.tensor([1, 2])).sum().backward()
    grad = m.emb.weight.grad.clone()
    m.to("tpu")
    assert m.emb.weight.device.type == "tpu" and m.emb.weight.grad.device.type == "tpu"
    torch.testing.assert_close(m.emb.weight.cpu(), ref.emb.weight.detach())
    torch.testing.assert_close(m.emb.weight.grad.cpu(), grad)


def test_tied_model_trains_as_on_cpu():
    torch.manual_seed(0)
    cpu = TiedLM()
    tpu = copy.deepcopy(cpu).to("tpu")
    ids = torch.randint(0, 16, (4, 6))
    losses = {}
    for name, model, dev in (("cpu", cpu, "cpu"), ("tpu", tpu, "tpu")):
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        out = []
        for _ in range(4):
            logits = model(ids.to(dev))
            loss = F.cross_entropy(logits.flatten(0, 1), ids.flatten().to(dev))
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
        losses[name] = out
    assert _tied(tpu)
    torch.testing.assert_close(losses["tpu"], losses["cpu"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tpu.emb.weight.cpu(), cpu.emb.weight.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("src,dst", [("cpu", "tpu"), ("tpu", "cpu"), ("tpu", "tpu")])
def test_param_data_assignment(src, dst):
    p = nn.Parameter(torch.randn(3, 2, device=src))
    new = torch.arange(6.0).reshape(3, 2).to(dst)
    p.data = new
    assert isinstance(p, nn.Parameter) and p.requires_grad
    assert p.device == new.device
    torch.testing.assert_close(p.detach().cpu(), torch.arange(6.0).reshape(3, 2))
    (p * 2).sum().backward()  # the gradient accumulator follows the new device
    assert p.grad.device == new.device
    torch.testing.assert_close(p.grad.cpu(), torch.full((3, 2), 2.0))


def test_param_data_assignment_keeps_a_tie():
    m = TiedLM()
    m.emb.weight.data = m.emb.weight.data.to("tpu")
    assert _tied(m) and m.head.weight.device.type == "tpu"


def test_shallow_copy_compatibility_matches_cuda_rules():
    t = torch.zeros(2, device="tpu")
    c = torch.zeros(2)
    assert torch._has_compatible_shallow_copy_type(t, c)
    assert torch._has_compatible_shallow_copy_type(c, t)
    assert torch._has_compatible_shallow_copy_type(t, t)
    assert not torch._has_compatible_shallow_copy_type(t, torch.zeros(2, device="meta"))
    assert not torch._has_compatible_shallow_copy_type(t, c.to_sparse())
    with pytest.raises(RuntimeError, match="incompatible tensor type"):
        nn.Parameter(torch.zeros(2, device="tpu")).data = c.to_sparse()


def test_hugging_face_gpt2_with_tied_embeddings_trains_as_on_cpu():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    cpu = transformers.GPT2LMHeadModel(cfg)
    tpu = copy.deepcopy(cpu).to("tpu")
    assert tpu.lm_head.weight is tpu.transformer.wte.weight
    ids = torch.randint(0, 64, (2, 12))
    losses = {}
    for name, model, dev in (("cpu", cpu, "cpu"), ("tpu", tpu, "tpu")):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        out = []
        for _ in range(5):
            loss = model(ids.to(dev), labels=ids.to(dev)).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
        losses[name] = out
    assert losses["cpu"][-1] < losses["cpu"][0]
    torch.testing.assert_close(losses["tpu"], losses["cpu"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(tpu.transformer.wte.weight.cpu(), cpu.transformer.wte.weight.detach(),
                               rtol=1e-4, atol=1e-5)
