"""Complex numbers on tpu: real/complex views, the lazy conj / neg bits, complex / polar / angle,
FFT (_fft_c2c, _fft_r2c, _fft_c2r and every torch.fft function on them, with gradients), stft /
istft, complex random numbers, and the complex32 error. Each result is compared with CPU's, and
none may use the CPU fallback."""
import math

import pytest
import torch

import torch_tpu
from helpers import TPU, check, to_tpu

C64, C128 = torch.complex64, torch.complex128


def z(*shape, dtype=C64, grad=False):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def r(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def _fallbacks():
    return sum(torch_tpu.metrics.fallback_counts().values())


def check_c(fn, *args, tol=None):
    """Like helpers.check for ops with complex results: compares values and the gradients of
    Re(sum(out * w)) for fixed random complex weights w, with no CPU fallback."""
    before = _fallbacks()
    cpu = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
    dev = [to_tpu(a) for a in args]
    oc, ot = fn(*cpu), fn(*dev)
    assert ot.device.type == "tpu" and ot.dtype == oc.dtype and ot.shape == oc.shape
    kw = dict(atol=tol, rtol=tol) if tol is not None else {}
    torch.testing.assert_close(ot.detach().cpu(), oc.detach(), equal_nan=True, **kw)
    need = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    if need:
        w = torch.randn(oc.shape, dtype=oc.dtype, generator=torch.Generator().manual_seed(0))
        loss = lambda o, w: (o * w).real.sum() if o.is_complex() else (o * w).sum()  # noqa: E731
        gc = torch.autograd.grad(loss(oc, w), [cpu[i] for i in need])
        gt = torch.autograd.grad(loss(ot, w.to(TPU)), [dev[i] for i in need])
        for c, t in zip(gc, gt):
            torch.testing.assert_close(t.cpu(), c, **kw)
    assert _fallbacks() == before, f"CPU fallback used: {torch_tpu.metrics.fallback_counts()}"
    return ot


# -- views -------------------------------------------------------------------------------------------
def test_view_as_real_is_a_view():
    x = z(3, 4)
    t = x.to(TPU)
    v = torch.view_as_real(t)
    cv = torch.view_as_real(x)
    assert (v.dtype, v.shape, v.stride(), v.storage_offset()) == (cv.dtype, cv.shape, cv.stride(), cv.storage_offset())
    assert v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    torch.testing.assert_close(v.cpu(), cv, rtol=0, atol=0)
    s = t[1:, ::2]  # offset and strides double in the float view
    assert torch.view_as_real(s).storage_offset() == 2 * s.storage_offset()
    torch.testing.assert_close(torch.view_as_real(s).cpu(), torch.view_as_real(x[1:, ::2]), rtol=0, atol=0)
    v[..., 1].mul_(-1)  # a write through the float view is seen by the complex tensor
    torch.testing.assert_close(t.cpu(), x.conj().resolve_conj(), rtol=0, atol=0)
    back = torch.view_as_complex(v)
    assert back.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    torch.testing.assert_close(back.cpu(), x.conj().resolve_conj(), rtol=0, atol=0)


def test_real_imag_views():
    x = z(4, 3)
    t = x.to(TPU)
    torch.testing.assert_close(t.real.cpu(), x.real, rtol=0, atol=0)
    torch.testing.assert_close(t[:, 1:].imag.cpu(), x[:, 1:].imag, rtol=0, atol=0)
    t.imag[::2].fill_(7.0)
    x.imag[::2].fill_(7.0)
    torch.testing.assert_close(t.cpu(), x, rtol=0, atol=0)
    check(lambda a: torch.view_as_real(a[0, 0]) * 2, x)  # 0-dim complex -> shape (2,)
    check(lambda a: torch.view_as_complex(a) + 1, r(2))  # (2,) -> 0-dim complex
    check(lambda a: torch.view_as_complex(a.reshape(3, 2)) * 1j, r(6, grad=True))


def test_view_errors():
    t = z(3).to(TPU)
    with pytest.raises(RuntimeError, match="conjugated"):
        torch.view_as_real(t.conj())
    with pytest.raises(RuntimeError):
        torch.view_as_complex(r(3, 3).to(TPU))  # last dim not of size 2
    with pytest.raises(RuntimeError):
        torch.view_as_complex(r(2, 3).to(TPU).T)  # last dim not contiguous


# -- the conj and neg bits -----------------------------------------------------------------------------
CONJ_CASES = {
    "clone": lambda a: a.conj().clone(),
    "contiguous": lambda a: a.conj().T.contiguous(),
    "mH_mm": lambda a: a.mH @ a,
    "vdot": lambda a: torch.vdot(a[0], a[1]),
    "dot_conj": lambda a: torch.dot(a[0].conj(), a[1].conj()),
    "add": lambda a: a.conj() + a,
    "neg_view": lambda a: a.conj().imag * 2,
    "resolve_neg": lambda a: a.conj().imag.resolve_neg(),
    "copy_into_conj": lambda a: (lambda o: (a.conj().copy_(o), a)[1])(a * 2),
    "mul_conj_view": lambda a: (a.conj().mul_(2j), a)[1],
    "add_neg_view": lambda a: (a.conj().imag.add_(1.5), a)[1],
}


@pytest.mark.parametrize("case", list(CONJ_CASES))
def test_conj_bits(case):
    check(CONJ_CASES[case], z(3, 3), grad=False)


def test_conj_transfers():
    x = z(5)
    torch.testing.assert_close(x.to(TPU).conj().cpu(), x.conj(), rtol=0, atol=0)
    torch.testing.assert_close(x.conj().to(TPU).cpu(), x.conj(), rtol=0, atol=0)  # a conj CPU tensor uploaded
    torch.testing.assert_close(x.to(TPU).conj().imag.cpu(), x.conj().imag, rtol=0, atol=0)
    h = torch.empty(5, dtype=C64).conj()
    h.copy_(x.to(TPU))  # into a conj CPU view
    torch.testing.assert_close(h.resolve_conj(), x, rtol=0, atol=0)


def test_conj_grads():
    check_c(lambda a: a.conj() * a.mH.T, z(3, 2, grad=True))
    check_c(lambda a: torch.vdot(a, a.flip(0)), z(4, grad=True))


# -- complex, polar, angle, sgn, abs -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_complex_polar(dtype):
    check_c(torch.complex, r(3, 1, dtype=dtype, grad=True), r(4, dtype=dtype, grad=True))
    check_c(torch.polar, r(3, 4, dtype=dtype).abs().requires_grad_(), r(3, 4, dtype=dtype, grad=True))
    check_c(torch.complex, r(0, 3, dtype=dtype), r(0, 3, dtype=dtype))
    nan, inf = float("nan"), float("inf")
    check_c(torch.polar, torch.tensor([1.0, nan, 2.0, inf], dtype=dtype), torch.tensor([0.5, 1.0, nan, 0.0], dtype=dtype))


def test_complex_polar_errors():
    for fn in (torch.complex, torch.polar):
        for a, b in ((r(3), r(3, dtype=torch.float64)), (torch.ones(3, dtype=torch.int64),) * 2):
            with pytest.raises(RuntimeError) as cpu_err:
                fn(a, b)
            with pytest.raises(RuntimeError) as tpu_err:
                fn(a.to(TPU), b.to(TPU))
            assert str(tpu_err.value) == str(cpu_err.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool, C64, C128])
