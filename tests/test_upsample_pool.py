"""Native lowerings of resampling, N-d pooling, reflection/replication padding and grid sampling:
values, dtypes and gradients equal to CPU's, with no CPU fallback."""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu

from helpers import check


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).requires_grad_()


# -- interpolate ---------------------------------------------------------------------------------
INTERP = [  # (mode, input shape, kwargs)
    ("nearest", (2, 3, 5), dict(scale_factor=1.7)),
    ("nearest", (1, 2, 5, 7), dict(size=(3, 14))),
    ("nearest", (1, 2, 3, 4, 2), dict(scale_factor=(2, 0.6, 1.5))),
    ("nearest-exact", (1, 2, 9, 13), dict(scale_factor=0.37, recompute_scale_factor=False)),
    ("linear", (2, 3, 7), dict(size=4, align_corners=True)),
    ("bilinear", (1, 2, 5, 6), dict(scale_factor=(2.3, 0.6), align_corners=False)),
    ("bilinear", (1, 2, 6, 5), dict(size=(100, 40), align_corners=True)),  # CPU's generic kernel
    ("bicubic", (1, 2, 5, 6), dict(scale_factor=1.7, align_corners=False, recompute_scale_factor=False)),
    ("trilinear", (1, 2, 3, 4, 5), dict(scale_factor=(1.5, 0.5, 2), align_corners=False)),
]


@pytest.mark.parametrize("mode,shape,kw", INTERP)
def test_interpolate(mode, shape, kw):
    check(lambda x: F.interpolate(x, mode=mode, **kw), r(*shape))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_interpolate_dtypes(dtype):
    check(lambda x: F.interpolate(x, size=7, mode="nearest-exact"), r(2, 2, 4, dtype=dtype))
    check(lambda x: F.interpolate(x, size=(9, 11), mode="bilinear", align_corners=True), r(1, 2, 5, 6, dtype=dtype))
    check(lambda x: F.interpolate(x, size=(3, 11), mode="bicubic", align_corners=True), r(1, 2, 5, 6, dtype=dtype))


def test_interpolate_antialias():
    check(lambda x: F.interpolate(x, size=(4, 5), mode="bilinear", antialias=True), r(1, 2, 13, 17))
    check(lambda x: F.interpolate(x, scale_factor=1.5, mode="bicubic", antialias=True),
          r(1, 2, 5, 6, dtype=torch.float64))


def test_interpolate_layouts_uint8_empty_nan():
    x = r(2, 5, 6, 7).detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    check(lambda x: F.interpolate(x, size=(4, 9), mode="bilinear"), x)     # CPU's channels-last kernel
    u8 = torch.randint(0, 255, (1, 3, 5, 7), dtype=torch.uint8)
    check(lambda x: F.interpolate(x, scale_factor=1.5, mode="nearest"), u8)
    check(lambda x: F.interpolate(x, size=(4, 9), mode="nearest-exact"), u8)
    check(lambda x: F.interpolate(x, size=(6, 9), mode="bilinear"), r(0, 3, 5, 7))
    x = torch.randn(1, 1, 4, 4)
    x[0, 0, 1, 2] = float("nan")
    x[0, 0, 3, 0] = float("inf")
    check(lambda x: F.interpolate(x, size=(7, 5), mode="bilinear"), x)   # NaN/inf stay in their taps


def test_interpolate_errors():
    tpu = torch.device("tpu")
    for mode in ("nearest", "bilinear"):
        with pytest.raises(NotImplementedError, match="Long"):
            F.interpolate(torch.ones(1, 1, 4, 4, dtype=torch.int64, device=tpu), scale_factor=2, mode=mode)


# -- pooling ----------------------------------------------------------------------------------------
def test_max_pool3d():
    check(lambda x: F.max_pool3d(x, 2, return_indices=True), r(1, 2, 4, 5, 6, dtype=torch.bfloat16))
    check(lambda x: F.max_pool3d(x, (2, 3, 2), (1, 2, 1), (1, 1, 0), (1, 1, 2), ceil_mode=True,
                                 return_indices=True), r(2, 5, 6, 7))


def test_max_pool3d_ties_nan_ints():
    x = torch.zeros(1, 1, 2, 2, 4)
    x[0, 0, 0, 0, 1] = x[0, 0, 1, 1, 0] = float("nan")
    check(lambda x: F.max_pool3d(x, 2, return_indices=True), x)
    check(lambda x: F.max_pool3d(x, 2, 1, 1, return_indices=True), torch.randint(0, 3, (1, 2, 3, 4, 4)))
    check(lambda x: F.max_pool3d(x, 3, 2, 1, return_indices=True), torch.full((1, 1, 3, 4, 4), float("-inf")))


