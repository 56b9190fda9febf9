"""Special functions lowered natively (torch_tpu/lowering/special.py): values, dtypes, gradients and
edge cases against PyTorch's CPU kernels; `check` fails if any op went through the CPU fallback."""
import math

import pytest
import torch

from helpers import check

EDGES = [0.0, -0.0, 1e-6, 0.5, 1.0, 2.5, 7.9, 8.5, 30.0, -0.5, -1.0, -2.5, -3.7, -9.0, math.inf, -math.inf, math.nan]


def edges(dtype=torch.float32):
    return torch.tensor(EDGES, dtype=dtype)


UNARY = [torch.special.i0e, torch.special.i1, torch.special.i1e, torch.i0, torch.special.erfcx,
         torch.special.log_ndtr, torch.special.bessel_j0, torch.special.bessel_j1, torch.special.bessel_y0,
         torch.special.bessel_y1, torch.special.modified_bessel_i0, torch.special.modified_bessel_i1,
         torch.special.modified_bessel_k0, torch.special.modified_bessel_k1,
         torch.special.scaled_modified_bessel_k0, torch.special.scaled_modified_bessel_k1,
         torch.special.spherical_bessel_j0, torch.special.airy_ai, torch.special.ndtri, torch.erfc]


# float64 takes different constants (split points, machine epsilon) in these
F64 = {torch.special.i0e, torch.special.erfcx, torch.special.log_ndtr, torch.special.ndtri, torch.special.airy_ai,
       torch.special.bessel_y1, torch.special.modified_bessel_k0}


@pytest.mark.parametrize("fn", UNARY, ids=lambda f: f.__name__)
def test_unary_edges(fn):
    check(fn, edges())
    if fn in F64:
        check(fn, edges(torch.float64))


@pytest.mark.parametrize("fn", [torch.special.i0e, torch.special.i1], ids=lambda f: f.__name__)
def test_bessel_i_grad_half_and_int(fn):
    check(fn, (torch.linspace(-12, 12, 13)).requires_grad_())
    check(fn, torch.linspace(-12, 12, 13, dtype=torch.bfloat16))
    check(fn, torch.arange(-5, 6))  # integers compute in the default float dtype


@pytest.mark.parametrize("n", [0, 1, 3])
def test_polygamma(n):
    x = torch.tensor([0.3, 1.0, 2.5, 7.0, 20.0, -0.5, -2.5, 0.0, math.nan])
    # float32 for x > 0: CPU sums zeta(n + 1, x) in double, so the cancelling terms of a negative x
    # are only compared in float64
    check(lambda t: torch.polygamma(n, t), x[:5].clone().requires_grad_())
    check(lambda t: torch.polygamma(n, t), x.double().requires_grad_())


def test_digamma_grad_and_special_polygamma():
    x = torch.tensor([[0.4, 1.5], [3.0, 11.0]]).requires_grad_()
    check(torch.digamma, x)
    check(lambda t: torch.special.polygamma(2, t), x.detach().double())


def test_zeta():
    x = torch.tensor([1.0, 0.5, 2.0, 3.0, 4.5, 2.0, 3.0, 50.0])
    q = torch.tensor([1.0, 1.0, 0.0, -1.0, 2.0, -1.5, 1e-3, 1e9])
    check(torch.special.zeta, x, q)
    check(torch.special.zeta, x.double(), q.double())
    check(lambda q: torch.special.zeta(2.0, q), torch.tensor([0.5, 1.0, 3.0]))
    check(lambda x: torch.special.zeta(x, 2.0), torch.tensor([1.5, 2.0, 3.0]))


def test_igamma():
    a = torch.tensor([0.0, 0.5, 1.0, 2.5, 25.0, 25.0, 300.0, 3.0, -1.0, math.inf, 1.0])
    x = torch.tensor([1.0, 0.2, 1.05, 9.0, 24.0, 30.0, 310.0, 0.0, 1.0, 2.0, math.nan])
    check(torch.igamma, a, x)
    check(torch.igammac, a.double(), x.double())


