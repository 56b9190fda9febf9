"""Bucketed compiled graphs (issue 49 item 3, torch_tpu/dynamo/buckets.py): a graph with symbolic
sizes compiles once per bucket of its sizes, and its results on the valid region equal CPU's. Inputs
are given with NaN in their bucket's padding (the front of a NaN-filled bucket-sized buffer, which a
bucketed program reads without a copy), so a reduction, contraction or softmax that read the padding
would return NaN."""
import copy
import gc

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu.dynamo import buckets
from torch_tpu import recompiles

TPU = torch.device("tpu")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv("TORCH_TPU_SHAPE_BUCKETS", raising=False)
    torch._dynamo.reset()
    recompiles.reset()  # bucket_refusals() starts empty
    yield
    torch._dynamo.reset()
    gc.collect()  # this file's graph caches go with it (test_soak counts the live ones)


def nan_padded(x: torch.Tensor, cap: int) -> torch.Tensor:
    """x on tpu at the front of a NaN-filled buffer of `cap` elements."""
    buf = torch.full((cap,), float("nan"), dtype=x.dtype, device=TPU)
    buf[:x.numel()].copy_(x.reshape(-1).to(TPU))
    return buf[:x.numel()].view(x.shape)


def grads_equal_then_cleared(cpu, tpu) -> None:
    """Every gradient of the tpu copy equals the CPU model's; both are zeroed for the next step."""
    for pc, pt in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(pt.grad.cpu(), pc.grad, atol=1e-5, rtol=1e-4)
    cpu.zero_grad()
    tpu.zero_grad()


def graphs() -> int:
    return torch_tpu.metrics.counters()["compiled_graphs"]


def test_bucket_policy(monkeypatch):
    assert [buckets.bucket(n, None) for n in (1, 16, 17, 100)] == [16, 16, 32, 128]
    assert buckets.bucket(100, 64) == 100  # never below the value, never above Dynamo's bound
    assert buckets.bucket(40, 64) == 64
    monkeypatch.setenv("TORCH_TPU_SHAPE_BUCKETS", "multiple:128")
    assert buckets.bucket(130, None) == 256
    monkeypatch.setenv("TORCH_TPU_SHAPE_BUCKETS", "pow2:4")
    assert buckets.bucket(3, None) == 4
    monkeypatch.setenv("TORCH_TPU_SHAPE_BUCKETS", "squares")
    with pytest.raises(ValueError, match="TORCH_TPU_SHAPE_BUCKETS='squares'"):
        buckets.bucket(3, None)


def attention_like(x, w):
    h = x @ w                                            # splits and merges the symbolic dimension
    a = torch.softmax(h @ h.transpose(-1, -2) / 4, -1)   # contraction and softmax over it
    return (a @ h).mean(1), h.sum(1), a, h.amax(1)


def test_one_program_per_bucket_and_padding_never_read():
    torch.manual_seed(0)
    w = torch.randn(16, 16)
    f = torch.compile(attention_like, backend="tpu")
    wt = w.to(TPU)
    f(torch.randn(2, 4, 16).to(TPU), wt)                 # Dynamo's first, static compile
    before = graphs()
    for n in (5, 7, 9, 12, 3, 16):                       # one bucket (16)
        x = torch.randn(2, n, 16)
        got = f(nan_padded(x, 2 * 16 * 16), wt)
        for g, e in zip(got, attention_like(x, w)):
            assert g.shape == e.shape and g.is_contiguous()
            torch.testing.assert_close(g.cpu(), e, atol=1e-5, rtol=1e-5)
    assert graphs() - before == 1
    for n in (17, 30):                                   # the next bucket (32)
        x = torch.randn(2, n, 16)
        for g, e in zip(f(x.to(TPU), wt), attention_like(x, w)):
            torch.testing.assert_close(g.cpu(), e, atol=1e-5, rtol=1e-5)
    assert graphs() - before == 2
    assert torch_tpu.metrics.bucket_refusals() == {}


