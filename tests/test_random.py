import math

import pytest
import torch

import torch_tpu
from helpers import python_entries

TPU = torch.device("tpu")
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
N = 100_000


@pytest.fixture(autouse=True)
def no_fallback(no_fallback):
    before = sum(torch_tpu.metrics.fallback_counts().values())
    yield
    assert sum(torch_tpu.metrics.fallback_counts().values()) == before


def _tol(n):  # 6 standard errors
    return 6 / math.sqrt(n)


@pytest.mark.parametrize("dtype", FLOATS)
def test_rand_statistics(dtype):
    torch.manual_seed(0)
    x = torch.rand(N, device=TPU, dtype=dtype)
    assert x.device.type == "tpu" and x.dtype == dtype
    x = x.cpu().double()
    assert 0 <= x.min() and x.max() < 1
    assert abs(x.mean() - 0.5) < _tol(N) * 0.29
    assert abs(x.std() - math.sqrt(1 / 12)) < 0.01
    u = torch.empty(N, device=TPU, dtype=dtype).uniform_(-3, 5).cpu().double()
    assert -3 <= u.min() and u.max() < 5 and abs(u.mean() - 1) < _tol(N) * 2.31


@pytest.mark.parametrize("dtype", FLOATS)
def test_randn_statistics(dtype):
    torch.manual_seed(0)
    x = torch.randn(N, device=TPU, dtype=dtype).cpu().double()
    assert abs(x.mean()) < _tol(N) and abs(x.std() - 1) < 0.01
    assert torch.isfinite(x).all()
    y = torch.empty(N, device=TPU, dtype=dtype).normal_(2.0, 0.5).cpu().double()
    assert abs(y.mean() - 2) < _tol(N) * 0.5 and abs(y.std() - 0.5) < 0.01
    # fraction within one sigma
    assert abs((x.abs() < 1).double().mean() - 0.6827) < 0.01


def test_randn_like_rand_like_shapes():
    t = torch.zeros(3, 4, device=TPU, dtype=torch.bfloat16)
    for f in (torch.rand_like, torch.randn_like):
        r = f(t)
        assert r.shape == t.shape and r.dtype == t.dtype and r.device.type == "tpu"
    assert torch.randn(0, device=TPU).shape == (0,)
    assert torch.rand((), device=TPU).shape == ()


def test_reproducible_and_fresh():
    torch.manual_seed(123)
    a = torch.randn(64, device=TPU).cpu()
    b = torch.randn(64, device=TPU).cpu()
    i = torch.randint(0, 100, (64,), device=TPU).cpu()
    torch.manual_seed(123)
    assert torch.equal(torch.randn(64, device=TPU).cpu(), a)
    assert torch.equal(torch.randn(64, device=TPU).cpu(), b)
    assert torch.equal(torch.randint(0, 100, (64,), device=TPU).cpu(), i)
    assert not torch.equal(a, b)
    torch.manual_seed(124)
    assert not torch.equal(torch.randn(64, device=TPU).cpu(), a)


def test_manual_seed_seeds_tpu_generator():
    torch.manual_seed(7)
    assert torch.tpu.initial_seed() == 7
    g = torch.Generator(device=TPU)
    g.manual_seed(5)
    a = torch.rand(8, device=TPU, generator=g).cpu()
    g.manual_seed(5)
    assert torch.equal(torch.rand(8, device=TPU, generator=g).cpu(), a)
    s = torch.tpu.get_rng_state()
    c = torch.rand(8, device=TPU).cpu()
    torch.tpu.set_rng_state(s)
    assert torch.equal(torch.rand(8, device=TPU).cpu(), c)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.int8, torch.float32,
                                   torch.bfloat16])
def test_randint_range(dtype):
    torch.manual_seed(0)
    x = torch.randint(-5, 17, (N,), device=TPU, dtype=dtype) if dtype != torch.uint8 else \
        torch.randint(3, 17, (N,), device=TPU, dtype=dtype)
    assert x.dtype == dtype
    x = x.cpu().double()
    lo = -5 if dtype != torch.uint8 else 3
    assert x.min() == lo and x.max() == 16
    assert torch.equal(x, x.round())
    assert abs(x.mean() - (lo + 16) / 2) < 0.1
    # random_.to and random_()
    y = torch.empty(1000, device=TPU, dtype=dtype).random_(7).cpu()
    assert y.min() == 0 and y.max() == 6


def test_random_default_ranges():
    b = torch.empty(1000, device=TPU, dtype=torch.bool).random_().cpu()
    assert b.any() and not b.all()
    i8 = torch.empty(5000, device=TPU, dtype=torch.int8).random_().cpu()
    assert i8.min() >= 0 and i8.max() == 127
    f = torch.empty(5000, device=TPU, dtype=torch.bfloat16).random_().cpu()
    assert f.min() >= 0 and f.max() <= 256
    big = torch.randint(0, 2 ** 40, (1000,), device=TPU).cpu()
    assert big.max() > 2 ** 38 and big.min() >= 0
    full = torch.empty(1000, device=TPU, dtype=torch.int64).random_(-2 ** 63, None).cpu()
    assert (full < 0).any() and (full > 0).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int32])