def test_nextafter_frexp_hypot():
    v = torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-40, 3.4e38, math.inf, -math.inf, math.nan, 2.5])
    a, b = torch.meshgrid(v, v, indexing="ij")
    for dt in (torch.float32, torch.float16):
        check(torch.nextafter, a.to(dt), b.to(dt))
    check(torch.frexp, v)  # a subnormal included
    check(torch.frexp, v.double())
    check(torch.hypot, a, b)
    check(torch.hypot, torch.tensor([3.0, 1e30]).requires_grad_(), torch.tensor([4.0, 1e30]).requires_grad_())


@pytest.mark.parametrize("fn", [torch.nn.functional.softshrink, torch.nn.functional.hardshrink],
                         ids=["softshrink", "hardshrink"])
def test_shrink(fn):
    x = torch.tensor([-2.0, -0.5, -0.3, 0.0, 0.3, 0.5, 2.0, math.nan]).requires_grad_()
    check(fn, x)
    check(lambda t: fn(t, 1.0), x.detach().to(torch.bfloat16).requires_grad_())


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.int16])
def test_gcd_lcm_shifts(dtype):
    v = torch.tensor([0, 1, 12, 18, -12, 7, 100, -1], dtype=torch.int64)
    v = v.clamp(min=0).to(dtype) if dtype == torch.uint8 else v.to(dtype)
    a, b = torch.meshgrid(v, v, indexing="ij")
    check(torch.gcd, a, b)
    check(torch.lcm, a, b)
    bits = torch.iinfo(dtype).bits
    s = torch.tensor([0, 1, 3, bits - 1, bits, bits + 1, -1, -3], dtype=torch.int64)
    s = s.clamp(min=0).to(dtype) if dtype == torch.uint8 else s.to(dtype)
    a, s = torch.meshgrid(v, s, indexing="ij")
    check(torch.bitwise_left_shift, a, s)
    check(torch.bitwise_right_shift, a, s)
    check(lambda t: t << 2, v)
    check(lambda t: torch.bitwise_right_shift(t, 1), v.t() if v.dim() == 2 else v)


POLYS = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
         "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
         "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
         "laguerre_polynomial_l", "legendre_polynomial_p"]


@pytest.mark.parametrize("name", POLYS)
def test_polynomials(name):
    fn = getattr(torch.special, name)
    x = torch.tensor([-2.0, -1.0, -0.7, 0.0, 0.3, 0.5, 1.0, 1.5, math.nan])
    n = torch.tensor([-1.0, 0, 1, 2, 3, 5, 7, 10, 2.5, 140, math.nan])
    xs, ns = torch.meshgrid(x, n, indexing="ij")
    check(fn, xs.double(), ns.double())
    check(lambda t: fn(t, 3), x[:-1])  # float32, n a Scalar (CPU leaves U, V, W of a NaN x uninitialized)


@pytest.mark.parametrize("name", ["chebyshev_polynomial_t", "hermite_polynomial_h"])
def test_polynomials_layouts(name):
    fn = getattr(torch.special, name)
    xs, ns = torch.meshgrid(torch.linspace(-1.5, 1.5, 7), torch.arange(12.0), indexing="ij")
    check(fn, xs[:, ::2], ns[:, ::2])  # non-contiguous float32
    check(fn, torch.arange(-2, 3), torch.arange(5))  # integers: float32 result


def test_shapes():
    check(torch.special.i1e, torch.tensor(2.5))  # 0-dim
    check(torch.special.i1e, torch.empty(0, 3))
    check(torch.special.bessel_j0, torch.randn(4, 6)[:, ::2] * 10)  # non-contiguous
    check(torch.special.zeta, torch.full((2, 3), 2.0), torch.tensor([1.0, 2.0, 3.0]))  # broadcasting
    check(torch.gcd, torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64))


def test_errors():
    x = torch.tensor([1.0, 2.0])
    with pytest.raises(RuntimeError):
        torch.polygamma(-1, x.to("tpu"))
    for fn in (torch.gcd, torch.bitwise_left_shift):
        with pytest.raises(Exception) as cpu_err:
            fn(x, x)
        with pytest.raises(type(cpu_err.value)):
            fn(x.to("tpu"), x.to("tpu"))
