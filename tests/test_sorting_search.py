"""Order statistics (median, nanmedian, kthvalue, mode), searches (searchsorted, bucketize),
histograms, unique, distances, margin-loss backward and the extra random distributions on tpu,
compared with CPU (values, CPU's choice of index among ties, gradients) without the CPU fallback."""
import math

import pytest
import torch

import torch_tpu

from helpers import TPU, check


def _ties(shape, dtype, nan=True, seed=0):
    """Small integers (many ties), with some NaN for float dtypes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, shape, generator=g).to(dtype)
    if nan and dtype.is_floating_point:
        x[torch.rand(shape, generator=g) < 0.2] = float("nan")
        if len(shape) == 2:
            x[-1] = float("nan")  # a row of NaN only
    return x


_ORDER_FNS = [
    lambda x: torch.median(x), lambda x: torch.nanmedian(x),
    lambda x: torch.median(x, 1), lambda x: torch.nanmedian(x, -1, keepdim=True),
    lambda x: torch.kthvalue(x, 3, 1), lambda x: torch.kthvalue(x.t(), 4, 0),  # non-contiguous
]


@pytest.mark.parametrize("dtype,n", [(torch.float32, 7), (torch.float32, 20), (torch.int64, 6)])
@pytest.mark.parametrize("fn", _ORDER_FNS)
def test_order_statistics_ties_and_nan(fn, dtype, n):
    check(fn, _ties((5, n), dtype))


def test_kthvalue_quickselect_long_rows():
    """Rows long enough for several partition passes."""
    x = _ties((3, 41), torch.float32, nan=False, seed=3)
    for k in (2, 21):
        check(lambda t: torch.kthvalue(t, k, 1), x)


@pytest.mark.parametrize("fn", [lambda x: torch.median(x, 1), lambda x: torch.nanmedian(x, 0),
                                lambda x: torch.kthvalue(x, 2, 1), lambda x: torch.median(x)])
def test_order_statistics_grad(fn):
    check(fn, torch.randn(4, 6).requires_grad_())


def test_order_statistics_0dim_and_empty():
    x = torch.tensor(2.5)
    for fn in (torch.median, lambda t: torch.median(t, 0), lambda t: torch.kthvalue(t, 1, 0),
               lambda t: torch.mode(t, 0), lambda t: torch.nanmedian(t, 0)):
        check(fn, x)
    e = torch.empty(0, 3)
    check(lambda t: torch.median(t, 0), e.t())
    check(lambda t: torch.mode(t, 1), e)


def test_order_statistics_errors():
    x = torch.randn(2, 3)
    with pytest.raises(RuntimeError, match="selected number k out of range"):
        torch.kthvalue(x.to(TPU), 4, 1)
    for f in (torch.median, torch.nanmedian, torch.mode, lambda t, d: torch.kthvalue(t, 1, d)):
        with pytest.raises(IndexError, match="Expected reduction dim 1 to have non-zero size"):
            f(torch.empty(2, 0).to(TPU), 1)
    for f in (torch.median, torch.nanmedian):
        check(f, torch.empty(0))
        check(f, torch.empty(0, dtype=torch.int64))
    check(lambda t: torch.kthvalue(t, 2, 1), torch.empty(0, 3))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bool])
def test_mode(dtype):
    x = _ties((6, 6), dtype) if dtype != torch.bool else torch.rand(6, 6) > 0.5
    check(lambda t: torch.mode(t, 1), x)
    check(lambda t: torch.mode(t.t(), 0, keepdim=True), x)
    # rows longer than 16: the value (CPU's index among ties there follows std::sort's partitions)
    y = _ties((3, 30), dtype, nan=False) if dtype != torch.bool else torch.rand(3, 30) > 0.5
    check(lambda t: torch.mode(t, 1).values, y)


def test_mode_grad():
    check(lambda t: torch.mode(t, 1).values, torch.tensor([[1., 2, 2, 3], [4, 4, 5, 5]]).requires_grad_())


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_searchsorted_bucketize(dtype, right):
    g = torch.Generator().manual_seed(1)
    ss = torch.randint(-5, 5, (9,), generator=g).sort().values.to(dtype)
    v = torch.randint(-6, 6, (3, 4), generator=g).to(dtype)
    check(lambda s, t: torch.searchsorted(s, t, right=right), ss, v)
    check(lambda s, t: torch.searchsorted(s, t, side="right" if right else "left", out_int32=True), ss, v)
    check(lambda t, s: torch.bucketize(t, s, right=right), v, ss)
    check(lambda s: torch.searchsorted(s, 2.5, right=right), ss)
    check(lambda s: torch.bucketize(1, s, right=right), ss)


def test_searchsorted_nd_sorter_nan_and_promotion():
    g = torch.Generator().manual_seed(2)
    ss = torch.randn(3, 6, generator=g).sort().values
    check(torch.searchsorted, ss, torch.randn(3, 4, generator=g))
    uns = torch.randn(3, 6, generator=g)
    check(lambda s, t, o: torch.searchsorted(s, t, sorter=o), uns, torch.randn(3, 4, generator=g), uns.argsort(1))
    nan = torch.tensor([-1.0, 0.5, 2.0, float("nan")])
    check(torch.searchsorted, nan, torch.tensor([float("nan"), 0.0, 1.0, 3.0]))
    check(lambda s, t: torch.searchsorted(s, t, right=True), torch.tensor([0.1, 0.2]), torch.tensor([0.1],
                                                                                                  dtype=torch.float64))
    check(torch.searchsorted, torch.empty(0), torch.randn(3))
    with pytest.raises(RuntimeError, match="side can only be"):
        torch.searchsorted(ss.to(TPU), ss.to(TPU), side="middle")


_ISIN_CASES = [
    (torch.tensor([1, 2, 3]), torch.tensor([2.0, 5])), (torch.tensor([1, 2, 3]), torch.tensor([2.5])),
    (torch.tensor([math.nan, 1.0, 2, math.inf]), torch.tensor([math.nan, 2.0, math.inf])),
    (torch.arange(12).reshape(3, 4).t(), torch.tensor([[3], [1]])), (torch.tensor(3), torch.tensor([3])),
    (torch.empty(0), torch.empty(0)), (torch.ones(3), torch.empty(0)),
    (torch.tensor([1.0, 2], dtype=torch.half), torch.tensor([1.0], dtype=torch.bfloat16)),
    (torch.tensor([1, 2]), 2), (torch.tensor([1, 2]), 2.5), (2, torch.tensor([1, 2])),
]


@pytest.mark.parametrize("search", [False, True], ids=["pairs", "sorted-search"])
@pytest.mark.parametrize("invert", [False, True])
def test_isin(search, invert, monkeypatch):
    # Transformers' stopping criteria and logits processors call isin every decode token: one program,
    # no decomposition; past _ISIN_PAIRS pairs it searches the sorted test elements (same result).
    from torch_tpu.lowering import sorting
    if search:
        monkeypatch.setattr(sorting, "_ISIN_PAIRS", 0)
    for elements, test in _ISIN_CASES:
        if search and isinstance(elements, torch.Tensor):  # shapes of their own: programs built anew
            elements = torch.cat([elements.flatten(), torch.full((5,), 7, dtype=elements.dtype)])
        check(lambda e, t: torch.isin(e, t, invert=invert), elements, test, grad=False)
    for elements, test in ((torch.tensor([True]), torch.tensor([1])), (torch.tensor([1]), torch.tensor([1j])),
                           (torch.tensor([1]), True)):
        want = "Unsupported input type encountered for isin\\(\\): " + ("Bool" if elements.dtype == torch.bool or
                                                                          test is True else "ComplexFloat")
        with pytest.raises(RuntimeError, match=want):
            torch.isin(elements.to(TPU), test.to(TPU) if isinstance(test, torch.Tensor) else test)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_histc(dtype):
    x = torch.randn(60, generator=torch.Generator().manual_seed(4)).to(dtype)
    check(lambda t: torch.histc(t, 7), x)
    check(lambda t: torch.histc(t, 5, -1, 1), x)
    check(lambda t: torch.histc(t, 4, 2, 2), torch.tensor([1.0, 2, 3, float("nan")]).to(dtype)[:3])
    check(lambda t: torch.histc(t, 4, 0, 4), torch.tensor([0.0, 1, 4, 5, float("nan")]).to(dtype))


def test_histc_errors():
    with pytest.raises(NotImplementedError):
        torch.histc(torch.tensor([True, False]).to(TPU), 3)
    with pytest.raises(RuntimeError, match="not finite"):
        torch.histc(torch.tensor([1.0, math.inf]).to(TPU), 3)
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(torch.tensor([1.0]).to(TPU), 3, 2, 1)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_histc_of_integers_counts_as_cuda(dtype):
    """CPU raises for integer histc; CUDA (and transformers' MoE routing on accelerators) counts:
    edges truncated to the dtype, bin = (e - min) * bins // (max - min) in int64, the max edge
    into the last bin, values outside dropped, the result in the input dtype."""
    x = torch.tensor([0, 1, 2, 3, 3, 1, 7, 9, 5], dtype=dtype)
    got = torch.histc(x.to(TPU), bins=4, min=0.7, max=3.9)  # edges 0 and 3
    assert got.dtype == dtype
    assert got.cpu().tolist() == [1, 2, 1, 2]
    # min == max: the data's extrema, 0 and 9: bins (e * 3) // 9
    assert torch.histc(x.to(TPU), bins=3).cpu().tolist() == [4, 3, 2]
    # integer data with integer edges: the same counts as the float histogram
    y = torch.randint(0, 8, (200,), dtype=dtype)
    want = torch.histc(y.float(), bins=8, min=0, max=7).to(dtype)
    assert torch.equal(torch.histc(y.to(TPU), bins=8, min=0, max=7).cpu(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_histogram(dtype):
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(40, generator=g).to(dtype), torch.rand(40, generator=g).to(dtype)
    check(lambda t: torch.histogram(t, 6), x)
    check(lambda t, u: torch.histogram(t, 5, range=(-1.0, 1.0), weight=u, density=True), x, w)
    check(lambda t, e: torch.histogram(t, e, density=True), x, torch.tensor([-1, 0, 0.5, 2.0], dtype=dtype))
    check(lambda t: torch.histogram(t, 4), torch.full((3,), 2.0, dtype=dtype))
    check(lambda t: torch.histogram(t, 3), torch.empty(0, dtype=dtype))


def test_bincount_equal_triangle_indices():
    g = torch.Generator().manual_seed(6)
    i = torch.randint(0, 6, (25,), generator=g)
    check(torch.bincount, i)
    check(lambda t, w: torch.bincount(t, w, minlength=9), i, torch.randn(25, generator=g))
    check(lambda t, w: torch.bincount(t, w), i, torch.randint(0, 3, (25,), generator=g))
    check(lambda t: torch.bincount(t, minlength=3), i[:0])
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.bincount(torch.tensor([1, -1]).to(TPU))
    a = torch.randn(3, 4)
    for other, want in ((a.clone(), True), (a + 1, False), (a[:2], False), (a.double(), True)):
        assert torch.equal(a.to(TPU), other.to(TPU)) is want
    nan = torch.tensor([math.nan]).to(TPU)
    assert torch.equal(nan, nan) is False
    for r, c, o in ((4, 3, 1), (3, 5, -1), (0, 3, 0)):
        for f in (torch.triu_indices, torch.tril_indices):
            want = f(r, c, o, dtype=torch.int32)
            got = f(r, c, o, dtype=torch.int32, device=TPU)
            assert got.device.type == "tpu"
            torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64, torch.bfloat16])
def test_logcumsumexp(dtype):
    x = torch.randn(4, 6, dtype=dtype)
    x[1, 2] = -math.inf
    x[2, :3] = -math.inf
    check(lambda t: torch.logcumsumexp(t, 1), x)
    check(lambda t: torch.logcumsumexp(t, 0), x)
    if dtype in (torch.float32, torch.float64):
        check(lambda t: torch.logcumsumexp(t, 1), (torch.randn(3, 5, dtype=dtype) * 4).requires_grad_())


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_addbmm(dtype):
    g = torch.Generator().manual_seed(7)
    s, b1, b2 = (torch.randn(sh, generator=g).mul(3).to(dtype) for sh in ((3, 5), (4, 3, 2), (4, 2, 5)))
    if dtype.is_floating_point:
        s, b1, b2 = s.requires_grad_(), b1.requires_grad_(), b2.requires_grad_()
    check(lambda a, x, y: torch.addbmm(a, x, y, beta=2, alpha=3), s, b1, b2)
    check(torch.addbmm, s, b1, b2)
    check(lambda a, x, y: torch.addbmm(a, x, y, beta=0), torch.full((3, 5), math.nan).to(dtype) if
          dtype.is_floating_point else s, b1, b2)


def test_hash_tensor():
    for x in (torch.tensor([1.5, 2.0, -3.0]), torch.tensor([[-1, 2], [7, 7]], dtype=torch.int32),
              torch.tensor([True, False, True]), torch.randn(3, 4).half()):
        check(torch.hash_tensor, x)
        check(lambda t: torch.hash_tensor(t, [0], keepdim=True), x)


_UNIQUE = [torch.tensor([3.0, 1, math.nan, 2, 1, math.nan]), torch.randint(0, 4, (3, 5)),
           torch.tensor([True, False, True]), torch.empty(0), torch.tensor(5)]


@pytest.mark.parametrize("x", _UNIQUE)
def test_unique(x):
    for ri in (False, True):
        for rc in (False, True):
            check(lambda t: torch.unique(t, return_inverse=ri, return_counts=rc), x)
            check(lambda t: torch.unique_consecutive(t, return_inverse=ri, return_counts=rc), x)
    if x.dim() == 2:
        check(lambda t: torch.unique_consecutive(t, dim=1), x)


@pytest.mark.parametrize("p", [0.0, 0.5, 2.0, 3.0, math.inf])
def test_cdist_pdist(p):
    g = torch.Generator().manual_seed(8)
    x1 = torch.randn(2, 4, 3, generator=g).requires_grad_()
    x2 = torch.randn(5, 3, generator=g).requires_grad_()
    check(lambda a, c: torch.cdist(a, c, p=p), x1, x2)
    x = torch.randn(5, 3, generator=g)
    x[3] = x[1]  # a zero distance
    check(lambda a: torch.pdist(a, p=p), x.requires_grad_())


def test_cdist_matrix_product_form():
    g = torch.Generator().manual_seed(9)
    x1, x2 = torch.randn(30, 4, generator=g).requires_grad_(), torch.randn(7, 4, generator=g).requires_grad_()
    check(torch.cdist, x1, x2)
    check(lambda a, c: torch.cdist(a, c, compute_mode="use_mm_for_euclid_dist"), x1, x2)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_margin_losses_backward(reduction):
    g = torch.Generator().manual_seed(10)
    x = torch.randn(4, 5, generator=g).requires_grad_()
    y = torch.tensor([0, 3, 4, 1])
    w = torch.rand(5, generator=g)
    f = torch.nn.functional
    check(lambda a, c: f.multi_margin_loss(a, c, reduction=reduction), x, y)
    check(lambda a, c, v: f.multi_margin_loss(a, c, p=2, margin=0.7, weight=v, reduction=reduction), x, y, w)
    t = torch.tensor([[3, 0, -1, 1, 2], [1, 2, 3, -1, 4], [0, 0, -1, 2, 2], [4, 3, 2, 1, 0]])
    check(lambda a, c: f.multilabel_margin_loss(a, c, reduction=reduction), x, t)
    check(lambda a, c: f.multilabel_margin_loss(a, c, reduction=reduction), x[0].detach().requires_grad_(), t[0])


def _draw(fn, dtype=torch.float32, n=100000):
    return fn(torch.empty(n, dtype=dtype, device=TPU)).cpu().double()


def test_random_distributions():
    torch.manual_seed(0)
    for dt in (torch.float32, torch.int64, torch.float16):
        x = _draw(lambda t: t.geometric_(0.3), dt)
        assert x.min() >= 1 and abs(x.mean() - 1 / 0.3) < 0.05 and abs(x.var() - 0.7 / 0.09) < 0.3
    x = _draw(lambda t: t.cauchy_(1.0, 2.0))
    assert abs(x.median() - 1) < 0.05 and abs(((x - 1).abs() < 2).double().mean() - 0.5) < 0.01
    x = _draw(lambda t: t.log_normal_(0.5, 0.4), torch.float64)
    assert x.min() > 0 and abs(x.log().mean() - 0.5) < 0.01 and abs(x.log().std() - 0.4) < 0.01
    torch.manual_seed(3)
    a = torch.empty(6, device=TPU).cauchy_().cpu()
    torch.manual_seed(3)
    assert torch.equal(a, torch.empty(6, device=TPU).cauchy_().cpu())
    with pytest.raises(RuntimeError, match="geometric_ expects p to be in"):
        torch.empty(3, device=TPU).geometric_(1.5)
    with pytest.raises(RuntimeError, match="cauchy_ expects sigma > 0.0"):
        torch.empty(3, device=TPU).cauchy_(0.0, -1.0)


def test_multinomial():
    torch.manual_seed(1)
    p = torch.tensor([[0.1, 0.0, 0.6, 0.3], [1.0, 1.0, 1.0, 1.0]]).to(TPU)
    s = torch.multinomial(p, 40000, replacement=True).cpu()
    assert s.dtype == torch.int64 and s.shape == (2, 40000)
    for row, want in zip(s, ([0.1, 0.0, 0.6, 0.3], [0.25] * 4)):
        freq = torch.bincount(row, minlength=4).double() / 40000
        torch.testing.assert_close(freq, torch.tensor(want, dtype=torch.float64), atol=0.01, rtol=0)
    first = torch.stack([torch.multinomial(p[0], 1) for _ in range(400)]).cpu().reshape(-1)
    assert (first != 1).all() and abs((first == 2).double().mean() - 0.6) < 0.08
    s = torch.multinomial(p, 3).cpu()  # without replacement: distinct, never a zero-probability class
    assert all(len(set(r.tolist())) == 3 for r in s) and (s[0] != 1).all()
    torch.manual_seed(4)
    a = torch.multinomial(p, 2).cpu()
    torch.manual_seed(4)
    assert torch.equal(a, torch.multinomial(p, 2).cpu())
    with pytest.raises(RuntimeError, match="without replacement"):
        torch.multinomial(p, 5)
    s = torch.multinomial(p[0], 4).cpu()  # the zero-probability class comes last
    assert s[3] == 1 and sorted(s.tolist()) == [0, 1, 2, 3]
    with pytest.raises(RuntimeError, match="element < 0"):
        torch.multinomial(-p, 1)


@pytest.mark.parametrize("inplace", [False, True])
def test_rrelu(inplace):
    torch.manual_seed(2)
    x = torch.randn(2000, device=TPU, requires_grad=True)
    before = torch_tpu.metrics.fallback_counts()
    y = torch.nn.functional.rrelu(x * 1 if inplace else x, 0.1, 0.3, training=True, inplace=inplace)
    y.sum().backward()
    assert torch_tpu.metrics.fallback_counts() == before  # nn.RReLU(inplace=True) ran on the CPU fallback
    slope = (y.detach() / x.detach()).cpu()
    neg = (x.detach() < 0).cpu()
    assert slope[neg].min() >= 0.1 and slope[neg].max() <= 0.3 and (slope[~neg] == 1).all()
    assert abs(slope[neg].mean() - 0.2) < 0.01
    torch.testing.assert_close(x.grad.cpu(), slope)
    check(lambda t: torch.nn.functional.rrelu(t * 1, 0.1, 0.3, training=False, inplace=inplace),
          torch.randn(10).requires_grad_())
