import pytest
import torch
import torch.nn.functional as F

from helpers import check

FLOATS = [torch.float32, torch.bfloat16]


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).requires_grad_()


MAX_CASES = [  # (input shape, args of F.max_pool2d)
    ((2, 3, 6, 6), dict(kernel_size=2)),
    ((2, 3, 7, 6), dict(kernel_size=3, stride=2, padding=1)),
    ((1, 2, 7, 8), dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 1), dilation=(1, 2), ceil_mode=True)),
    ((3, 5, 5), dict(kernel_size=2, ceil_mode=True)),   # unbatched
    ((1, 1, 6, 5), dict(kernel_size=(2, 3), stride=1)),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,kw", MAX_CASES)
def test_max_pool2d(dtype, shape, kw):
    check(lambda x: F.max_pool2d(x, return_indices=True, **kw), r(*shape, dtype=dtype))
    check(lambda x: F.max_pool2d(x, **kw), r(*shape, dtype=dtype))


def test_max_pool_1d_3d_overlapping_windows_route_gradients_to_their_indices():
    # The backward spreads each window offset's gradient to input resolution (no scatter): windows
    # that overlap (stride < kernel), dilate, pad, or end past the input (ceil_mode) each add theirs.
    x = r(2, 3, 9, dtype=torch.float64)
    check(lambda x: F.max_pool1d(x, 3, 1, 1, 2, ceil_mode=True), x)
    x = r(1, 2, 5, 6, 7, dtype=torch.float64)
    check(lambda x: F.max_pool3d(x, (3, 2, 3), (2, 1, 2), (1, 0, 1), (1, 2, 1), ceil_mode=True), x)
    ties = torch.ones(1, 1, 5, 5, dtype=torch.float64, requires_grad=True)  # every window ties
    check(lambda x: F.max_pool2d(x, 3, 1, 1), ties)


def test_max_pool2d_ties_nan_inf_and_integers():
    x = torch.tensor([[[[1., float("nan"), 2., float("nan")], [float("-inf")] * 4]]])
    check(lambda x: F.max_pool2d(x, (1, 4), return_indices=True), x)     # the last NaN wins, as on CPU
    check(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), torch.full((1, 1, 4, 4), float("-inf")))
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), torch.ones(1, 1, 4, 4).requires_grad_())  # ties
    for dt in (torch.int64, torch.int32, torch.uint8):
        check(lambda x: F.max_pool2d(x, 2, 1, 1, return_indices=True), torch.randint(0, 9, (1, 2, 4, 4), dtype=dt))
    check(lambda x: F.max_pool2d(x, 2), -torch.arange(1, 17).view(1, 1, 4, 4))


AVG_CASES = [
    ((2, 3, 6, 6), dict(kernel_size=2)),
    ((2, 3, 7, 6), dict(kernel_size=3, stride=2, padding=1)),
    ((2, 3, 7, 6), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ((2, 3, 8, 6), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ((2, 3, 8, 6), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ((1, 2, 5, 6), dict(kernel_size=(3, 2), stride=(1, 2), padding=(1, 0), divisor_override=3)),
    ((3, 5, 5), dict(kernel_size=2, stride=1)),   # unbatched
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,kw", AVG_CASES)
def test_avg_pool2d(dtype, shape, kw):
    check(lambda x: F.avg_pool2d(x, **kw), r(*shape, dtype=dtype))


def test_avg_pool2d_long():
    check(lambda x: F.avg_pool2d(x, 3, 1, 1), torch.randint(-9, 9, (1, 2, 4, 4)))  # truncating division
    check(lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), torch.randint(-9, 9, (1, 2, 5, 4)))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,size", [((2, 3, 6, 6), 3), ((2, 3, 7, 5), (3, 4)), ((3, 7, 5), (2, 1)),
                                        ((1, 2, 5, 5), 1), ((1, 2, 4, 6), (None, 3)), ((1, 1, 3, 3), 5)])
def test_adaptive_avg_pool2d(dtype, shape, size):
    check(lambda x: F.adaptive_avg_pool2d(x, size), r(*shape, dtype=dtype))
    check(lambda x: torch.ops.aten._adaptive_avg_pool2d(x, [3, 2]), r(*shape, dtype=dtype))


def test_modules_non_contiguous_empty():
    for mod in (torch.nn.MaxPool2d(3, 2, 1), torch.nn.AvgPool2d(2), torch.nn.AdaptiveAvgPool2d((2, 3))):
        check(lambda x: mod(x.permute(0, 3, 1, 2)), r(2, 6, 7, 3))   # channels-last view
        check(lambda x: mod(x[:, :, 1::2]), r(1, 3, 12, 5))
        check(mod, r(0, 3, 6, 6))                                     # empty batch


def test_errors():
    tpu = torch.device("tpu")
    with pytest.raises(NotImplementedError, match="Bool"):
        F.max_pool2d(torch.ones(1, 1, 4, 4, dtype=torch.bool, device=tpu), 2)
    with pytest.raises(NotImplementedError, match="Int"):
        F.avg_pool2d(torch.ones(1, 1, 4, 4, dtype=torch.int32, device=tpu), 2)
    with pytest.raises(NotImplementedError, match="Long"):
        F.adaptive_avg_pool2d(torch.ones(1, 1, 4, 4, dtype=torch.int64, device=tpu), 3)
    for fn in (lambda x: F.max_pool2d(x, 2, padding=2), lambda x: F.avg_pool2d(x, 5),
               lambda x: F.max_pool2d(x, 2, stride=0)):
        with pytest.raises(RuntimeError):
            fn(torch.ones(1, 1, 4, 4))
        with pytest.raises(RuntimeError):
            fn(torch.ones(1, 1, 4, 4, device=tpu))
