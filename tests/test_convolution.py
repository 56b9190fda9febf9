import pytest
import torch
import torch.nn.functional as F

from helpers import check

FLOATS = [torch.float32, torch.bfloat16]


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).requires_grad_(dtype.is_floating_point)


def tol(dtype):
    # CPU's bfloat16 convolution rounds partial sums (its grad_input is further from the float64
    # result than ours), so bfloat16 gets a few units of bfloat16 rounding.
    return {} if dtype == torch.float32 else dict(atol=0.1, rtol=0.05)


@pytest.mark.parametrize("dtype", FLOATS)
def test_conv2d(dtype):
    check(lambda x, w, b: F.conv2d(x, w, b, padding=1), r(2, 3, 6, 6, dtype=dtype), r(4, 3, 3, 3, dtype=dtype),
          r(4, dtype=dtype), **tol(dtype))
    check(lambda x, w: F.conv2d(x, w, stride=2), r(1, 3, 7, 6, dtype=dtype), r(2, 3, 3, 2, dtype=dtype), **tol(dtype))
    check(lambda x, w: F.conv2d(x, w, stride=2, padding=(1, 2), dilation=(2, 1), groups=2),
          r(2, 4, 7, 8, dtype=dtype), r(6, 2, 3, 2, dtype=dtype), **tol(dtype))
    check(lambda x, w, b: F.conv2d(x, w, b, groups=4), r(1, 4, 5, 5, dtype=dtype), r(8, 1, 3, 3, dtype=dtype),
          r(8, dtype=dtype), **tol(dtype))  # depthwise


@pytest.mark.parametrize("dtype", FLOATS)
def test_conv1d_conv3d(dtype):
    check(lambda x, w, b: F.conv1d(x, w, b, stride=3), r(1, 2, 10, dtype=dtype), r(3, 2, 2, dtype=dtype),
          r(3, dtype=dtype), **tol(dtype))
    check(lambda x, w: F.conv3d(x, w, padding=1, stride=(1, 2, 1)), r(1, 2, 4, 4, 4, dtype=dtype),
          r(2, 2, 3, 3, 3, dtype=dtype), **tol(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_conv_transpose(dtype):
    check(lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
          r(2, 3, 4, 5, dtype=dtype), r(3, 4, 3, 3, dtype=dtype), r(4, dtype=dtype), **tol(dtype))
    check(lambda x, w: F.conv_transpose2d(x, w, stride=(2, 3), padding=(2, 0), groups=3, dilation=(1, 2)),
          r(1, 6, 4, 5, dtype=dtype), r(6, 2, 3, 3, dtype=dtype), **tol(dtype))
    check(lambda x, w: F.conv_transpose1d(x, w, padding=3), r(1, 2, 6, dtype=dtype), r(2, 2, 3, dtype=dtype),
          **tol(dtype))  # padding beyond the dilated kernel
    check(lambda x, w: F.conv_transpose2d(x, w, stride=2, output_padding=1, dilation=3),
          r(1, 2, 3, 3, dtype=dtype), r(2, 2, 2, 2, dtype=dtype), **tol(dtype))  # output_padding >= stride


@pytest.mark.parametrize("dtype", FLOATS)
def test_modules(dtype):
    torch.manual_seed(0)
    for mod in (torch.nn.Conv2d(3, 4, 3, stride=2, padding=1), torch.nn.Conv2d(4, 6, 3, groups=2, dilation=2),
                torch.nn.ConvTranspose2d(3, 2, 4, stride=2, padding=1)):
        mod = mod.to(dtype)
        names = [n for n, _ in mod.named_parameters()]
        params = [p.detach().requires_grad_() for _, p in mod.named_parameters()]
        x = r(2, mod.in_channels, 7, 7, dtype=dtype)
        check(lambda x, *ps: torch.func.functional_call(mod, dict(zip(names, ps)), (x,)), x, *params, **tol(dtype))


def test_partial_grads_and_layouts():
    check(F.conv2d, r(1, 3, 5, 5), torch.randn(4, 3, 3, 3))                      # grad_input only
    check(F.conv2d, torch.randn(1, 3, 5, 5), r(4, 3, 3, 3), r(4))                # grad_weight and bias
    check(lambda x, w: F.conv2d(x.permute(0, 3, 1, 2), w.transpose(2, 3)), r(2, 6, 6, 3), r(4, 3, 3, 3))
    check(lambda x, w: F.conv2d(x[:, :, ::2, 1:], w), r(1, 3, 9, 6), r(2, 3, 2, 2))
    check(lambda x, w: F.conv2d(x, w, padding=1), r(0, 3, 6, 6), r(4, 3, 3, 3))   # empty batch
    check(lambda x, w: F.conv2d(x, w), r(3, 6, 6), r(4, 3, 3, 3))                 # unbatched
    check(lambda x, w: F.conv2d(x, w, padding="same"), r(1, 3, 5, 5), r(2, 3, 3, 3))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer(dtype):
    check(lambda x, w: F.conv2d(x, w, padding=1), torch.randint(-3, 3, (1, 2, 5, 5), dtype=dtype),
          torch.randint(-3, 3, (2, 2, 2, 2), dtype=dtype))


def test_errors():
    tpu = torch.device("tpu")
    x = torch.ones(1, 2, 4, 4)
    cases = [(x, torch.ones(2, 2, 3, 3, dtype=torch.float64), {}),
             (x, torch.ones(3, 1, 3, 3), dict(groups=2)),
             (x, torch.ones(2, 2, 5, 5), {}),
             (x, torch.ones(2, 2, 3, 3), dict(bias=torch.ones(2, dtype=torch.float64)))]
    for a, w, kw in cases:
        with pytest.raises(RuntimeError) as cpu:
            F.conv2d(a, w, **kw)
        kw = {k: v.to(tpu) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        with pytest.raises(RuntimeError) as dev:
            F.conv2d(a.to(tpu), w.to(tpu), **kw)
        assert str(dev.value) == str(cpu.value)
    with pytest.raises(NotImplementedError, match="Bool"):
        F.conv2d(torch.ones(1, 2, 4, 4, dtype=torch.bool, device=tpu), torch.ones(2, 2, 3, 3, dtype=torch.bool,
                                                                                  device=tpu))