@pytest.mark.parametrize("name,fn", [
    ("mean", lambda x: x.mean(1)),
    ("sum_all", lambda x: x.sum()),
    ("log_softmax", lambda x: F.log_softmax(x, 1)),
    ("constant_pad_nd", lambda x: F.pad(x, (0, 0, 1, 2), value=3.0).sum(1)),
    ("slice", lambda x: x[:, 1:].sum(1)),
    ("slice_from_the_end", lambda x: x[:, -2:] * 3),
    ("cat_along_it", lambda x: torch.cat([x, x[:, :1] * 3, x * 2], 1) + 1),  # a KV cache grows by a token
    ("cat_along_it_reduced", lambda x: torch.cat([x * 2, x], 1).softmax(1).sum(2)),
    ("select_scatter", lambda x: torch.select_scatter(x, x[:, 0] * 2, 1, 1).sum(1)),
    ("arange", lambda x: x * torch.arange(x.shape[1], device=x.device).view(1, -1, 1)),
    ("nll_ignore_index", lambda x: F.cross_entropy(x.flatten(0, 1), (x.flatten(0, 1)[:, 0] * 2).long().clamp(-1, 4),
                                                   ignore_index=-1)),
    ("tril", lambda x: torch.tril(x @ x.transpose(1, 2)).sum(2)),
])
def test_ops_over_a_padded_dimension(name, fn):
    f = torch.compile(fn, backend="tpu", dynamic=True)
    for n in (3, 6, 11):
        x = torch.randn(2, n, 5)
        got = f(nan_padded(x, 2 * 16 * 5))
        torch.testing.assert_close(got.cpu(), fn(x), atol=1e-5, rtol=1e-5, equal_nan=False)
    assert torch_tpu.metrics.bucket_refusals() == {}


@pytest.mark.parametrize("name,fn", [
    ("topk", lambda x: torch.topk(x, 2, dim=-1).values.sum(1) + torch.topk(x, 2).indices.sum(1)),
    ("sort", lambda x: x.sort(-1, descending=True).values * 2),
])
def test_ordering_along_a_static_dimension(name, fn):
    """A MoE router's topk over the experts, with the token count symbolic: each row is ordered on its
    own, so padded rows never reach the valid ones."""
    f = torch.compile(fn, backend="tpu")
    before = graphs()
    for n in (3, 6, 11):
        x = torch.randn(2, n, 5)
        xt = nan_padded(x, 2 * 16 * 5)
        torch._dynamo.mark_dynamic(xt, 1)
        torch.testing.assert_close(f(xt).cpu(), fn(x), atol=1e-5, rtol=1e-5, equal_nan=False)
    assert torch_tpu.metrics.bucket_refusals() == {}
    assert graphs() - before == 1


@pytest.mark.slow
def test_gpt2_training_step_one_program_per_bucket():
    transformers = pytest.importorskip("transformers")
    from models import zoo  # noqa: F401  (imports torchvision the way transformers can load it)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    cpu = transformers.GPT2LMHeadModel(cfg)
    tpu = copy.deepcopy(cpu).to(TPU)

    def step(m, ids):
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss
    f = torch.compile(step, backend="tpu")
    g = torch.Generator().manual_seed(1)
    lengths = (8, 11, 16, 5, 13, 9)
    for k, n in enumerate(lengths):
        if k == 2:
            before = graphs()                    # symbolic from the second length on; 11 made its bucket
        ids = torch.randint(0, 128, (2, n), generator=g)
        torch.testing.assert_close(f(tpu, ids.to(TPU)).cpu(), step(cpu, ids), atol=1e-5, rtol=1e-5)
        grads_equal_then_cleared(cpu, tpu)
    assert graphs() == before, "a length in a seen bucket compiled a program"
    assert torch_tpu.metrics.bucket_refusals() == {}


