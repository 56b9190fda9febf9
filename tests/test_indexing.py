import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from helpers import check, to_tpu
from helpers import data as _data, grad as _grad

FLOATS = [torch.float32, torch.bfloat16]
ALL = FLOATS + [torch.int64, torch.bool]


@pytest.mark.parametrize("dtype", ALL)
def test_index_select(dtype):
    x = _grad(_data((4, 5), dtype))
    for dim in (0, 1, -1):
        check(lambda x: torch.index_select(x, dim, torch.tensor([3, 0, 0, 1]).to(x.device)), x)
    check(lambda x: x.t().index_select(0, torch.tensor([4, 2]).to(x.device)), x)  # non-contiguous
    check(lambda x: x.index_select(1, torch.tensor(2).to(x.device)), x)           # 0-dim index
    check(lambda x: x.index_select(0, torch.tensor([], dtype=torch.long).to(x.device)), x)
    check(lambda x: x.index_select(1, torch.tensor([1, 4], dtype=torch.int32).to(x.device)), x)


@pytest.mark.parametrize("dtype", ALL)
def test_gather(dtype):
    x = _grad(_data((3, 4), dtype))
    i0 = torch.tensor([[0, 2, 1, 0], [2, 2, 0, 1]])
    i1 = torch.tensor([[3, 0], [1, 1], [2, 3]])
    check(lambda x, i: torch.gather(x, 0, i), x, i0)
    check(lambda x, i: torch.gather(x, -1, i), x, i1)
    check(lambda x, i: torch.gather(x.t(), 1, i), x, torch.tensor([[0, 2], [1, 1]]))
    check(lambda x, i: torch.gather(x, 1, i.t()), x, torch.tensor([[3, 0, 1], [1, 2, 0]]))


