import warnings

import pytest
import torch

import torch_tpu
from helpers import check

TPU = torch.device("tpu")


def _cmp(fn, exact=True, **tol):
    """fn(device) on CPU and tpu: same dtype/shape, equal (or close) values, no fallback."""
    before = sum(torch_tpu.metrics.fallback_counts().values())
    c, t = fn("cpu"), fn(TPU)
    assert sum(torch_tpu.metrics.fallback_counts().values()) == before, torch_tpu.metrics.fallback_counts()
    assert t.device.type == "tpu" and t.dtype == c.dtype and t.shape == c.shape
    if exact:
        assert torch.equal(t.cpu(), c)
    else:
        torch.testing.assert_close(t.cpu(), c, **tol)


@pytest.mark.parametrize("args,kw", [
    ((5,), {}), ((2, 9), {}), ((-3, 10, 3), dict(dtype=torch.bfloat16)), ((0.5, 5, 1.5), dict(dtype=torch.int64)),
    ((10, 0, -1.5), {}), ((0, 1, 0.25), {}), ((7, 3, -1), dict(dtype=torch.int32)), ((0,), {}),
    ((2 ** 40, 2 ** 40 + 5), {}), ((1, 4), dict(dtype=torch.float64)), ((0, 3, 0.5), dict(dtype=torch.float16)),
])
def test_arange_exact(args, kw):
    _cmp(lambda d: torch.arange(*args, device=d, **kw))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_arange_fractional_step(dtype):
    _cmp(lambda d: torch.arange(0, 100, 0.37, device=d, dtype=dtype), exact=False,
         **(dict(atol=0.5, rtol=1e-2) if dtype == torch.bfloat16 else {}))


def test_arange_sizes_change_with_values():
    # Scalar values are runtime operands: the result size must still follow them.
    for n in (3, 5, 2, 5, 9):
        assert torch.equal(torch.arange(n, device=TPU).cpu(), torch.arange(n))
    for start, end in ((0, 5), (1, 6), (2, 12)):
        assert torch.equal(torch.arange(start, end, device=TPU).cpu(), torch.arange(start, end))
    out = torch.empty(5, device=TPU)
    torch.arange(0, 10, out=out)
    assert out.shape == (10,) and torch.equal(out.cpu(), torch.arange(0.0, 10))


def test_arange_of_new_values_runs_without_python():
    # A decode loop's cache_position = arange(past, past + 1), a new `past` every token: C++ sizes the
    # empty out= that torch.arange passes (csrc/eager/range_out.cc), so one plan serves every value.
    from torch_tpu.eager.kernel import Kernel
    slow = []
    real = Kernel._slow
    Kernel._slow = lambda self, *a: slow.append(self.name) or real(self, *a)
    try:
        with torch_tpu.eager_mode("strict"):  # (debug eager waits for each op from Python)
            for dtype in (torch.int64, torch.float32):
                torch.arange(3, 4, device=TPU, dtype=dtype)
            slow.clear()
            for past in range(7, 40):
                for dtype in (torch.int64, torch.float32):
                    t = torch.arange(past, past + 1, device=TPU, dtype=dtype)
                    assert t.dtype == dtype and torch.equal(t.cpu(), torch.arange(past, past + 1, dtype=dtype))
            assert slow == [], slow
    finally:
        Kernel._slow = real


@pytest.mark.parametrize("make", [lambda out: torch.arange(0, 4, out=out), lambda out: torch.arange(1, 2.5, 0.5, out=out),
                                  lambda out: torch.linspace(0, 4, 4, out=out)])
@pytest.mark.parametrize("shape", [(2, 2), (0,), (4,), (7,), (1, 3)])
def test_range_out_keeps_or_resizes_out_as_cpu(make, shape):
    # CPU keeps out='s shape when it has the element count ([[0, 1], [2, 3]]), else resizes it to 1-D,
    # warning first (arange) when out= was not empty.
    with warnings.catch_warnings(record=True) as cpu_warned:
        warnings.simplefilter("always")
        want = make(torch.empty(shape))
    with warnings.catch_warnings(record=True) as tpu_warned:
        warnings.simplefilter("always")
        out = torch.empty(shape, device=TPU)
        got = make(out)
    assert got is out and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want)
    def said(caught):  # (less "Triggered internally at <the C++ file>")
        return [str(w.message).split(" (Triggered")[0] for w in caught if "out tensor" in str(w.message)]
    assert said(tpu_warned) == said(cpu_warned)


def test_arange_errors():
    for args in ((0, 5, 0), (5, 0, 1), (0, float("inf"))):
        with pytest.raises(RuntimeError):
            torch.arange(*args)
        with pytest.raises(RuntimeError):
            torch.arange(*args, device=TPU)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("args", [(0, 1, 5), (-3, 7, 100), (5, -5, 33), (2, 2, 1), (0, 1, 0)])
