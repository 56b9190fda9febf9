import math

import pytest
import torch

import torch_tpu

from helpers import check, python_entries, to_tpu

FLOATS = [torch.float32, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.uint8, torch.bool]


def _x(dtype, *shape):
    if dtype == torch.bool:
        return torch.rand(*shape) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(0, 5, shape, dtype=dtype)
    return torch.randn(*shape, dtype=dtype).requires_grad_()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("fn", [
    lambda x: x.sum(), lambda x: x.sum(1), lambda x: x.sum((0, 2), keepdim=True), lambda x: x.sum([]),
    lambda x: x.sum(-1, dtype=torch.float32), lambda x: x.mean(), lambda x: x.mean((0, -1)),
    lambda x: x.mean(1, keepdim=True), lambda x: x.amax(1), lambda x: x.amin((0, 2)), lambda x: x.amax(),
    lambda x: x.max(), lambda x: x.min(), lambda x: x.max(1), lambda x: x.min(-1, keepdim=True),
    lambda x: x.argmax(), lambda x: x.argmin(1), lambda x: x.argmax(2, keepdim=True),
    lambda x: x.argmax(keepdim=True),
    lambda x: x.var(), lambda x: x.var(1), lambda x: x.std((0, 2), keepdim=True), lambda x: x.var(1, correction=0),
    lambda x: x.std(2, correction=2), lambda x: torch.var_mean(x, 1), lambda x: torch.std_mean(x, (0, 1)),
    lambda x: x.prod(), lambda x: x.prod(1), lambda x: x.prod(2, keepdim=True),
    lambda x: x.logsumexp(1), lambda x: x.logsumexp((0, 2), keepdim=True),
    lambda x: torch.linalg.vector_norm(x), lambda x: torch.linalg.vector_norm(x, 1, dim=1),
    lambda x: torch.linalg.vector_norm(x, 3, dim=(0, 2)), lambda x: x.norm(),
    lambda x: torch.linalg.vector_norm(x, math.inf, dim=1), lambda x: torch.linalg.vector_norm(x, -math.inf),
    lambda x: torch.linalg.vector_norm(x, 0, dim=2),
    lambda x: (x > 0).any(1), lambda x: (x > 0).all(), lambda x: x.any((0, 1)), lambda x: x.all(2),
    lambda x: x.sum(1, dtype=torch.float64) if x.dtype == torch.float32 else x.sum(1),
])
def test_reduce_float(fn, dtype):
    check(fn, _x(dtype, 3, 4, 5))


@pytest.mark.parametrize("dtype", FLOATS)
def test_cumsum(dtype):
    x = torch.randn(3, 4, 5, dtype=dtype).requires_grad_()
    check(lambda x: x.cumsum(1), x)
    check(lambda x: x.cumsum(-1, dtype=torch.float32), x)
    check(lambda x: x.cumprod(0), x)


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("fn", [
    lambda x: x.sum(), lambda x: x.sum(1), lambda x: x.prod(0), lambda x: x.amax(1), lambda x: x.amin(),
    lambda x: x.max(), lambda x: x.max(1), lambda x: x.min(0), lambda x: x.argmax(1), lambda x: x.argmin(),
    lambda x: x.cumsum(1), lambda x: x.any(), lambda x: x.all(1), lambda x: x.any((0, 1), keepdim=True),
    lambda x: x.sum(0, dtype=torch.float32), lambda x: x.mean(1, dtype=torch.float32),
])
def test_reduce_int_bool(fn, dtype):
    x = _x(dtype, 4, 6)
    try:
        fn(x)
    except RuntimeError as e:  # e.g. argmax of bool: the tpu must refuse it too
        with pytest.raises(RuntimeError, match=str(e).split(":")[0]):
            fn(to_tpu(x))
        return
    check(fn, x)


def test_ties_and_nan():
    x = torch.tensor([[1., 3., 3., 0.], [float("nan"), 2., float("nan"), 5.], [2., 2., 2., 2.],
                      [-math.inf, -math.inf, -math.inf, -math.inf]])
    for fn in (lambda x: x.max(1), lambda x: x.min(1), lambda x: x.argmax(1), lambda x: x.argmin(1),
               lambda x: x.amax(1), lambda x: x.amin(0), lambda x: x.max(), lambda x: x.argmax(),
               lambda x: x.logsumexp(1), lambda x: torch.softmax(x, 1)):
        check(fn, x)
    check(lambda x: x.argmax(), torch.tensor([1, 7, 7, 2]))


