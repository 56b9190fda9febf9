"""torch.compile(backend="tpu") with PyTorch's default dynamic=None and a length that changes (issue
49): after the first recompile Dynamo makes the length symbolic, and every tpu hook that reads sizes
(here scaled_dot_product_attention's backend choice) must take symbolic sizes. Results equal CPU's."""
import copy

import pytest
import torch
import torch.nn.functional as F

import torch_tpu

TPU = torch.device("tpu")


@pytest.fixture(autouse=True)
def no_eager_graphs():
    """Every graph is lowered and runs as a program: none falls back to running eagerly."""
    torch._dynamo.reset()
    before = torch_tpu.metrics.counters()["graph_eager_fallbacks"]
    yield
    assert torch_tpu.metrics.counters()["graph_eager_fallbacks"] == before, "a graph ran eagerly"


def test_sdpa_under_default_dynamic():
    f = torch.compile(lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True), backend="tpu")
    for n in (8, 9, 10, 13):
        q = torch.randn(1, 2, n, 16)
        torch.testing.assert_close(f(q.to(TPU)).cpu(), F.scaled_dot_product_attention(q, q, q, is_causal=True),
                                   atol=1e-5, rtol=1e-5)


def test_a_bool_padding_mask_indexed_by_aranges_is_lowered():
    """Hugging Face's mask functions read padding_mask[batch_idx, kv_idx] (a bool operand, integer
    indices): the graph is one program, not an eager fallback (a bool *operand* is not a mask index)."""
    def f(mask, x):
        keep = mask.bool()[torch.arange(mask.shape[0], device=x.device)[:, None],
                           torch.arange(mask.shape[1], device=x.device)[None, :]]
        return x.masked_fill(~keep, 0.0).sum(1)
    g = torch.compile(f, backend="tpu")
    for n in (5, 7, 9):
        mask, x = (torch.rand(3, n) > 0.3).long(), torch.randn(3, n)
        torch.testing.assert_close(g(mask.to(TPU), x.to(TPU)).cpu(), f(mask, x))


def test_multihead_attention_trains_under_default_dynamic():
    torch.manual_seed(0)
    cpu = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    tpu = copy.deepcopy(cpu).to(TPU)

    def loss(m, x, mask):
        return m(x, x, x, attn_mask=mask, need_weights=False)[0].pow(2).mean()
    step = torch.compile(loss, backend="tpu")
    for n in (5, 6, 9):
        x = torch.randn(2, n, 16)
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
        lc, lt = loss(cpu, x, mask), step(tpu, x.to(TPU), mask.to(TPU))
        lc.backward()
        lt.backward()
        torch.testing.assert_close(lt.cpu(), lc, atol=1e-5, rtol=1e-5)
        for pc, pt in zip(cpu.parameters(), tpu.parameters()):
            torch.testing.assert_close(pt.grad.cpu(), pc.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_gpt2_loss_under_default_dynamic_with_changing_lengths():
    transformers = pytest.importorskip("transformers")
    from models import zoo  # noqa: F401  (imports torchvision the way transformers can load it)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    cpu = transformers.GPT2LMHeadModel(cfg).eval()
    tpu = copy.deepcopy(cpu).to(TPU)
    fwd = torch.compile(lambda m, ids: m(input_ids=ids, labels=ids).loss, backend="tpu")
    g = torch.Generator().manual_seed(1)
    for n in (8, 11, 16, 5):
        ids = torch.randint(0, 128, (2, n), generator=g)
        lc, lt = cpu(input_ids=ids, labels=ids).loss, fwd(tpu, ids.to(TPU))
        torch.testing.assert_close(lt.cpu(), lc, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name,buckets", [("bert", "pow2"), ("llama", "pow2"), ("mixtral", "pow2"), ("gpt2", "off")])
@pytest.mark.slow
def test_hf_training_step_under_default_dynamic(name, buckets, monkeypatch):
    """Forward and backward of the zoo's BERT, Llama and Mixtral (MoE: a topk router over the experts
    of a symbolic number of tokens, data-dependent expert batches) with a length that changes every
    step: loss and every gradient equal CPU's. GPT-2 with buckets off takes the per-shape path (a
    graph that cannot be bucketed): the backward's saved activations come from per-shape forwards in
    another layout than the symbolic trace had (a dense tensor for a transposed view) and are
    restrided to it, not refused by the graph's views."""
    monkeypatch.setenv("TORCH_TPU_SHAPE_BUCKETS", buckets)
    pytest.importorskip("transformers")
    from models import zoo
    torch.manual_seed(0)
    cpu = zoo.BY_NAME[name].build()
    tpu = copy.deepcopy(cpu).to(TPU)
    step = torch.compile(lambda m, ids: m(input_ids=ids, labels=ids).loss, backend="tpu")
    g = torch.Generator().manual_seed(1)
    for n in (8, 11, 5):
        ids = torch.randint(0, zoo.VOCAB, (2, n), generator=g)
        lt, lc = step(tpu, ids.to(TPU)), cpu(input_ids=ids, labels=ids).loss
        lt.backward()
        lc.backward()
        torch.testing.assert_close(lt.cpu(), lc, atol=1e-5, rtol=1e-5)
        for (pname, pc), pt in zip(cpu.named_parameters(), tpu.parameters()):
            assert (pc.grad is None) == (pt.grad is None), pname
            if pc.grad is not None:
                torch.testing.assert_close(pt.grad.cpu(), pc.grad, atol=1e-5, rtol=1e-4, msg=pname)
            pc.grad = pt.grad = None


@pytest.mark.slow
def test_llama_generate_under_default_dynamic():
    """Hugging Face generate() with a compiled forward, prompts of several lengths: CPU's tokens, and
    programs per bucket, not per prompt and cache length."""
    pytest.importorskip("transformers")
    from models import zoo
    torch.manual_seed(0)
    cpu = zoo.BY_NAME["llama"].build().eval()
    tpu = copy.deepcopy(cpu).to(TPU)
    tpu.forward = torch.compile(tpu.forward, backend="tpu")
    g = torch.Generator().manual_seed(1)
    torch_tpu.recompiles.reset()
    for k, n in enumerate((5, 9, 12, 7)):
        if k == 2:  # from the second prompt on, prefill and decode are symbolic in the length: bucket 16
            graphs = torch_tpu.metrics.counters()["compiled_graphs"]
        ids = torch.randint(0, zoo.VOCAB, (1, n), generator=g)
        got = tpu.generate(ids.to(TPU), max_new_tokens=4, do_sample=False, pad_token_id=0)
        assert torch.equal(got.cpu(), cpu.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0))
    # The KV cache's cat along the length buckets too: no program for a new prompt or cache length.
    assert torch_tpu.metrics.counters()["compiled_graphs"] == graphs
    assert torch_tpu.metrics.bucket_refusals() == {}