def test_angle(dtype):
    x = torch.tensor([1.0, -2.0, 0.0, -0.0, 3.5, -0.25]).to(dtype)
    if dtype.is_complex:
        x = x + 1j * torch.tensor([0.0, 1.0, -0.0, 0.0, -2.0, 0.0]).to(dtype)
    check_c(torch.angle, x.requires_grad_(dtype.is_floating_point or dtype.is_complex))


def test_angle_nan_and_sgn():
    nan, inf = float("nan"), float("inf")
    check(torch.angle, torch.tensor([nan, -inf, inf, -1.0]))
    check(torch.sgn, r(5, grad=True))  # its zero gradient (an _efficientzerotensor) stays on tpu
    check_c(torch.sgn, torch.tensor([1 + 1j, 0j, -3j, complex(nan, 1)], dtype=C64))
    check_c(torch.sgn, z(4, grad=True))
    check_c(torch.abs, z(4, grad=True))
    check_c(torch.isreal, torch.tensor([1 + 0j, 1j, complex(0, -0.0)]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
def test_casts_to_complex(dtype):
    x = torch.tensor([1.5, -2.0, 0.0, 3.0]).to(dtype)
    check_c(torch.Tensor.cfloat, x.requires_grad_(dtype.is_floating_point))
    check_c(torch.Tensor.cdouble, x.detach())


def test_complex32_is_refused():
    with pytest.raises(TypeError, match="complex32.*complex64"):
        r(3).to(TPU).chalf()
    with pytest.raises(TypeError, match="complex32"):
        torch.complex(r(3, dtype=torch.float16).to(TPU), r(3, dtype=torch.float16).to(TPU))


# -- FFT ---------------------------------------------------------------------------------------------
FFT_CASES = {
    "fft": (lambda a: torch.fft.fft(a), "c"),
    "fft_n_pad": (lambda a: torch.fft.fft(a, n=7, dim=0, norm="ortho"), "c"),
    "fft_n_trim": (lambda a: torch.fft.fft(a, n=2, norm="forward"), "c"),
    "ifft_ortho": (lambda a: torch.fft.ifft(a, norm="ortho"), "c"),
    "fft2": (lambda a: torch.fft.fft2(a), "c"),
    "ifftn_forward": (lambda a: torch.fft.ifftn(a, norm="forward"), "c"),
    "rfft": (lambda a: torch.fft.rfft(a), "r"),
    "rfft_odd_n": (lambda a: torch.fft.rfft(a, n=5, norm="forward"), "r"),
    "rfft2": (lambda a: torch.fft.rfft2(a, norm="ortho"), "r"),
    "irfft_n": (lambda a: torch.fft.irfft(a, n=9, norm="ortho"), "c"),
    "irfftn": (lambda a: torch.fft.irfftn(a, s=(3, 6)), "c"),
    "hfft": (lambda a: torch.fft.hfft(a, norm="forward"), "c"),
    "ihfft": (lambda a: torch.fft.ihfft(a), "r"),
    "ihfftn": (lambda a: torch.fft.ihfftn(a, norm="ortho"), "r"),
    "noncontiguous": (lambda a: torch.fft.fft(a.T[::2], dim=0), "c"),
    "fftshift": (lambda a: torch.fft.fftshift(torch.fft.fft2(a)), "c"),
}


@pytest.mark.parametrize("case", list(FFT_CASES))
def test_fft(case):
    fn, kind = FFT_CASES[case]
    x = z(3, 4, grad=True) if kind == "c" else r(3, 4, grad=True)
    check_c(fn, x, tol=1e-4)


@pytest.mark.parametrize("fn", [torch.fft.fftn, torch.fft.rfftn, torch.fft.irfftn, torch.fft.ifftn])
def test_fft_more_than_three_dims(fn):
    # stablehlo.fft transforms at most three dims: the rest go in further passes
    x = z(2, 3, 2, 3, 4, grad=True) if fn is not torch.fft.rfftn else r(2, 3, 2, 3, 4, grad=True)
    check_c(fn, x, tol=1e-4)


def test_fft_float64_and_edges():
    check_c(torch.fft.fftn, z(3, 4, dtype=C128, grad=True), tol=1e-10)
    check_c(torch.fft.irfft2, z(3, 4, dtype=C128, grad=True), tol=1e-10)
    check_c(torch.fft.rfft, r(6, dtype=torch.float64, grad=True), tol=1e-10)
    check_c(torch.fft.rfft, torch.arange(6))  # integers: promoted to float
    check_c(torch.fft.fft, torch.tensor([1.0, float("nan"), 2.0, 3.0]))
    check_c(lambda a: torch.fft.fft(a, dim=0), z(1, 3))
    check_c(lambda a: torch.ops.aten._fft_r2c(a, [0, 1], 1, False), r(3, 4))  # the two-sided spectrum
    out = torch.empty(3, 4, dtype=C64, device=TPU)
    x = z(3, 4)
    torch.fft.fft(x.to(TPU), out=out)
    torch.testing.assert_close(out.cpu(), torch.fft.fft(x), atol=1e-4, rtol=1e-4)
    with pytest.raises(RuntimeError):
        torch.fft.fft(z(4).to(TPU), n=0)
    with pytest.raises(IndexError):
        torch.fft.fft(torch.tensor(1j).to(TPU))
    assert torch.fft.fft(z(0, 4).to(TPU)).shape == (0, 4)  # an empty batch (CPU's MKL refuses it)


def test_stft_istft():
    win = torch.hann_window(8)
    check_c(lambda a, w: torch.stft(a, 8, hop_length=2, window=w, return_complex=True), r(2, 40, grad=True), win,
            tol=1e-4)
    check_c(lambda a, w: torch.stft(a, 8, hop_length=3, window=w, center=False, onesided=False,
                                    return_complex=True), z(40), win, tol=1e-4)
    spec = torch.stft(r(40), 8, hop_length=2, window=win, return_complex=True)
    check_c(lambda s, w: torch.istft(s, 8, hop_length=2, window=w), spec, win, tol=1e-4)


# -- random ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [C64, C128])
def test_random_complex(dtype):
    before = _fallbacks()
    torch.manual_seed(0)
    x = torch.randn(20000, dtype=dtype, device=TPU).cpu()
    assert x.dtype == dtype
    # each part N(0, 1/2), independent: E|z|^2 = 1
    assert abs(x.real.mean()) < 0.03 and abs(x.imag.mean()) < 0.03
    assert abs(x.real.var() - 0.5) < 0.03 and abs(x.imag.var() - 0.5) < 0.03
    assert abs(torch.corrcoef(torch.stack([x.real, x.imag]))[0, 1]) < 0.04
    assert math.isfinite(float(x.abs().max()))
    u = torch.rand(20000, dtype=dtype, device=TPU).cpu()
    for p in (u.real, u.imag):
        assert 0 <= p.min() and p.max() < 1 and abs(p.mean() - 0.5) < 0.015
    assert abs(torch.corrcoef(torch.stack([u.real, u.imag]))[0, 1]) < 0.04
    n = torch.randn_like(torch.empty(20000, dtype=dtype, device=TPU)).mul_(4).add_(2 + 2j).cpu()
    assert n.dtype == dtype and abs(n.mean() - (2 + 2j)) < 0.15 and abs((n - n.mean()).abs().pow(2).mean() - 16) < 1
    torch.manual_seed(1)
    a = torch.randn(20000, dtype=dtype, device=TPU).cpu()
    torch.manual_seed(1)
    assert torch.equal(torch.randn(20000, dtype=dtype, device=TPU).cpu(), a)  # reproducible
    b = torch.randn(20000, dtype=dtype, device=TPU).cpu()  # fresh draws, uncorrelated with the last ones
    assert abs(torch.corrcoef(torch.stack([a.real, a.imag, b.real, b.imag])).triu(1)).max() < 0.04
    assert _fallbacks() == before