def test_bernoulli(dtype):
    torch.manual_seed(0)
    x = torch.empty(N, device=TPU, dtype=dtype).bernoulli_(0.3).cpu().double()
    assert set(x.unique().tolist()) <= {0.0, 1.0} and abs(x.mean() - 0.3) < _tol(N) * 0.46
    if dtype.is_floating_point:
        p = torch.linspace(0, 1, 4).repeat(N // 4).to(dtype).to(TPU)
        y = torch.bernoulli(p).cpu().double().view(-1, 4).mean(0)
        torch.testing.assert_close(y, torch.tensor([0, 1 / 3, 2 / 3, 1], dtype=torch.float64), atol=0.02, rtol=0)
        z = torch.empty(N, device=TPU, dtype=dtype).bernoulli_(torch.full((N,), 0.75, device=TPU)).cpu().double()
        assert abs(z.mean() - 0.75) < 0.01
        w = torch.bernoulli(torch.zeros(N, device=TPU, dtype=dtype), 0.6).cpu().double()
        assert abs(w.mean() - 0.6) < 0.01


def test_exponential_and_normal_tensor():
    torch.manual_seed(0)
    e = torch.empty(N, device=TPU).exponential_(2.0).cpu().double()
    assert e.min() > 0 and abs(e.mean() - 0.5) < 0.01 and torch.isfinite(e).all()
    m = torch.normal(torch.full((N,), 3.0, device=TPU), 2.0).cpu().double()
    assert abs(m.mean() - 3) < 0.05 and abs(m.std() - 2) < 0.03
    s = torch.normal(-1.0, torch.full((N,), 0.5, device=TPU)).cpu().double()
    assert abs(s.mean() + 1) < 0.02 and abs(s.std() - 0.5) < 0.01
    t = torch.normal(torch.zeros(N // 10, 1, device=TPU), torch.ones(10, device=TPU))
    assert t.shape == (N // 10, 10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout(dtype):
    torch.manual_seed(0)
    x = torch.randn(N, dtype=dtype).to(TPU).requires_grad_()
    y = torch.nn.functional.dropout(x, 0.25, training=True)
    keep = (y != 0).cpu()
    assert abs(keep.double().mean() - 0.75) < 0.01
    yc, xc = y.detach().cpu(), x.detach().cpu()
    torch.testing.assert_close(yc[keep], (xc[keep].float() / 0.75).to(dtype))
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad.cpu(), torch.where(keep, 1 / 0.75, 0.0).to(dtype))
    # eval mode and p=0 / p=1 edge cases
    assert torch.equal(torch.nn.functional.dropout(x, 0.5, training=False).detach().cpu(), xc)
    assert torch.equal(torch.nn.functional.dropout(x, 1.0, training=True).detach().cpu(), torch.zeros_like(xc))
    torch.manual_seed(3)
    a = torch.nn.Dropout(0.5)(x).detach().cpu()
    torch.manual_seed(3)
    assert torch.equal(torch.nn.Dropout(0.5)(x).detach().cpu(), a)


def test_native_dropout_direct():
    x = torch.randn(4, 5).to(TPU)
    out, mask = torch.ops.aten.native_dropout(x, 0.5, True)
    assert mask.dtype == torch.bool and out.shape == x.shape
    torch.testing.assert_close(out.cpu(), x.cpu() * mask.cpu() * 2)
    out, mask = torch.ops.aten.native_dropout(x, 0.5, False)
    assert mask.cpu().all() and torch.equal(out.cpu(), x.cpu())


ERRORS = [
    lambda d: torch.zeros(3, dtype=torch.int64, device=d).uniform_(),
    lambda d: torch.zeros(3, device=d).uniform_(2, 1),
    lambda d: torch.zeros(3, device=d).normal_(0, -1),
    lambda d: torch.zeros(3, device=d).bernoulli_(1.5),
    lambda d: torch.zeros(3, device=d).bernoulli_(torch.tensor([1.5, 0, 0], device=d)),
    lambda d: torch.bernoulli(torch.tensor([-0.5, 0, 0], device=d)),
    lambda d: torch.zeros(3, device=d).random_(5, 2),
    lambda d: torch.zeros(3, dtype=torch.uint8, device=d).random_(0, 300),
    lambda d: torch.zeros(3, device=d).exponential_(-1),
    lambda d: torch.zeros(3, dtype=torch.int32, device=d).exponential_(),
    lambda d: torch.normal(torch.zeros(3, device=d), torch.tensor([1., -1., 1.], device=d)),
    lambda d: torch.zeros(3, device=d).uniform_(0, float("inf")),
]


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_errors_match_cpu(i):
    with pytest.raises(Exception) as ec:
        ERRORS[i]("cpu")
    x = torch.zeros(3, device=TPU)
    with pytest.raises(type(ec.value)) as et:
        ERRORS[i](TPU)
    assert str(et.value).split("\n")[0][:40] == str(ec.value).split("\n")[0][:40]
    assert torch.equal(x.cpu(), torch.zeros(3))


@torch_tpu.eager_mode("strict")  # the C++ path (debug eager runs every op through Python)
def test_random_ops_whose_checks_the_key_fixes_stay_in_cpp():
    # uniform_ / normal_ / exponential_ / random_ / geometric_ / cauchy_ / log_normal_ check only the
    # dtype and their number arguments, which the eager key holds (check_per_key): a passing call runs
    # in C++ with no Python (dropout's, every step); a refused one raises on every call.
    x = torch.zeros(7, device=TPU)
    ops = [lambda: x.uniform_(-1, 1), lambda: x.normal_(0, 2), lambda: x.exponential_(3.0),
           lambda: x.random_(0, 9), lambda: x.geometric_(0.5), lambda: x.cauchy_(0, 1),
           lambda: x.log_normal_(0, 1), lambda: torch.nn.functional.dropout(x, 0.3, True)]
    for op in ops:
        op()
    with python_entries() as slow:
        for _ in range(3):
            for op in ops:
                op()
    assert slow == [], slow
    for _ in range(2):
        with pytest.raises(RuntimeError, match="from=2 > to=1"):
            x.uniform_(2, 1)
        with pytest.raises(RuntimeError, match="expects lambda > 0.0"):
            x.exponential_(-1.0)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_recomputes_dropout_with_the_forwards_mask(use_reentrant):
    """torch.utils.checkpoint restores the tpu generator before recomputing a block (it asks the device
    module's `_initialized`, as of torch.cuda): a block with dropout gets the forward's mask in the
    backward, so its gradients are those of the block without checkpointing. Without it, the
    recomputation drew a new mask: gradients off by up to 8 in a Linear-Dropout-Linear block, silently."""
    from torch.utils.checkpoint import checkpoint
    assert torch.tpu._initialized is torch_tpu.tpu.is_initialized()
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.5), torch.nn.Linear(32, 4)).to("tpu")
    x = torch.randn(8, 16, device="tpu", requires_grad=True)  # (the reentrant form needs an input that does)
    grads = []
    for ckpt in (False, True):
        block.zero_grad()
        torch.manual_seed(1)
        out = checkpoint(block, x, use_reentrant=use_reentrant) if ckpt else block(x)
        out.square().sum().backward()
        grads.append([p.grad.cpu() for p in block.parameters()])
    for plain, ckpt in zip(*grads):
        torch.testing.assert_close(ckpt, plain)


@pytest.mark.skipif(torch.tpu.device_count() < 2, reason="needs two tpu devices (TORCH_TPU_CPU_DEVICE_COUNT)")
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_a_random_op_draws_from_its_own_devices_generator(use_reentrant):
    """Random ops on tpu:1 drew from tpu:0's generator (the current device's): get/set_rng_state(1) and
    fork_rng(devices=[1]) did not replay them, and checkpoint recomputed tpu:1's dropout with another
    mask once tpu:0's generator had moved (gradients off by 5, silently)."""
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(3)
    s0, s1 = torch.tpu.get_rng_state(0), torch.tpu.get_rng_state(1)
    a = torch.rand(5, device="tpu:1")
    assert torch.equal(torch.tpu.get_rng_state(0), s0) and not torch.equal(torch.tpu.get_rng_state(1), s1)
    torch.tpu.set_rng_state(s1, 1)
    torch.testing.assert_close(torch.rand(5, device="tpu:1").cpu(), a.cpu(), rtol=0, atol=0)
    before = torch.tpu.get_rng_state(1)
    with torch.random.fork_rng(devices=[1], device_type="tpu"):
        torch.randn(3, device="tpu:1")
        assert not torch.equal(torch.tpu.get_rng_state(1), before)
    assert torch.equal(torch.tpu.get_rng_state(1), before)

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.5), torch.nn.Linear(32, 4)).to("tpu:1")
    x = torch.randn(8, 16, device="tpu:1", requires_grad=True)
    grads = []
    for ckpt in (False, True):
        block.zero_grad()
        torch.manual_seed(1)
        torch.rand(7, device="tpu:0")  # tpu:0's generator moves; tpu:1's must not
        out = checkpoint(block, x, use_reentrant=use_reentrant) if ckpt else block(x)
        out.square().sum().backward()
        grads.append([p.grad.cpu() for p in block.parameters()])
    for plain, ckpt in zip(*grads):
        torch.testing.assert_close(ckpt, plain)
