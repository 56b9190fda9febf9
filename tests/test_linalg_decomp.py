"""torch.linalg decompositions and solvers on tpu vs CPU: Cholesky, triangular solves, LU and what is
built on it, matrix_exp, Householder QR; values, info codes, errors and gradients."""
import pytest
import torch

from helpers import check

DTYPES = [torch.float32, torch.float64, torch.complex64]


def rand(*shape, dtype=torch.float64, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    if dtype.is_complex:
        x = torch.complex(x, torch.randn(*shape, generator=g, dtype=torch.float64))
    return x.to(dtype).requires_grad_(grad and not dtype.is_complex)


def spd(*shape, dtype=torch.float64, grad=False):
    a = rand(*shape, dtype=dtype)
    a = a @ a.mH + shape[-1] * torch.eye(shape[-1], dtype=dtype)
    return a.detach().requires_grad_(grad and not dtype.is_complex)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(dtype):
    """One factorization of each kind per dtype (complex: values only)."""
    a = rand(2, 4, 4, dtype=dtype, grad=True)
    check(torch.linalg.cholesky, spd(4, 4, dtype=dtype, grad=True))
    check(torch.linalg.solve, a, rand(2, 4, 2, dtype=dtype, grad=True, seed=1))
    check(torch.geqrf, rand(5, 3, dtype=dtype))


def test_cholesky_family():
    dtype = torch.float64
    a = spd(2, 4, 4, dtype=dtype, grad=True)
    check(lambda x: torch.linalg.cholesky(x, upper=True), a)
    check(torch.linalg.cholesky_ex, a, grad=False)
    low = torch.linalg.cholesky(a).detach().requires_grad_(not dtype.is_complex)
    bb = rand(2, 4, 3, dtype=dtype, grad=True)
    check(torch.cholesky_solve, bb, low)
    check(lambda x, f: torch.cholesky_solve(x, f, upper=True), bb, low.mH.detach(), grad=False)
    check(torch.cholesky_inverse, low[0].detach())


def test_cholesky_not_positive_definite():
    # info is the order of the first bad leading minor; L holds LAPACK's partial factorization
    a = torch.tensor([[[4.0, 2, 0], [2, 1, 0], [0, 0, 1]], [[1.0, 0, 0], [0, 2, 0], [0, 0, -3]]])
    check(torch.linalg.cholesky_ex, a, grad=False)
    check(lambda x: torch.linalg.cholesky_ex(x, upper=True), a, grad=False)
    nan = torch.tensor([[1.0, 0], [0, float("nan")]])
    check(torch.linalg.cholesky_ex, nan, grad=False)
    for fn in (torch.linalg.cholesky, lambda x: torch.linalg.cholesky_ex(x, check_errors=True), torch.cholesky):
        with pytest.raises(torch.linalg.LinAlgError, match="leading minor of order 2"):
            fn(a.to("tpu"))


def test_triangular():
    dtype = torch.float32
    a = rand(2, 4, 4, dtype=dtype, grad=True) + 4 * torch.eye(4, dtype=dtype)
    a = a.detach().requires_grad_(not dtype.is_complex)
    bb = rand(4, 3, dtype=dtype, grad=True, seed=1)  # broadcast over a's batch
    check(lambda x, y: torch.linalg.solve_triangular(x, y, upper=True), a, bb)
    check(lambda x, y: torch.linalg.solve_triangular(x, y.mT, upper=False, left=False, unitriangular=True),
          a, bb, grad=False)
    check(lambda y, x: torch.triangular_solve(y, x, upper=False, transpose=True), bb, a, grad=False)


@pytest.mark.slow
def test_lu_family():
    dtype = torch.float64
    a = rand(2, 4, 4, dtype=dtype, grad=True)
    check(torch.linalg.lu_factor_ex, a, grad=False)
    check(torch.linalg.lu, a)
    check(torch.linalg.lu_factor, rand(3, 5, dtype=dtype), grad=False)
    lu, piv = torch.linalg.lu_factor(a.detach())
    check(torch.lu_unpack, lu, piv)
    bb = rand(2, 4, 2, dtype=dtype, grad=True, seed=2)
    check(lambda l, p, y: torch.linalg.lu_solve(l, p, y, adjoint=True), lu, piv, bb, grad=False)
    check(torch.linalg.solve, a, bb[..., 0])            # batch of vectors
    check(torch.linalg.solve, a[0], bb[0, :, 0], grad=False)        # one vector
    check(lambda x, y: torch.linalg.solve(x, y, left=False), a, bb.mT, grad=False)
    check(torch.linalg.inv, a)
    check(torch.linalg.det, a)
    check(torch.linalg.slogdet, a, grad=False)
    check(torch.linalg.matrix_exp, a)


def test_lu_pivot_choice_and_singular():
    # ties in |a| pick the first row; zero pivots give info and keep going (LAPACK's getf2)
    a = torch.tensor([[1.0, 2, 3], [-1, 0, 2], [1, 5, 1]])
    check(torch.linalg.lu_factor_ex, a, grad=False)
    s = torch.tensor([[[0.0, 0, 1], [0, 0, 2], [1, 2, 3]], [[1.0, 2, 3], [2, 4, 6], [0, 0, 0]]])
    check(torch.linalg.lu_factor_ex, s, grad=False)
    check(torch.linalg.det, s, grad=False)
    check(torch.linalg.slogdet, s, grad=False)
    check(torch.linalg.inv_ex, torch.eye(3)[None].repeat(2, 1, 1), grad=False)
    info = torch.linalg.inv_ex(s.to("tpu")).info
    assert info.tolist() == [2, 2]
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        torch.linalg.inv(s.to("tpu"))
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        torch.linalg.solve(s[0].to("tpu"), torch.ones(3, device="tpu"))
    with pytest.raises(RuntimeError, match="is zero"):
        torch.linalg.lu_factor(s[0].to("tpu"))


def test_empty_and_noncontiguous():
    check(torch.linalg.det, torch.zeros(2, 0, 0), grad=False)
    check(torch.linalg.inv, torch.zeros(0, 3, 3), grad=False)
    check(torch.linalg.cholesky, torch.zeros(0, 0), grad=False)
    a = rand(4, 4, grad=True)
    check(lambda x: torch.linalg.inv(x.mT), a, grad=False)        # a transposed view
    check(lambda x: torch.linalg.det(x[::2, ::2]), a, grad=False)  # a strided view
    check(torch.linalg.matrix_exp, torch.zeros(3, 3), grad=False)
    check(torch.linalg.matrix_exp, 40 * torch.eye(2, dtype=torch.float64), grad=False)  # many squarings


def test_qr_family():
    dtype = torch.float32
    a = rand(2, 5, 3, dtype=dtype, grad=True)
    for mode in ("complete", "r"):  # (no gradient: 'complete' with more rows than columns has none)
        check(lambda x: torch.linalg.qr(x, mode=mode), a, grad=False)
    check(torch.linalg.qr, a.mT)
    v, tau = torch.geqrf(a.detach())
    check(torch.geqrf, a.detach())
    check(torch.linalg.householder_product, v, tau)
    c = rand(2, 5, 2, dtype=dtype, seed=3)
    for left in (True, False):
        for tr in (True, False):
            check(lambda x, t, y: torch.ormqr(x, t, y, left=left, transpose=tr), v, tau, c if left else c.mT)
    # a zero column below the diagonal: no reflection (tau = 0), as LAPACK
    check(torch.geqrf, torch.tensor([[2.0, 1], [0, 3], [0, 4]]), grad=False)