@pytest.mark.slow
def test_bert_with_a_padding_mask_one_program_per_bucket():
    """A classifier on batches padded to their longest row (DataCollatorWithPadding), with a short
    batch among them (an epoch's last): Hugging Face's mask functions index the padding mask with
    aranges over the batch and the length (padding_mask[batch_idx, kv_idx]), and once the batch size
    changed the two aranges have different symbols (input_ids' batch, attention_mask's): checked on
    the device, the graph still buckets."""
    transformers = pytest.importorskip("transformers")
    from models import zoo  # noqa: F401  (imports torchvision the way transformers can load it)
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, num_labels=3,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    cpu = transformers.BertForSequenceClassification(cfg)
    tpu = copy.deepcopy(cpu).to(TPU)

    def step(m, ids, mask, labels):
        loss = m(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        return loss
    f = torch.compile(step, backend="tpu")
    g = torch.Generator().manual_seed(1)
    for k, (rows_, n) in enumerate(((4, 8), (4, 11), (3, 13), (4, 16), (4, 5), (2, 13))):
        if k == 3:
            before = graphs()
        rows = torch.randint(1, n + 1, (rows_,), generator=g)
        rows[0] = n
        mask = (torch.arange(n)[None, :] < rows[:, None]).long()
        ids, labels = torch.randint(1, 128, (rows_, n), generator=g) * mask, torch.randint(0, 3, (rows_,), generator=g)
        args = (ids, mask, labels)
        torch.testing.assert_close(f(tpu, *(a.to(TPU) for a in args)).cpu(), step(cpu, *args), atol=1e-5, rtol=1e-5)
        grads_equal_then_cleared(cpu, tpu)
    assert graphs() == before, "a batch size and length in a seen bucket compiled a program"
    assert torch_tpu.metrics.bucket_refusals() == {}


def test_indexing_a_padded_operand_checks_indices_on_the_device():
    """index.Tensor, gather and index_select read a padded operand at indices checked on the device
    against its true size: negative indices count from the true size, a bad index raises CPU's error
    (with the true size) at the next synchronisation, and no graph refuses bucketing."""
    by_aranges = lambda x: x[torch.arange(x.shape[0], device=x.device)[:, None],  # noqa: E731
                             torch.arange(x.shape[1], device=x.device)[None, :] + 0]
    f = torch.compile(by_aranges, backend="tpu", dynamic=True)
    for n in (3, 6, 11):
        x = torch.randn(2, n, 5)
        torch.testing.assert_close(f(nan_padded(x, 2 * 16 * 16)).cpu(), by_aranges(x), equal_nan=False)

    torch._dynamo.reset()
    fn = lambda x, i, j, k: (x[:, i], x.gather(1, j), x.index_select(1, k))  # noqa: E731
    f = torch.compile(fn, backend="tpu", dynamic=True)
    before = graphs()
    for n in (3, 6, 9, 12):
        x = torch.randn(4, n)
        i, j = torch.tensor([n - 1, 0, 1, n - 2]), torch.randint(0, n, (4, 5))
        i = torch.cat([i, i - n])  # negative too
        args = (i, j, j[0])
        for got, want in zip(f(nan_padded(x, 4 * 16), *(a.to(TPU) for a in args)), fn(x, *args)):
            torch.testing.assert_close(got.cpu(), want)
    assert graphs() - before == 1  # one bucket
    assert torch_tpu.metrics.bucket_refusals() == {}

    x, ok, zeros = torch.randn(4, 6), torch.zeros(5, dtype=torch.long), torch.zeros(4, 5, dtype=torch.long)
    for args, error, message in (((torch.tensor([0, 6]), zeros, ok), IndexError,
                                  "index 6 is out of bounds for dimension 0 with size 6"),
                                 ((torch.tensor([0, -7]), zeros, ok), IndexError,
                                  "index -7 is out of bounds for dimension 0 with size 6"),
                                 ((ok, torch.full((4, 5), 6), ok), RuntimeError,
                                  "index 6 is out of bounds for dimension 1 with size 6"),
                                 ((ok, zeros, torch.tensor([0, -1, 0, 0, 0])), RuntimeError,
                                  "INDICES element is out of DATA bounds, id=-1 axis_dim=6")):
        with pytest.raises(error, match=message):
            fn(x, *args)
        with pytest.raises(error, match=message):
            f(nan_padded(x, 4 * 16), *(a.to(TPU) for a in args))[0].cpu()
    assert graphs() - before == 1  # the same bucket (k has j's size, as in the loop; x a view, as there)


def test_index_checks_see_the_valid_region_only():
    """An index tensor of symbolic size into a static table (an embedding of the input ids): garbage
    in the index's padding raises nothing, and a bad index in the valid region raises CPU's error."""
    w = torch.randn(10, 4)
    fn = lambda ids, w: F.embedding(ids, w).sum(1) + w.index_select(0, ids.flatten()).sum(0)  # noqa: E731
    f = torch.compile(fn, backend="tpu")
    for n in (3, 5, 9, 12):
        ids = torch.randint(0, 10, (2, n))
        buf = torch.full((2 * 16,), 999, dtype=torch.int64, device=TPU)  # out of range for the table
        buf[:ids.numel()].copy_(ids.reshape(-1).to(TPU))
        torch.testing.assert_close(f(buf[:ids.numel()].view(2, n), w.to(TPU)).cpu(), fn(ids, w))
    assert torch_tpu.metrics.bucket_refusals() == {}
    ids = torch.randint(0, 10, (2, 7))
    ids[1, 6] = 12
    with pytest.raises(IndexError, match="index out of range in self"):
        f(ids.to(TPU), w.to(TPU)).cpu()


def test_dropout_in_a_bucket():
    """Dropout in training draws at the bucket's layout: every kept value is scaled by 1/(1-p), about
    1-p of them are kept, its backward applies the same mask, and one seed gives the same mask."""
    torch.manual_seed(0)
    f = torch.compile(lambda x: F.dropout(x * 1, 0.25, training=True), backend="tpu", dynamic=True)
    before = graphs()
    for n in (5, 9, 12):
        x = torch.ones(4, n, 32, device=TPU, requires_grad=True)
        y = f(x)
        y.sum().backward()
        y = y.detach().cpu()
        assert y.shape == (4, n, 32) and bool(((y == 0) | ((y - 4 / 3).abs() < 1e-6)).all())
        assert 0.6 < (y != 0).float().mean().item() < 0.9
        torch.testing.assert_close(x.grad.cpu(), y)
    assert graphs() - before == 2  # forward and backward, one bucket
    assert torch_tpu.metrics.bucket_refusals() == {}
    torch.manual_seed(5)
    a = f(torch.ones(4, 12, 32, device=TPU)).cpu()
    torch.manual_seed(5)
    assert torch.equal(a, f(torch.ones(4, 12, 32, device=TPU)).cpu())


def test_a_graph_that_cannot_be_bucketed_runs_per_shape_and_says_why():
    fn = lambda x: torch.split(x, [1, x.shape[1] - 1], 1)[1].sum(1)  # noqa: E731  (split along the length)
    f = torch.compile(fn, backend="tpu", dynamic=True)
    for n in (3, 6):
        x = torch.randn(2, n, 4)
        torch.testing.assert_close(f(x.to(TPU)).cpu(), fn(x))
    (why,) = torch_tpu.metrics.bucket_refusals().values()
    assert "along a symbolic dimension" in why


def test_buckets_off(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_SHAPE_BUCKETS", "off")
    fn = lambda x: x.sum(1)  # noqa: E731
    f = torch.compile(fn, backend="tpu", dynamic=True)
    before = graphs()
    for n in (3, 5):
        x = torch.randn(2, n)
        torch.testing.assert_close(f(x.to(TPU)).cpu(), fn(x))
    assert graphs() - before == 2  # one per shape


_FIXED_SLICES = {
    "slice": lambda x: x[:, :2] * 3,
    "after": lambda x: (x * 3)[:, :2],
    "contiguous": lambda x: (x * 3)[:, :2].contiguous(),
    "first_dim": lambda x: (x[0] * 3)[:2],
    "pair": lambda x: (lambda y: (y, y[:, :2]))(x * 3),
    "middle": lambda x: x[:, 1:3].sum(-1) + x.sum(1)[:, :2],
    "step": lambda x: x[:, 0:4:2] * 2,
    "one_reshaped": lambda x: x[:, :1].reshape(2, 8) * 3,
    "last_reshaped": lambda x: x[:, -1:].reshape(2, 8) * 3,
    "two_reshaped": lambda x: x[:, :2].reshape(2, 16) * 3,
}


@pytest.mark.parametrize("name", list(_FIXED_SLICES))
def test_a_fixed_size_slice_along_a_symbolic_length(name):
    """x[:, :2] of a changing length: XLA kept the sliced dimension dynamic with the operand's true size
    (past the slice's bound), and the program's result wrote past its buffer: heap corruption that
    killed the process (a new user's trial). No refusal: one program per bucket."""
    fn = _FIXED_SLICES[name]
    f = torch.compile(fn, backend="tpu")
    for n in (9, 11, 14, 20, 5):
        x = torch.randn(2, n, 8)
        xt = nan_padded(x, 2 * 32 * 8) if n > 16 else x.to(TPU)
        torch._dynamo.mark_dynamic(xt, 1)
        want, got = fn(x), f(xt)
        for w, g in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
            torch.testing.assert_close(g.cpu(), w)
    assert torch_tpu.metrics.bucket_refusals() == {}


_SHIFTED = {
    "diff": lambda x: x[:, 1:] - x[:, :-1],
    "diff_sum": lambda x: (x[:, 1:] - x[:, :-1]).sum(1),
    "tail": lambda x: x[:, 1:] * 2,
    "head_mean": lambda x: x[:, :-1].mean(1),
}


@pytest.mark.parametrize("name", list(_SHIFTED))
def test_slices_one_short_of_a_symbolic_length_bucket(name):
    """x[:, 1:] has size Max(1, s - 1) in PyTorch's own Max class, which the bucketing took for a size
    that shrinks as s grows: the graph was refused and compiled per length (a new user's trial)."""
    fn = _SHIFTED[name]
    f = torch.compile(fn, backend="tpu")
    graphs = torch_tpu.metrics.counters()["compiled_graphs"]
    for n in (9, 11, 14, 20, 5):
        x = torch.randn(2, n, 8)
        xt = nan_padded(x, 2 * 32 * 8)
        torch._dynamo.mark_dynamic(xt, 1)
        torch.testing.assert_close(f(xt).cpu(), fn(x))
    assert torch_tpu.metrics.bucket_refusals() == {}
    assert torch_tpu.metrics.counters()["compiled_graphs"] - graphs == 2  # buckets 16 and 32


def test_rows_counted_from_the_end_of_a_symbolic_length():
    """x[:, -1] (last-token pooling) and select at other negative indices along a changing length,
    forward and backward (select_scatter), with NaN in the padding: one forward and one backward
    program for the bucket, CPU's values and gradients."""
    def fn(x, w):
        h = torch.tanh(x @ w)
        return (h[:, -1] * 2).sum() + h[:, -2, 1:].sum() + h.select(1, -3).mean()
    f = torch.compile(fn, backend="tpu", dynamic=True)
    before = graphs()
    torch.manual_seed(0)
    for n in (4, 6, 9, 12):
        x, w = torch.randn(3, n, 8, requires_grad=True), torch.randn(8, 5, requires_grad=True)
        xt, wt = nan_padded(x.detach(), 3 * 16 * 8).requires_grad_(), w.detach().to(TPU).requires_grad_()
        got, want = f(xt, wt), fn(x, w)
        got.backward()
        want.backward()
        torch.testing.assert_close(got.detach().cpu(), want.detach(), atol=1e-4, rtol=1e-4)  # sums' order
        torch.testing.assert_close(xt.grad.cpu(), x.grad, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(wt.grad.cpu(), w.grad, atol=1e-4, rtol=1e-4)
    assert graphs() - before == 2
    assert torch_tpu.metrics.bucket_refusals() == {}


def _shift_right(x):
    out = x.new_zeros(x.shape)
    out[:, 1:] = x[:, :-1].clone()
    out[:, 0] = 7
    return out


def _routed(x):
    flat = x.reshape(-1, x.shape[-1])
    perm = torch.argsort(flat[:, 0])
    rows = flat[perm // 1]  # floor_divide: Mixtral's hidden_states[perm // top_k]
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=x.device)  # index_put
    return rows[inverse] * rows.sum(1, keepdim=True)[inverse]


def _grouped_experts(x):
    """transformers' grouped-mm MoE: tokens counted per expert with histc (the padding must fall in
    no bin), sorted by expert, one _grouped_mm over the groups."""
    flat = x.reshape(-1, 4)
    offs = torch.histc(flat[:, 0].clamp(-0.99, 0.99), bins=2, min=-1, max=1).cumsum(0).to(torch.int32)
    w = torch.arange(32, dtype=x.dtype, device=x.device).reshape(2, 4, 4) / 10
    return torch._grouped_mm(flat[torch.argsort(flat[:, 0])], w, offs=offs)


_ALONG_THE_LENGTH = {  # reductions, scans and reversals over a changing length, and their backward
    "max_min": lambda x: x.max(1).values.sum() + x.min(1).values.sum() + x.max(1).indices.sum(),
    "arg": lambda x: (x * x.argmax(1, keepdim=True) + x.argmin(1, keepdim=True)).sum(),
    "var_std": lambda x: x.var(1).sum() + x.std(1, correction=0).sum() + sum(torch.var_mean(x, 1)).sum(),
    "norms": lambda x: x.norm(dim=1).sum() + torch.linalg.vector_norm(x, float("inf"), dim=1).sum(),
    "logsumexp": lambda x: x.logsumexp(1).sum(),
    "prod": lambda x: (x * 0.1 + 1).prod(1).sum() + (x * 0.01 + 1).prod(),
    "cumsum": lambda x: (x.cumsum(1) * x).sum() + x.reshape(-1).cumsum(0)[-1],
    "flip": lambda x: (x.flip(1) * torch.arange(x.shape[1], device=x.device)[:, None]).sum(),
    "all_max": lambda x: x.max() + x.min(),
    "sort_topk": lambda x: ((torch.sort(x, 1)[0] * torch.arange(x.shape[1], device=x.device)[:, None]).sum()
                            + torch.topk(x, 3, 1)[0].pow(2).sum() + torch.sort(x, 1, descending=True)[1][:, 0].sum()
                            + x.gather(1, x.argsort(1)).cumsum(1).sum()),
    "scatter": lambda x: torch.zeros_like(x).scatter(  # rows 1.. written in reverse order from row 0 on
        1, torch.arange(x.shape[1] - 1, device=x.device).flip(0)[None, :, None].expand(3, -1, 4).contiguous(),
        x[:, 1:]).pow(2).mul(torch.arange(x.shape[1], device=x.device)[:, None]).sum(),
    "scatter_reduce": lambda x: x.scatter_reduce(1, torch.arange(x.shape[1] - 1, device=x.device).flip(0)[None, :, None]
                                                 .expand(3, -1, 4).contiguous(), x[:, 1:] * 2, "sum").pow(2).sum(),
    "index_copy_add": lambda x: (lambda i: torch.zeros_like(x).index_copy(1, i, x[:, 1:]).index_add(1, i, x[:, :-1])
                                 .pow(2).mul(torch.arange(x.shape[1], device=x.device)[:, None]).sum())(
        torch.arange(x.shape[1] - 1, device=x.device).flip(0)),
    "conv1d": lambda x: F.conv1d(F.conv1d(x.transpose(1, 2), torch.ones(5, 4, 3, device=x.device) / 12, padding=1),
                                 torch.ones(2, 5, 2, device=x.device) / 10, stride=2, dilation=2).tanh().sum(),
    "pools": lambda x: (F.max_pool2d(x[:, None], (2, 3), (1, 2), padding=(1, 1)).pow(2).sum()  # (max_pool1d: Dynamo specializes)
                        + F.avg_pool1d(x.transpose(1, 2), 3, 1, padding=1).pow(2).sum()),
    "shift_right": lambda x: _shift_right(x).pow(2).sum(),  # T5's decoder inputs: copy_ into a slice
    "moe_routing": lambda x: _routed(x).pow(2).sum(),  # grouped-mm MoE: rows by a permutation, its inverse
    "grouped_mm": lambda x: _grouped_experts(x).pow(2).sum(),
    "index_put": lambda x: torch.zeros_like(x).index_put(
        (torch.tensor([0, 2], device=x.device)[:, None], torch.arange(x.shape[1], device=x.device).flip(0) - x.shape[1]),
        x[:2] * 2, accumulate=True).pow(2).sum(),
    "into_a_static_cache": lambda x: torch.zeros(3, 32, 4, device=x.device).index_copy(  # StaticCache's write
        1, torch.arange(x.shape[1], device=x.device) + 2, x * 2).pow(2).mul(torch.arange(32.0, device=x.device)[:, None]).sum(),
}


@pytest.mark.parametrize("name", list(_ALONG_THE_LENGTH))
def test_reductions_and_scans_along_a_symbolic_length(name):
    """Each bucket is one forward and one backward program, with NaN in every padding, CPU's values
    and gradients (these ops were refused and compiled per length; a scan over a dimension bound past
    16 lost XLA's carry between blocks, and scatter wrote its padding's updates)."""
    fn = _ALONG_THE_LENGTH[name]
    f = torch.compile(fn, backend="tpu", dynamic=True)
    before = graphs()
    g = torch.Generator().manual_seed(0)
    for n in (5, 9, 20):
        x = torch.randn(3, n, 4, generator=g, requires_grad=True)
        xt = nan_padded(x.detach(), 3 * 32 * 4).requires_grad_()
        got, want = f(xt), fn(x)
        got.backward()
        want.backward()
        torch.testing.assert_close(got.detach().cpu(), want.detach(), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(xt.grad.cpu(), x.grad, atol=1e-4, rtol=1e-4)
    assert torch_tpu.metrics.bucket_refusals() == {}
    assert graphs() - before == 4  # buckets 16 and 32, forward and backward each


def test_an_int_input_of_symbolic_value_as_a_tensor_argument():
    """An int Dynamo makes symbolic (a position, a length) passed where an op takes a Tensor (x * n) or
    as arange's start: read from the sizes operand, not refused (batched generate()'s graphs take one)."""
    fn = lambda x, n: ((x * n).sum(1) + n + torch.full_like(x[:, 0], 0.5) * (n - 1)  # noqa: E731
                       + (x * torch.arange(n, n + x.shape[1], device=x.device)).sum(1))  # positions from an offset
    f = torch.compile(fn, backend="tpu", dynamic=True)
    before = graphs()
    torch.manual_seed(0)
    for k, n in ((5, 3), (9, 5), (12, 7), (7, 2)):
        x = torch.randn(2, k)
        torch.testing.assert_close(f(x.to(TPU), n).cpu(), fn(x, n), atol=1e-4, rtol=1e-4)
    assert graphs() - before == 1
    assert torch_tpu.metrics.bucket_refusals() == {}


@pytest.mark.slow
def test_batched_left_padded_generate_buckets():
    """generate() over batches of left-padded prompts of changing lengths with a compiled forward:
    CPU's tokens, no graph refused (the padding mask's indexing and an int position input were)."""
    transformers = pytest.importorskip("transformers")
    from models import zoo  # noqa: F401  (imports torchvision the way transformers can load it)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=128, n_embd=32, n_layer=1, n_head=4, n_positions=64)
    cpu = transformers.GPT2LMHeadModel(cfg).eval()
    tpu = copy.deepcopy(cpu).to(TPU)
    tpu.forward = torch.compile(tpu.forward, backend="tpu")
    g = torch.Generator().manual_seed(1)
    for k, lens in enumerate([(5, 3), (7, 4), (6, 2), (9, 8)]):
        if k == 2:
            before = graphs()
        n = max(lens)
        mask = torch.stack([(torch.arange(n) >= n - m).long() for m in lens])
        ids = torch.randint(1, 128, (2, n), generator=g) * mask
        kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
        want = cpu.generate(input_ids=ids, attention_mask=mask, **kw)
        assert torch.equal(tpu.generate(input_ids=ids.to(TPU), attention_mask=mask.to(TPU), **kw).cpu(), want)
    assert graphs() == before, "prompts and caches in seen buckets compiled a program"
    assert torch_tpu.metrics.bucket_refusals() == {}


_VIEW_WRITES = {  # a view write into a tensor with a symbolic dimension (the functional form of y[...] = v)
    "rows": lambda y: torch.slice_scatter(y.new_zeros(y.shape), y[:2] * 2, 0, 0, 2),
    "rows_backward": lambda y: y[:2],  # its backward is that slice_scatter
    "along_the_length": lambda y: torch.slice_scatter(y * 3, y[:, 1:] * 2, 1, 1),
    "stepped": lambda y: torch.slice_scatter(y * 3, y[:, :, ::2] * 2, 2, 0, None, 2),
    "select": lambda y: torch.select_scatter(y * 3, y[:, 1] * 2, 1, 3),
}


@pytest.mark.parametrize("name", list(_VIEW_WRITES))
def test_view_writes_into_a_tensor_of_symbolic_size(name):
    """slice_scatter flattens its base and writes at the bucket layout's offsets; with XLA's dynamic
    sizes still on the base, XLA's reshape had moved its elements: y[:2]'s gradient was wrong in rows
    past the first (silently). CPU's values and gradients, NaN in every padding."""
    fn = _VIEW_WRITES[name]
    f = torch.compile(lambda y: fn(y).pow(2).sum(), backend="tpu")
    torch.manual_seed(0)
    for n in (5, 6, 20):
        y = torch.randn(3, n, 4, requires_grad=True)
        yt = nan_padded(y.detach(), 3 * 32 * 4).requires_grad_()
        torch._dynamo.mark_dynamic(yt, 1)
        got, want = f(yt), fn(y).pow(2).sum()
        got.backward()
        want.backward()
        torch.testing.assert_close(got.detach().cpu(), want.detach(), atol=1e-4, rtol=1e-4)  # sums' order
        torch.testing.assert_close(yt.grad.cpu(), y.grad, atol=1e-4, rtol=1e-4)
    assert torch_tpu.metrics.bucket_refusals() == {}