def test_avg_pool3d():
    check(lambda x: F.avg_pool3d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), r(1, 2, 5, 6, 7))
    check(lambda x: F.avg_pool3d(x, (2, 3, 2), (1, 2, 1), (1, 1, 0), divisor_override=5),
          r(2, 5, 6, 7, dtype=torch.float64))


def test_avg_pool3d_long_and_errors():
    check(lambda x: F.avg_pool3d(x, 2, 1, 1), torch.randint(-9, 9, (1, 2, 3, 4, 4)))
    with pytest.raises(NotImplementedError, match="Int"):
        F.avg_pool3d(torch.ones(1, 1, 2, 2, 2, dtype=torch.int32, device="tpu"), 2)


def test_adaptive_pools():
    check(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 4)), r(1, 2, 5, 7, 6, dtype=torch.bfloat16))
    check(lambda x: F.adaptive_avg_pool1d(x, 4), r(2, 3, 7))
    check(lambda x: F.adaptive_max_pool2d(x, (5, 3), return_indices=True), r(1, 2, 3, 7))
    check(lambda x: F.adaptive_max_pool3d(x, (2, 3, 2), return_indices=True), r(1, 2, 5, 7, 3, dtype=torch.bfloat16))


def test_adaptive_pools_nan_inf_empty():
    x = torch.tensor([[[1., float("nan"), 3., float("nan"), 2., -1.], [float("-inf")] * 6,
                       [1., 1., 2., 2., 0., 0.]]])
    check(lambda x: F.adaptive_max_pool1d(x, 4, return_indices=True), x)   # last NaN, first tie
    x = torch.randn(1, 1, 4, 4)
    x[0, 0, 1, 1] = float("inf")
    check(lambda x: F.adaptive_avg_pool2d(x, (3, 3)), x)                    # inf only in its windows
    check(lambda x: F.adaptive_avg_pool3d(x, 2), r(0, 2, 3, 4, 4))
    check(lambda x: F.adaptive_max_pool3d(x, 1), r(2, 3, 4, 2))


# -- padding ----------------------------------------------------------------------------------------
PADS = [((2, 3, 5), (-1, 3)), ((2, 4, 5), (-2, 1, 2, -1)), ((1, 2, 3, 4, 5), (1, 2, 0, 1, 2, 1))]


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("shape,pad", PADS)
def test_pad(mode, shape, pad):
    check(lambda x: F.pad(x, pad, mode=mode), r(*shape))


def test_pad_dtypes():
    check(lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect"), torch.randint(-9, 9, (2, 3, 4, 5)))
    check(lambda x: F.pad(x, (1, 2), mode="replicate"), torch.randn(2, 3, 4, dtype=torch.complex64))


def test_pad_errors():
    with pytest.raises(RuntimeError):
        F.pad(torch.ones(1, 2, 3, device="tpu"), (3, 0), mode="reflect")   # pad >= input size


# -- grid sampling ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode,align_corners", [("zeros", False), ("reflection", True)])
def test_grid_sample_2d(mode, padding_mode, align_corners):
    g = (torch.rand(2, 3, 2, 2) * 2.6 - 1.3).requires_grad_()
    check(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding_mode, align_corners=align_corners),
          r(2, 3, 4, 5), g)


@pytest.mark.parametrize("mode,padding_mode", [("bilinear", "border"), ("nearest", "reflection")])
def test_grid_sample_3d(mode, padding_mode):
    g = (torch.rand(1, 3, 2, 2, 3, dtype=torch.float64) * 2.6 - 1.3).requires_grad_()
    check(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding_mode, align_corners=False),
          r(1, 2, 4, 5, 3, dtype=torch.float64), g)


def test_grid_sample_input_grad_only_and_empty():
    check(lambda x, g: F.grid_sample(x, g, align_corners=True), r(1, 3, 4, 5), torch.rand(1, 3, 2, 2) * 2 - 1)
    check(lambda x, g: F.grid_sample(x, g, align_corners=False), r(0, 3, 4, 5), torch.rand(0, 3, 2, 2))


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_uint8_resampling_runs_through_the_counted_cpu_fallback(mode, monkeypatch):
    """CPU's uint8 2-d resampling has its own fixed-point arithmetic; the lowering declines it
    (NotLowered), so it runs on the CPU kernel, counted, and is refused when the fallback is off."""
    x = torch.randint(0, 256, (1, 3, 5, 7), dtype=torch.uint8)
    f = lambda t: torch.nn.functional.interpolate(t, size=(8, 9), mode=mode, align_corners=False)
    before = torch_tpu.metrics.fallback_counts().get(f"aten::upsample_{mode}2d", 0)
    got = f(x.to("tpu"))
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), f(x))
    assert torch_tpu.metrics.fallback_counts()[f"aten::upsample_{mode}2d"] == before + 1
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "0")
    with pytest.raises(NotImplementedError, match=f"upsample_{mode}2d"):
        f(x.to("tpu"))
