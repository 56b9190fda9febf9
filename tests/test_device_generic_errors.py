"""Errors as PyTorch raises them on every device (CPU the reference), where PyTorch's own
device-generic test files (test_indexing, test_view_ops, test_shape_ops, run for tpu) found the tpu
raising another type or nothing: same exception type, and the tensors an op would write unchanged."""
import pytest
import torch

import torch_tpu  # noqa: F401

DEVICES = ["cpu", "tpu"]


def _raises_as_cpu(fn, exc, match):
    for d in DEVICES:
        with pytest.raises(exc, match=match):
            fn(d)


def test_clamp_without_bounds_is_a_runtime_error():
    _raises_as_cpu(lambda d: torch.clamp(torch.ones(3, device=d)), RuntimeError, "At least one of 'min' or 'max'")


@pytest.mark.parametrize("index", [[], [0.0]])
def test_float_index_tensors_are_index_errors(index):
    _raises_as_cpu(lambda d: torch.ones(3, device=d)[torch.tensor(index, device=d)], IndexError,
                   "tensors used as indices must be long, int, byte or bool")


def test_index_into_an_empty_dimension_is_an_index_error_not_a_compile_error():
    _raises_as_cpu(lambda d: torch.ones(0, 3, device=d)[torch.tensor([1], device=d)], IndexError,
                   "out of bounds for dimension with size 0")
    x = torch.ones(0, 3, device="tpu")
    assert x[torch.tensor([], dtype=torch.long, device="tpu")].shape == (0, 3)  # no index: no error


def test_index_fill_with_a_complex_value_on_a_real_tensor_is_refused():
    for d in DEVICES:
        x = torch.ones(3, device=d)
        with pytest.raises(RuntimeError, match="Converting complex Scalar to non-complex type"):
            x.index_fill_(0, torch.tensor([0], device=d), 1 + 2j)
        assert torch.equal(x.cpu(), torch.ones(3))
    z = torch.zeros(3, dtype=torch.complex64, device="tpu").index_fill_(0, torch.tensor([1], device="tpu"), 1 + 2j)
    assert z.cpu()[1] == 1 + 2j


@pytest.mark.parametrize("op", ["nonzero", "masked_select"])
def test_out_on_another_device_is_refused_before_anything_is_written(op):
    def call(x, out):
        if op == "nonzero":
            return torch.nonzero(x, out=out)
        return torch.masked_select(x, x > 0, out=out)
    x = torch.tensor([[1.0, 0.0], [2.0, 3.0]], device="tpu")
    out = torch.full((2,), 7, dtype=torch.long if op == "nonzero" else torch.float32)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        call(x, out)
    assert out.tolist() == [7, 7]
    tpu_out = torch.empty(5, dtype=out.dtype, device="tpu")  # the same device: resized and written, as on CPU
    assert call(x, tpu_out) is tpu_out
    assert torch.equal(tpu_out.cpu(), call(x.cpu(), torch.empty(0, dtype=out.dtype)))


def test_uint8_mask_indexing_warns_as_on_cpu():
    for d in DEVICES:
        x = torch.arange(3.0, device=d)
        with pytest.warns(UserWarning, match="indexing with dtype torch.uint8 is now deprecated"):
            got = x[torch.tensor([1, 0, 1], dtype=torch.uint8, device=d)]
        assert got.cpu().tolist() == [0.0, 2.0]