@pytest.mark.parametrize("dtype", ALL)
def test_scatter(dtype):
    x = _grad(_data((3, 5), dtype))
    src = _grad(_data((2, 5), dtype))
    idx = torch.tensor([[0, 1, 2, 0, 1], [2, 0, 1, 1, 0]])  # no duplicate targets
    check(lambda x, s, i: torch.scatter(x, 0, i, s), x, src, idx)
    check(lambda x, i: torch.scatter(x, 0, i, 2.0 if dtype.is_floating_point else 1), x, idx)
    check(lambda x, s, i: torch.scatter(x, 1, i, s[:, :3]), x, src, torch.tensor([[4, 0, 2], [1, 3, 0]]))
    check(lambda x, s, i: torch.scatter(x, 1, i, s), x, src, torch.tensor([[4, 0, 2], [1, 3, 0]]), grad=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_scatter_add_and_reduce(dtype):
    x = _grad(_data((3, 4), dtype))
    src = _grad(_data((4, 4), dtype))
    idx = torch.tensor([[0, 1, 2, 0], [0, 0, 1, 1], [2, 2, 2, 2], [1, 0, 1, 0]])  # duplicates
    check(lambda x, s, i: torch.scatter_add(x, 0, i, s), x, src, idx)
    check(lambda x, s, i: torch.scatter(x, 0, i, s, reduce="add"), x, src, idx, grad=False)
    check(lambda x, s, i: torch.scatter(x, 0, i, s, reduce="multiply"), x, src, idx, grad=False)
    check(lambda x, i: torch.scatter(x, 0, i, 3, reduce="add"), x, idx, grad=False)
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            grad = reduce in ("sum", "mean")
            check(lambda x, s, i: torch.scatter_reduce(x, 0, i, s, reduce, include_self=include_self),
                  x, src, idx, grad=grad)


def test_scatter_reduce_mean_int_floor():
    x = torch.tensor([2, 2, 3])
    check(lambda x: x.scatter_reduce(0, torch.tensor([0, 1, 1]).to(x.device), torch.tensor([4, -5, -5]).to(x.device),
                                     "mean"), x)


def test_scatter_inplace():
    x = torch.zeros(3, 4)
    check(lambda x: x.clone().scatter_add_(1, torch.tensor([[0, 0, 3]]).to(x.device),
                                           torch.ones(1, 3).to(x.device)), x)


@pytest.mark.parametrize("dtype", FLOATS)
def test_embedding(dtype):
    w = torch.randn(6, 3, dtype=dtype).requires_grad_()
    idx = torch.tensor([[0, 5, 2], [2, 2, 1]])
    check(lambda w, i: F.embedding(i, w), w, idx)
    check(lambda w, i: F.embedding(i, w, padding_idx=2), w, idx)
    check(lambda w, i: F.embedding(i, w, padding_idx=-1, scale_grad_by_freq=True), w, idx)
    check(lambda w, i: F.embedding(i, w.t().contiguous().t()), w, idx)


@pytest.mark.parametrize("dtype", ALL)
def test_advanced_index(dtype):
    x = _grad(_data((4, 5, 6), dtype))
    i = torch.tensor([3, -1, 0])
    j = torch.tensor([[1], [-2]])
    check(lambda x, i: x[i], x, i)
    check(lambda x, i: x[:, i], x, i)
    check(lambda x, i, j: x[:, j, i], x, i, j)          # adjacent, broadcast
    check(lambda x, i, j: x[j, :, i], x, i, j)          # separated: result dims first
    check(lambda x, i: x[i, 1:3, i], x, i)
    check(lambda x, i: x.transpose(0, 2)[i], x, i)      # non-contiguous
    check(lambda x, i: x[..., i], x, i)
    check(lambda x: x[torch.tensor([], dtype=torch.long).to(x.device)], x)


@pytest.mark.parametrize("dtype", ALL)
def test_bool_mask_index(dtype):
    x = _grad(_data((4, 5), dtype))
    m = torch.randn(4, 5) > 0
    check(lambda x, m: x[m], x, m)
    check(lambda x, m: x[m[:, 0]], x, m)
    check(lambda x, m: x[:, m[0]], x, m)
    check(lambda x, m: torch.masked_select(x, m[0]), x, m, grad=False)


@pytest.mark.parametrize("dtype", ALL)
def test_index_put(dtype):
    x = _data((4, 5), dtype)
    v = _data((2, 5), dtype)
    i = torch.tensor([3, -4])
    check(lambda x, v, i: x.index_put((i,), v), x, v, i)
    check(lambda x, v, i: x.clone().index_put_((i, torch.tensor([1, 2]).to(x.device)), v[0, :2]), x, v, i)
    dup = torch.tensor([1, 1, 3, 1])
    if dtype != torch.bool:
        check(lambda x, v, d: x.index_put((d,), v[:1], accumulate=True), x, v, dup)
        check(lambda x, v, d: torch.ops.aten.index_put(x, [None, d], v[0, :1], True), x, v, dup)
    m = torch.randn(4, 5) > 0

    def masked(x, v, m):
        y = x.clone()
        y[m] = v[0, 0]
        return y
    check(masked, x, v, m)


def test_index_put_grad():
    x = torch.randn(4, 5, requires_grad=True)
    v = torch.randn(2, 5, requires_grad=True)
    i = torch.tensor([3, 0])
    check(lambda x, v, i: x.index_put((i,), v), x, v, i)
    check(lambda x, v, i: x.index_put((i,), v, accumulate=True), x, v, i)


@pytest.mark.parametrize("dtype", ALL)
def test_index_add_copy_fill(dtype):
    x = _data((4, 5), dtype)
    src = _data((4, 3), dtype)
    idx = torch.tensor([4, 0, 2])
    if dtype != torch.bool:
        check(lambda x, s, i: x.index_add(1, i, s), x, src, idx)
        check(lambda x, s, i: x.index_add(1, torch.tensor([1, 1, 1]).to(x.device), s, alpha=2), x, src, idx)
    check(lambda x, s, i: x.index_copy(1, i, s), x, src, idx)
    check(lambda x, i: x.index_fill(1, torch.tensor([-1, 0]).to(x.device), 1), x, idx)
    check(lambda x, i: x.t().index_fill(0, i, torch.tensor(0).to(x.dtype).to(x.device)), x, idx)


def test_index_add_grad():
    x = torch.randn(4, 5, requires_grad=True)
    s = torch.randn(4, 3, requires_grad=True)
    check(lambda x, s, i: x.index_add(1, i, s, alpha=0.5), x, s, torch.tensor([4, 0, 4]))


@pytest.mark.parametrize("dtype", ALL)
def test_masked_fill(dtype):
    x = _grad(_data((3, 4), dtype))
    m = torch.randn(4) > 0
    check(lambda x, m: x.masked_fill(m, 1), x, m)
    check(lambda x, m: x.t().masked_fill(m[:3], torch.tensor(0).to(x.dtype).to(x.device)), x, m)


@pytest.mark.parametrize("dtype", ALL)
def test_nonzero(dtype):
    x = _data((3, 4), dtype)
    check(torch.nonzero, x)
    check(lambda x: torch.nonzero(x, as_tuple=True), x)
    check(torch.nonzero, torch.zeros(3, dtype=dtype))
    check(torch.argwhere, x.t())
    check(lambda x: torch.nonzero_static(x, size=20, fill_value=-7), x)
    check(lambda x: torch.nonzero_static(x, size=2), x)


# -- errors: raised before execution, tensors unchanged ---------------------------------------------
def _unchanged(tensors, before):
    for t, b in zip(tensors, before):
        assert torch.equal(t.cpu(), b)


@pytest.mark.parametrize("case", [
    ("index_select neg", lambda x, i: x.index_select(0, i), [-1], IndexError, "index out of range"),
    ("index_select big", lambda x, i: x.index_select(1, i), [4], RuntimeError, "out of DATA bounds"),
    ("gather neg", lambda x, i: x.gather(1, i.view(1, 1)), [-1], RuntimeError, "index -1 is out of bounds"),
    ("gather big", lambda x, i: x.gather(0, i.view(1, 1)), [3], RuntimeError, "index 3 is out of bounds"),
    ("scatter_ neg", lambda x, i: x.scatter_(1, i.view(1, 1), 5.0), [-2], RuntimeError, "out of bounds"),
    ("scatter_add_ big", lambda x, i: x.scatter_add_(0, i.view(1, 1), x.clone()), [7], RuntimeError, "out of bounds"),
    ("scatter_reduce_", lambda x, i: x.scatter_reduce_(0, i.view(1, 1), x.clone(), "amax"), [3], RuntimeError, "bounds"),
    ("index big", lambda x, i: x[:, i], [4], IndexError, "index 4 is out of bounds"),
    ("index neg", lambda x, i: x[i], [-4], IndexError, "index -4 is out of bounds"),
    ("index_put_ big", lambda x, i: x.index_put_((i,), torch.tensor(1.0, device=x.device)), [3], IndexError,
     "out of bounds"),
    ("index_put_ acc", lambda x, i: x.index_put_((i,), torch.tensor(1.0, device=x.device), accumulate=True), [-9],
     IndexError, "out of bounds"),
    ("setitem", lambda x, i: x.__setitem__(i, 2.0), [5], IndexError, "out of bounds"),
    ("index_add_ neg", lambda x, i: x.index_add_(0, i, x[:1].clone()), [-1], RuntimeError, "out of bounds"),
    ("index_copy_ big", lambda x, i: x.index_copy_(0, i, x[:1].clone()), [3], IndexError, "index_copy_"),
    ("index_fill_ big", lambda x, i: x.index_fill_(1, i, 1.0), [4], IndexError, "out of bounds"),
    ("embedding", lambda x, i: F.embedding(i, x), [3], IndexError, "index out of range in self"),
    ("mask shape", lambda x, i: x[torch.ones(4, dtype=torch.bool, device=x.device)], [0], IndexError,
     "shape of the mask"),
], ids=lambda c: c[0])
def test_index_errors(case):
    _, fn, idx, exc, msg = case
    x = torch.randn(3, 4)
    i = torch.tensor(idx)
    with pytest.raises(exc, match=msg):
        fn(x.clone(), i)  # the CPU reference raises the same
    xt, it = to_tpu(x), to_tpu(i)
    before = torch_tpu.metrics.fallback_counts()
    with pytest.raises(exc, match=msg):
        fn(xt, it)
        torch.tpu.synchronize()  # where an index checked on the device raises (strict, fused)
    _unchanged([xt, it], [x, i])
    assert torch_tpu.metrics.fallback_counts() == before


def test_device_index_error_surfaces_at_the_next_sync_naming_the_op():
    x = torch.arange(12.0).reshape(3, 4).to("tpu")
    bad = torch.tensor([0, 7, 1], device="tpu")
    with torch_tpu.eager_mode("strict"):
        y = x.index_select(0, bad)           # no host sync here: the launch is asynchronous
        x.scatter_(1, bad.view(3, 1) - 5, 9.0)  # a written tensor: left unchanged
        z = x * 2                             # later ops run
        with pytest.raises(IndexError, match=r"index out of range in self[\s\S]*aten::index_select"):
            z.sum().item()
        torch.tpu.synchronize()               # reported once
    torch.testing.assert_close(x.cpu(), torch.arange(12.0).reshape(3, 4))
    assert y.shape == (3, 4)


def test_device_index_error_raises_at_the_op_in_debug_mode():
    x = torch.zeros(5, 3, device="tpu")
    with torch_tpu.eager_mode("debug"):
        with pytest.raises(IndexError, match="index out of range in self") as e:
            torch.nn.functional.embedding(torch.tensor([[1, 5]], device="tpu"), x)
        torch.tpu.synchronize()
    # CPU's message first, then the op, its inputs and the caller's line; no advice to use debug mode
    message = str(e.value)
    assert message.startswith("index out of range in self\n"), message
    assert "by the tpu op aten::embedding; the op wrote nothing" in message, message
    assert "(1, 2):torch.int64" in message and "test_indexing.py" in message, message
    assert "TORCH_TPU_EAGER_MODE=debug" not in message, message


@torch_tpu.eager_mode("strict")  # counts host syncs: debug mode waits after every op
def test_device_index_checks_do_not_sync():
    w = torch.randn(10, 4, device="tpu")
    i = torch.tensor([1, 2, 9], device="tpu")
    torch.tpu.synchronize()
    before = torch_tpu.metrics.counters()
    for _ in range(5):
        e = torch.nn.functional.embedding(i, w)
        g = w.gather(0, i.view(3, 1).expand(3, 4))
        s = w.index_select(0, i)
    after = torch_tpu.metrics.counters()
    assert after["host_syncs"] == before["host_syncs"] and after["d2h_transfers"] == before["d2h_transfers"]
    torch.testing.assert_close(e.cpu(), w.cpu()[i.cpu()])
    torch.testing.assert_close(g.cpu(), w.cpu().gather(0, i.cpu().view(3, 1).expand(3, 4)))
    torch.testing.assert_close(s.cpu(), w.cpu().index_select(0, i.cpu()))


@pytest.mark.parametrize("dtype", ALL)
def test_take_put_masked_scatter(dtype):
    x = _grad(_data((4, 5), dtype))
    src = _grad(_data((3, 7), dtype))
    i = torch.tensor([[0, 19], [-1, 7]])
    check(lambda x, i: torch.take(x, i), x, i)
    check(lambda x, i: torch.take(x.t(), i), x, i)
    check(lambda x, s, i: x.put(i.flatten()[:3], s[0, :3]), x, src, torch.tensor([3, -2, 11]))
    if dtype != torch.bool:
        check(lambda x, s, i: x.put(i, s[0, :3], accumulate=True), x, src, torch.tensor([3, 3, -17]))
    m = torch.randn(4, 5) > 0
    check(lambda x, m, s: x.masked_scatter(m, s), x, m, src)
    check(lambda x, m, s: x.masked_scatter(m[0], s), x, m, src)  # mask broadcasts
    check(lambda x, m, s: x.t().masked_scatter(m.t(), s), x, m, src)
    check(lambda x, m: torch.masked_select(x, m), x, m)  # backward is masked_scatter


def test_flat_index_errors():
    x = torch.randn(2, 3)
    xt = to_tpu(x)
    before = torch_tpu.metrics.fallback_counts()
    for fn, exc, msg in [(lambda x: x.take(torch.tensor([6], device=x.device)), IndexError, "index 6 on a tensor"),
                         (lambda x: x.put_(torch.tensor([-7], device=x.device), torch.ones(1, device=x.device)),
                          IndexError, "index -7"),
                         (lambda x: x.masked_scatter_(x != 5, torch.ones(5, device=x.device)), RuntimeError,
                          "Number of elements of source")]:
        with pytest.raises(exc, match=msg):
            fn(x.clone())
        with pytest.raises(exc, match=msg):
            fn(xt)
            torch.tpu.synchronize()  # take/put check on the device: raised at the next sync
    assert torch.equal(xt.cpu(), x)
    assert torch_tpu.metrics.fallback_counts() == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_index_reduce(dtype):
    x = _data((4, 3), dtype)
    src = _data((4, 5), dtype)
    idx = torch.tensor([2, 0, 2, 2, 1])
    for reduce in ("prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            check(lambda x, s, i: x.index_reduce(1, i, s, reduce, include_self=include_self), x, src, idx)
    xt = to_tpu(x)
    with pytest.raises(IndexError, match="index out of range"):
        xt.index_reduce_(1, to_tpu(torch.tensor([3, 0, 0, 0, 0])), to_tpu(src), "amax")
        torch.tpu.synchronize()  # checked on the device: raised at the next sync
    assert torch.equal(xt.cpu(), x)


# -- masked_fill_ / index_fill_ on an expanded self (CPU: deprecated, but it writes) -----------------
def _expanded_fill(dev, fill):
    import warnings
    x = torch.arange(3., device=dev)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fill(x.unsqueeze(0).expand(2, 3), dev)
    return x.cpu(), [str(m.message).split(" on ")[0] for m in w if "expanded" in str(m.message)]


@pytest.mark.parametrize("name,fill", [
    # rows select different columns: an address is written when any of its aliases is selected
    ("masked_fill_", lambda e, d: e.masked_fill_(torch.tensor([[True, False, False], [False, False, True]],
                                                               device=d), 5.)),
    ("masked_fill_", lambda e, d: e.masked_fill_(torch.tensor([False, True, False], device=d),
                                                 torch.tensor(-0.0, device=d))),
    ("index_fill_", lambda e, d: e.index_fill_(1, torch.tensor([2, 0], device=d), 7.)),
    ("index_fill_", lambda e, d: e.index_fill_(0, torch.tensor([1], device=d), 7.)),  # the expanded dim
    ("index_fill_", lambda e, d: e.index_fill_(0, torch.tensor([], dtype=torch.long, device=d), 7.)),
])
def test_fill_of_an_expanded_view_writes_as_cpu_does_with_its_warning(name, fill):
    want, want_warn = _expanded_fill("cpu", fill)
    got, got_warn = _expanded_fill("tpu", fill)
    assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit()), (got, want)
    assert got_warn == want_warn == [f"Use of {name}"]


@pytest.mark.parametrize("fill,error", [
    (lambda e, d: e.index_fill_(0, torch.tensor([2], device=d), 7.), IndexError),
    (lambda e, d: e.masked_fill_(torch.tensor([1, 0, 1], dtype=torch.uint8, device=d), 5.), RuntimeError),
    (lambda e, d: e.add_(1), RuntimeError),  # other in-place ops refuse an expanded self, as on CPU
])
def test_expanded_fill_errors_are_cpus_and_write_nothing(fill, error):
    msgs = []
    for dev in ("cpu", "tpu"):
        x = torch.arange(3., device=dev)
        with pytest.raises(error) as e:
            fill(x.unsqueeze(0).expand(2, 3), dev)
        msgs.append(str(e.value).split(" (Triggered")[0])
        assert torch.equal(x.cpu(), torch.arange(3.))
    assert msgs[0] == msgs[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
def test_assigning_one_value_through_a_mask_is_one_program_and_no_sync(dtype):
    """`x[mask] = v` (the commonest masked write: PyTorch's tests fill NaN and inf so) is a select by the
    mask: CPU's values, one program whatever the mask holds (it was a nonzero, a host sync and two
    programs per count of True), masks from the host or the device, after full slices, accumulate."""
    g = torch.Generator().manual_seed(0)
    ref = (torch.randn(6, 5, generator=g) * 4).to(dtype)
    x = ref.to("tpu")
    masks = [torch.randn(6, 5, generator=g) > k / 4 for k in range(5)]
    values = [True, False, True, False, True] if dtype == torch.bool else [1, -0.0, 3, 4, 5]
    if dtype.is_floating_point:
        values[3] = float("nan")
    torch_tpu.metrics.reset()
    syncs = torch_tpu.metrics.counters()["host_syncs"]
    for k, (m, v) in enumerate(zip(masks, values)):
        ref[m] = v
        x[m.to("tpu") if k % 2 else m] = v
    programs = torch_tpu.metrics.program_causes().get("aten::index_put_", {})
    assert sum(programs.values()) <= 1, programs
    assert "aten::nonzero_static.out" not in torch_tpu.metrics.program_causes()
    if torch_tpu.get_eager_mode() != "debug":  # debug eager waits for every op by design
        assert torch_tpu.metrics.counters()["host_syncs"] == syncs
    cols = torch.tensor([True, False, True, False, True])
    ref[:, cols] = values[0]
    x[:, cols.to("tpu")] = values[0]
    if dtype != torch.bool:
        acc = torch.randn(6, 5, generator=g) > 0
        ref.index_put_((acc,), torch.tensor(2, dtype=dtype), accumulate=True)
        x.index_put_((acc.to("tpu"),), torch.tensor(2, dtype=dtype, device="tpu"), accumulate=True)
    torch.testing.assert_close(x.cpu(), ref, equal_nan=True, rtol=0, atol=0)
    if dtype.is_floating_point:  # -0.0 kept where it was written, and where nothing was added
        assert torch.equal(torch.signbit(x.cpu()), torch.signbit(ref))


@pytest.mark.parametrize("norm_type", [1.0, 2.0, float("inf")])
def test_embedding_max_norm_renormalizes_rows_on_tpu(norm_type):
    """nn.Embedding(max_norm=...) renormalizes the looked-up rows in place before each lookup
    (embedding_renorm_, on tpu: no CPU fallback); a row named twice is scaled once; CPU's errors."""
    import copy
    import torch_tpu
    torch.manual_seed(0)
    cpu = torch.nn.Embedding(10, 5, max_norm=1.0, norm_type=norm_type)
    tpu = copy.deepcopy(cpu).to("tpu")
    torch_tpu.metrics.reset()
    for ids in (torch.tensor([[1, 2, 2, 7], [7, 0, 3, 1]]), torch.tensor([9, 9, 4]), torch.tensor([], dtype=torch.long)):
        torch.testing.assert_close(tpu(ids.to("tpu")).cpu(), cpu(ids))
        torch.testing.assert_close(tpu.weight.detach().cpu(), cpu.weight.detach())
    assert torch_tpu.metrics.fallback_counts() == {}
    for w, i in ((torch.randn(5), torch.tensor([1])), (torch.randn(5, 3), torch.tensor([1.0]))):
        with pytest.raises(RuntimeError) as on_cpu:
            torch.embedding_renorm_(w, i, 1.0, 2.0)
        with pytest.raises(RuntimeError) as on_tpu:
            torch.embedding_renorm_(w.to("tpu"), i.to("tpu"), 1.0, 2.0)
        assert str(on_tpu.value) == str(on_cpu.value)
