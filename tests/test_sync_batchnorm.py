"""nn.SyncBatchNorm's ops on tpu (batch_norm_stats, batch_norm_gather_stats_with_counts,
batch_norm_elemt, batch_norm_backward_reduce, batch_norm_backward_elemt). PyTorch runs them on CUDA
only, so each is checked against a float64 reference written from CUDA's definitions
(aten/src/ATen/native/cuda/Normalization.cuh); then SyncBatchNorm itself, in one process with a
1-rank tpu_dist group, against nn.BatchNorm on CPU (the multi-process run is
tests/distributed/test_sync_batchnorm.py)."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch_tpu  # noqa: F401

from helpers import TPU

DTYPES = [torch.float32, torch.bfloat16]
SHAPES = [(8, 3), (4, 3, 7), (2, 3, 5, 4)]
EPS = 1e-5


def _layouts():
    """(shape, channels_last) cases: every shape row-major, and a channels-last 4-D input."""
    return [(s, False) for s in SHAPES] + [((2, 3, 5, 4), True)]


def _x(shape, dtype, channels_last=False):
    x = (torch.randn(shape) * 2 + 1).to(dtype)
    return x.to(memory_format=torch.channels_last) if channels_last else x


def _dims(x):
    return [0] + list(range(2, x.dim()))


def _chan(v, x):
    """A per-channel vector shaped to broadcast against x."""
    return v.reshape([1, -1] + [1] * (x.dim() - 2))


def _close(got, want, dtype=None):
    """tpu result vs float64 reference; the tolerance is that of the result's dtype."""
    dtype = dtype or got.dtype
    tol = dict(atol=2e-2, rtol=1e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(got.detach().cpu().double(), want.double(), **tol)


def _ref_stats(x, eps):
    xd = x.double()
    var = xd.var(_dims(x), unbiased=False)
    return xd.mean(_dims(x)), 1 / torch.sqrt(var + eps)


# -- each op ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,cl", _layouts())
def test_batch_norm_stats(shape, cl, dtype, no_fallback):
    x = _x(shape, dtype, cl)
    mean, invstd = torch.batch_norm_stats(x.to(TPU), EPS)
    assert mean.dtype == invstd.dtype == torch.float32  # CUDA's accumulate type
    want_mean, want_invstd = _ref_stats(x, EPS)
    _close(mean, want_mean)
    _close(invstd, want_invstd)


def test_batch_norm_stats_zero_variance_and_eps():
    """CUDA's InvStd: 0, not inf, for a constant channel when eps is 0."""
    x = torch.randn(4, 2, 3)
    x[:, 1] = 2.5
    _, invstd = torch.batch_norm_stats(x.to(TPU), 0.0)
    assert invstd[1].item() == 0.0
    _close(invstd[:1], _ref_stats(x, 0.0)[1][:1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_norm_gather_stats_with_counts(dtype, no_fallback):
    """Per-rank stats of uneven shares of one batch (and an empty rank's zero row) combine into the
    whole batch's mean and invstd; the running stats move toward its mean and unbiased variance."""
    c, momentum = 3, 0.3
    whole = _x((11, c, 4), dtype)
    shares = [whole[:2], whole[2:9], whole[9:]]
    stats = [_ref_stats(s, EPS) for s in shares]
    mean = torch.stack([m for m, _ in stats] + [torch.zeros(c)]).float()
    invstd = torch.stack([s for _, s in stats] + [torch.zeros(c)]).float()
    counts = torch.tensor([s.numel() // c for s in shares] + [0], dtype=dtype)  # as SyncBatchNorm passes them
    rm, rv = torch.randn(c).to(dtype), (torch.rand(c) + 0.5).to(dtype)
    rm_t, rv_t = rm.to(TPU), rv.to(TPU)
    g_mean, g_invstd = torch.batch_norm_gather_stats_with_counts(
        whole.to(TPU), mean.to(TPU), invstd.to(TPU), rm_t, rv_t, momentum, EPS, counts.to(TPU))
    assert g_mean.dtype == g_invstd.dtype == torch.float32
    want_mean, want_invstd = _ref_stats(whole, EPS)
    _close(g_mean, want_mean, torch.float32)
    _close(g_invstd, want_invstd, torch.float32)
    unbiased = whole.double().var(_dims(whole), unbiased=True)
    assert rm_t.dtype == dtype and rv_t.dtype == dtype
    _close(rm_t, (1 - momentum) * rm.double() + momentum * want_mean)
    _close(rv_t, (1 - momentum) * rv.double() + momentum * unbiased)
    # without running statistics
    g_mean2, g_invstd2 = torch.batch_norm_gather_stats_with_counts(
        whole.to(TPU), mean.to(TPU), invstd.to(TPU), None, None, momentum, EPS, counts.to(TPU))
    torch.testing.assert_close(g_mean2.cpu(), g_mean.cpu())
    torch.testing.assert_close(g_invstd2.cpu(), g_invstd.cpu())


def test_batch_norm_gather_stats_one_count(no_fallback):
    """The int-count variant: every rank has `count` values per channel."""
    c = 3
    whole = _x((6, c, 5), torch.float32)
    stats = [_ref_stats(s, EPS) for s in whole.chunk(3)]
    mean = torch.stack([m for m, _ in stats]).float().to(TPU)
    invstd = torch.stack([s for _, s in stats]).float().to(TPU)
    rm, rv = torch.zeros(c, device=TPU), torch.ones(c, device=TPU)
    g_mean, g_invstd = torch.batch_norm_gather_stats(whole.to(TPU), mean, invstd, rm, rv, 0.1, EPS, 10)
    want_mean, want_invstd = _ref_stats(whole, EPS)
    _close(g_mean, want_mean)
    _close(g_invstd, want_invstd)
    _close(rv, 0.9 + 0.1 * whole.double().var(_dims(whole), unbiased=True))


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,cl", _layouts())
def test_batch_norm_elemt(shape, cl, dtype, affine, no_fallback):
    x = _x(shape, dtype, cl)
    c = shape[1]
    mean, invstd = torch.randn(c), torch.rand(c) + 0.5
    w, b = (torch.randn(c).to(dtype), torch.randn(c).to(dtype)) if affine else (None, None)
    y = torch.batch_norm_elemt(x.to(TPU), None if w is None else w.to(TPU), None if b is None else b.to(TPU),
                               mean.to(TPU), invstd.to(TPU), EPS)
    want = (x.double() - _chan(mean.double(), x)) * _chan(invstd.double(), x)
    if affine:
        want = want * _chan(w.double(), x) + _chan(b.double(), x)
    assert y.dtype == dtype
    assert y.stride() == x.stride()  # CUDA: empty_like(input), channels-last kept
    _close(y, want)


def _ref_backward_reduce(g, x, mean, invstd):
    gd, xd = g.double(), x.double()
    sum_dy = gd.sum(_dims(x))
    sum_dy_xmu = (gd * (xd - _chan(mean.double(), x))).sum(_dims(x))
    return sum_dy, sum_dy_xmu, sum_dy_xmu * invstd.double(), sum_dy


@pytest.mark.parametrize("flags", [(True, True, True), (True, False, False), (False, True, False),
                                   (False, False, True), (False, False, False)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,cl", _layouts())
def test_batch_norm_backward_reduce(shape, cl, dtype, flags, no_fallback):
    x, g = _x(shape, dtype, cl), _x(shape, dtype, cl)
    c = shape[1]
    mean, invstd = torch.randn(c), torch.rand(c) + 0.5
    w = torch.randn(c).to(dtype)
    got = torch.batch_norm_backward_reduce(g.to(TPU), x.to(TPU), mean.to(TPU), invstd.to(TPU), w.to(TPU), *flags)
    want = _ref_backward_reduce(g, x, mean, invstd)
    on = (flags[0], flags[0], flags[1], flags[2])
    dtypes = (torch.float32, torch.float32, dtype, dtype)  # mean's dtype; weight's dtype
    for r, ref, wanted, dt in zip(got, want, on, dtypes):
        if not wanted:
            assert r is None  # undefined, as CUDA leaves it
            continue
        assert r.dtype == dt and r.shape == (c,)
        _close(r, ref)  # accumulated in float32; a bf16 result rounds once
    # mixed precision: a float32 weight with a bf16 input gives float32 parameter gradients
    if dtype == torch.bfloat16 and flags[1]:
        got = torch.batch_norm_backward_reduce(g.to(TPU), x.to(TPU), mean.to(TPU), invstd.to(TPU),
                                               w.float().to(TPU), *flags)
        assert got[2].dtype == torch.float32
        _close(got[2], want[2], torch.float32)


def _ref_backward_elemt(g, x, mean, invstd, w, sum_dy, sum_dy_xmu, count):
    n = count.double().sum()
    s = invstd.double()
    proj = s * s * sum_dy_xmu.double() / n
    scale = s if w is None else s * w.double()
    gi = g.double() - _chan(sum_dy.double() / n, x) - (x.double() - _chan(mean.double(), x)) * _chan(proj, x)
    return gi * _chan(scale, x)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,cl", _layouts())
def test_batch_norm_backward_elemt(shape, cl, dtype, affine, no_fallback):
    """sum_dy and sum_dy_xmu as if all-reduced over 2 ranks; count holds each rank's count."""
    x, g = _x(shape, dtype, cl), _x(shape, dtype, cl)
    c = shape[1]
    mean, invstd = torch.randn(c), torch.rand(c) + 0.5
    sum_dy, sum_dy_xmu = torch.randn(c) * 10, torch.randn(c) * 10
    count = torch.tensor([x.numel() // c, 2 * x.numel() // c], dtype=torch.int32)
    w = torch.randn(c).to(dtype) if affine else None
    gi = torch.batch_norm_backward_elemt(g.to(TPU), x.to(TPU), mean.to(TPU), invstd.to(TPU),
                                         None if w is None else w.to(TPU), sum_dy.to(TPU), sum_dy_xmu.to(TPU),
                                         count.to(TPU))
    assert gi.dtype == dtype
    assert gi.stride() == x.stride()  # CUDA's channels-last kernel keeps the layout
    _close(gi, _ref_backward_elemt(g, x, mean, invstd, w, sum_dy, sum_dy_xmu, count))


def test_batch_norm_backward_elemt_mixed_layouts():
    """A channels-last input with a row-major grad_output: CUDA's general kernel, row-major result."""
    x = _x((2, 3, 5, 4), torch.float32, channels_last=True)
    g = _x((2, 3, 5, 4), torch.float32)
    mean, invstd, sum_dy, sum_dy_xmu = torch.randn(3), torch.rand(3) + 0.5, torch.randn(3), torch.randn(3)
    count = torch.tensor([40], dtype=torch.int32)
    gi = torch.batch_norm_backward_elemt(g.to(TPU), x.to(TPU), mean.to(TPU), invstd.to(TPU), None,
                                         sum_dy.to(TPU), sum_dy_xmu.to(TPU), count.to(TPU))
    assert gi.is_contiguous()
    _close(gi, _ref_backward_elemt(g, x, mean, invstd, None, sum_dy, sum_dy_xmu, count))


# -- SyncBatchNorm in one process ---------------------------------------------------------------------
@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("tpu_dist", init_method="file://" + os.path.join(str(tmp_path), "store"),
                            rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _bn_pair(cls, c, dtype, channels_last=False):
    """A CPU nn.BatchNorm2d and a tpu `cls` module with the same random affine parameters."""
    ref = nn.BatchNorm2d(c, momentum=0.3).to(dtype)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    m = cls(c, momentum=0.3).to(dtype)
    m.load_state_dict(ref.state_dict())
    return ref, m.to(TPU)


def _compare_steps(ref, m, forward, dtype, channels_last=False, steps=3):
    """A few forward/backward steps on fresh batches; outputs, input and parameter gradients and the
    running statistics must agree."""
    for _ in range(steps):
        x = _x((4, 3, 5, 5), dtype, channels_last)
        g = torch.randn(x.shape).to(dtype)
        xr, xt = x.clone().requires_grad_(), x.to(TPU).requires_grad_()
        y, yt = ref(xr), forward(m, xt)
        _close(yt, y.detach())
        y.backward(g)
        yt.backward(g.to(TPU))
        _close(xt.grad, xr.grad)
        for p, q in zip(m.parameters(), ref.parameters()):
            _close(p.grad, q.grad)
            p.grad = q.grad = None
    _close(m.running_mean, ref.running_mean)
    _close(m.running_var, ref.running_var)
    assert m.num_batches_tracked.item() == ref.num_batches_tracked.item()


@pytest.mark.parametrize("dtype", DTYPES)
def test_sync_batch_norm_module_one_rank(one_rank_group, dtype, no_fallback):
    """nn.SyncBatchNorm with a 1-rank group: it needs no synchronization and runs F.batch_norm."""
    ref, m = _bn_pair(nn.SyncBatchNorm, 3, dtype)
    _compare_steps(ref, m, lambda m, x: m(x), dtype)


def _sync_forward(group):
    """SyncBatchNorm's synchronized path (torch/nn/modules/_functions.py), which the module takes only
    with 2 or more ranks, called with the 1-rank group: stats, all-gather, gather_stats_with_counts,
    elemt; backward_reduce, all-reduce, backward_elemt."""
    from torch.nn.modules._functions import SyncBatchNorm as SyncFn

    def forward(m, x):
        m.num_batches_tracked.add_(1)
        return SyncFn.apply(x, m.weight, m.bias, m.running_mean, m.running_var, m.eps, m.momentum, group, 1)
    return forward


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sync_batch_norm_synchronized_path_one_rank(one_rank_group, dtype, channels_last, no_fallback):
    ref, m = _bn_pair(nn.SyncBatchNorm, 3, dtype)
    _compare_steps(ref, m, _sync_forward(one_rank_group), dtype, channels_last)