def test_linspace(args, dtype):
    tol = dict(atol=2e-2, rtol=2e-2) if dtype in (torch.bfloat16, torch.float16) else dict(atol=1e-6, rtol=1e-6)
    _cmp(lambda d: torch.linspace(*args, device=d, dtype=dtype), exact=False, **tol)
    out = torch.empty(0, device=TPU, dtype=dtype)
    torch.linspace(*args, out=out)
    torch.testing.assert_close(out.cpu(), torch.linspace(*args, dtype=dtype), **tol)


def test_linspace_int():
    _cmp(lambda d: torch.linspace(0, 24, 13, device=d, dtype=torch.int64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool, torch.bfloat16])
def test_eye(dtype):
    _cmp(lambda d: torch.eye(3, device=d, dtype=dtype))
    _cmp(lambda d: torch.eye(3, 5, device=d, dtype=dtype))
    _cmp(lambda d: torch.eye(4, 2, device=d, dtype=dtype))
    _cmp(lambda d: torch.eye(0, device=d, dtype=dtype))
    out = torch.empty(1, device=TPU, dtype=dtype)
    torch.eye(2, 3, out=out)
    assert torch.equal(out.cpu(), torch.eye(2, 3, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float64])
def test_fills(dtype):
    _cmp(lambda d: torch.zeros(2, 3, device=d, dtype=dtype))
    _cmp(lambda d: torch.ones(4, device=d, dtype=dtype))
    _cmp(lambda d: torch.full((2, 2), 1, device=d, dtype=dtype))
    _cmp(lambda d: torch.zeros((), device=d, dtype=dtype))
    _cmp(lambda d: torch.ones(0, 3, device=d, dtype=dtype))
    _cmp(lambda d: torch.empty(2, 3, device=d, dtype=dtype).shape and torch.zeros_like(
        torch.empty(2, 3, device=d), dtype=dtype))
    _cmp(lambda d: torch.ones_like(torch.empty(2, 3, device=d, dtype=dtype)))
    _cmp(lambda d: torch.full_like(torch.empty(3, device=d, dtype=dtype), 1))
    _cmp(lambda d: torch.empty(1, device=d, dtype=dtype).new_zeros((2, 2)))
    _cmp(lambda d: torch.empty(1, device=d, dtype=dtype).new_ones(3))


def test_full_and_scalars():
    _cmp(lambda d: torch.full((2, 3), 7, device=d))
    _cmp(lambda d: torch.full((2, 3), 2.5, device=d))
    _cmp(lambda d: torch.full((3,), True, device=d))
    _cmp(lambda d: torch.full((3,), float("-inf"), device=d))
    _cmp(lambda d: torch.full_like(torch.empty(2, device=d), 2.5))
    _cmp(lambda d: torch.empty(2, device=d).new_full((4,), -1))
    _cmp(lambda d: torch.scalar_tensor(3, device=d))
    _cmp(lambda d: torch.scalar_tensor(3.5, device=d, dtype=torch.float64))
    _cmp(lambda d: torch.tensor(3.5, device=d))
    _cmp(lambda d: torch.tensor([[1, 2], [3, 4]], device=d))
    e = torch.empty(3, 4, device=TPU, dtype=torch.bfloat16)
    assert e.shape == (3, 4) and e.dtype == torch.bfloat16
    assert torch.empty_like(e).shape == (3, 4)


@pytest.mark.parametrize("fmt", [torch.preserve_format, torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("src", ["transposed", "channels_last", "sliced"])
def test_like_factories_keep_cpu_layout(src, fmt):
    """*_like runs PyTorch's own C++ composite (empty_like + fill_): its strides follow the CPU
    reference for every memory_format, on dense, permuted and overlapping-free sliced inputs."""
    def make(d):
        x = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32, device=d).reshape(2, 3, 4, 5)
        return {"transposed": x.transpose(1, 3), "channels_last": x.contiguous(memory_format=torch.channels_last),
                "sliced": x[:, 1:, ::2]}[src]
    for like in (torch.empty_like, torch.zeros_like, torch.ones_like, lambda t, **k: torch.full_like(t, 2.5, **k)):
        c, t = like(make("cpu"), memory_format=fmt), like(make(TPU), memory_format=fmt)
        assert t.device.type == "tpu" and (t.shape, t.stride(), t.dtype) == (c.shape, c.stride(), c.dtype)
        if like is not torch.empty_like:
            assert torch.equal(t.cpu(), c)
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::ones_like", "PrivateUse1")


def test_factories_in_autograd_graph():
    x = torch.randn(5, requires_grad=True)
    check(lambda x: x * torch.arange(5, device=x.device) + torch.ones_like(x), x)
