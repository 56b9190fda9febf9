"""What PyTorch's own device-generic tests found on tpu (issue 51), each against CPU:
- process-wide state that changes an op's result (the default dtype) is part of the eager plan key,
  so a plan made before the change is not reused after (uint8 + 5.5 stayed float32 after
  torch.set_default_dtype(torch.float64));
- a storage slice, which torch_tpu cannot address, is a clear error, not a crash (SIGSEGV);
- cummax / cummin of real sizes compile.
"""
import pytest
import torch

TPU = torch.device("tpu")


@pytest.fixture
def restore_default_dtype():
    before = torch.get_default_dtype()
    yield
    torch.set_default_dtype(before)


def test_default_dtype_change_reaches_cached_plans(restore_default_dtype):
    u, i = torch.arange(4, dtype=torch.uint8), torch.arange(1, 5)
    calls = [lambda a, b: a + 5.5, lambda a, b: torch.true_divide(b, b), lambda a, b: b * 0.5]
    for dtype in (torch.float32, torch.float64, torch.float32):
        torch.set_default_dtype(dtype)
        for f in calls:
            c, t = f(u, i), f(u.to(TPU), i.to(TPU))
            assert t.dtype == c.dtype == dtype
            torch.testing.assert_close(t.cpu(), c)


def test_a_storage_slice_is_a_clear_error():
    s = torch.arange(15.0, device=TPU).untyped_storage()
    cpu = torch.arange(15.0).untyped_storage()
    assert s[4] == cpu[4] and s.size() == cpu.size()
    with pytest.raises(RuntimeError, match=r"slice of a tpu storage \(storage\[a:b\]\)"):
        s[0:4][0]
    # the advice given works
    sliced = torch.empty(0, dtype=torch.uint8, device=TPU).set_(s)[4:8]
    assert sliced.cpu().tolist() == list(cpu[4:8])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_cummax_cummin_of_real_sizes(dtype):
    """100 x 100 compiles (a variadic reduce_window failed XLA:CPU's compiler there, issue 51); ties
    take the latest index and NaNs propagate with the latest NaN's index, as on CPU."""
    x = (torch.randn(100, 100) * 3).round().to(dtype)
    if dtype.is_floating_point:
        x.view(-1)[::37] = float("nan")
    for f in (torch.cummax, torch.cummin):
        for dim in (0, 1):
            (cv, ci), (tv, ti) = f(x, dim), f(x.to(TPU), dim)
            torch.testing.assert_close(tv.cpu(), cv, equal_nan=True)
            assert torch.equal(ti.cpu(), ci)