def test_zero_dim():
    x = torch.tensor(2.5).requires_grad_()
    for fn in (lambda x: x.sum(), lambda x: x.sum(0), lambda x: x.mean(), lambda x: x.amax(), lambda x: x.max(),
               lambda x: x.max(0), lambda x: x.argmax(), lambda x: x.argmin(0, keepdim=True), lambda x: x.prod(),
               lambda x: x.var(correction=0), lambda x: x.logsumexp(0), lambda x: x.cumsum(0),
               lambda x: torch.linalg.vector_norm(x), lambda x: (x > 0).any(), lambda x: x.std(0)):
        check(fn, x)


def test_empty():
    x = torch.randn(0, 3)
    for fn in (lambda x: x.sum(), lambda x: x.sum(0), lambda x: x.mean(0), lambda x: x.prod(0), lambda x: x.any(0),
               lambda x: x.all(0), lambda x: x.logsumexp(0), lambda x: x.var(0), lambda x: x.amax(1),
               lambda x: x.argmax(1), lambda x: x.max(1), lambda x: x.cumsum(0), lambda x: x.sum(1)):
        check(fn, x)


def test_empty_errors():
    x = to_tpu(torch.randn(0, 3))
    with pytest.raises(RuntimeError, match="Expected reduction dim"):
        x.max()
    with pytest.raises(IndexError, match="Expected reduction dim"):  # CPU's type
        x.argmax()
    with pytest.raises((IndexError, RuntimeError)):
        x.amax(0)
    with pytest.raises(RuntimeError, match="floating point"):
        to_tpu(torch.ones(3, dtype=torch.int32)).var()


@torch_tpu.eager_mode("strict")  # the C++ path (debug eager runs every op through Python)
def test_checks_the_key_fixes_run_once_per_key():
    # argmax / max / var check only dtypes and shapes (check_per_key): a passing call runs in C++
    # with no Python (generate() calls argmax and max every token); a refused one raises every time.
    x, i, e = to_tpu(torch.randn(3, 5)), to_tpu(torch.ones(4, dtype=torch.int32)), to_tpu(torch.randn(0, 2))
    ops = [lambda: x.argmax(1), lambda: x.max(), lambda: x.var(0), lambda: x.bernoulli(0.25)]
    for op in ops:
        op()
    with python_entries() as slow:
        for _ in range(3):
            for op in ops:
                op()
    assert slow == [], slow
    for _ in range(2):
        with pytest.raises(RuntimeError, match="floating point"):
            i.var()
        with pytest.raises(IndexError, match="Expected reduction dim"):
            e.argmax()
        with pytest.raises(RuntimeError, match="does not support bool"):
            to_tpu(torch.ones(2, dtype=torch.bool)).argmax()


@pytest.mark.parametrize("dtype", FLOATS)
def test_non_contiguous(dtype):
    x = torch.randn(6, 5, 4, dtype=dtype).requires_grad_()
    check(lambda x: x.transpose(0, 2).sum(1), x)
    check(lambda x: x[:, ::2].amax(0), x)
    check(lambda x: x.permute(2, 0, 1).max(2), x)
    check(lambda x: x[1:, :, ::3].var(1), x)
    check(lambda x: x.transpose(1, 2).softmax(1), x)


def test_runtime_scalars_share_programs():
    # correction and ord are runtime operands: several values through one compiled program
    x = torch.randn(4, 5)
    for c in (0, 1, 2.5, 7):
        check(lambda x: x.var(1, correction=c), x)
    for p in (1, 2, 0.5, 3, math.inf):
        check(lambda x: torch.linalg.vector_norm(x, p, dim=1), x)


def test_logsumexp_complex():
    z = torch.randn(3, 4, dtype=torch.complex64) * 3
    check(lambda x: x.logsumexp(1), z, grad=False)
    check(lambda x: x.logsumexp((0, 1), keepdim=True), z, grad=False)
