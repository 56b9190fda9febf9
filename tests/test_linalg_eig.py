"""Jacobi eigh / svd lowerings (torch_tpu/lowering/linalg_eig.py) and the ops built on them, against
CPU. Eigen/singular vectors are unique only up to a per-column sign/phase (PyTorch's docs), so
vector outputs are compared through gauge-invariant functions (|V|, U @ Vh, reconstructions)."""
import pytest
import torch

from tests.helpers import TPU, check

torch.manual_seed(0)


def _mat(shape, dtype, grad=False):
    x = torch.randn(shape, dtype=dtype)
    return x.requires_grad_() if grad else x


@pytest.mark.parametrize("dtype,uplo", [(torch.float32, "L"), (torch.float64, "U"), (torch.complex64, "U")])
def test_eigh(dtype, uplo):
    def fn(a):
        w, v = torch.linalg.eigh(a, UPLO=uplo)
        return w, v.abs()
    check(fn, _mat((2, 4, 4), dtype, grad=dtype == torch.float64))


def test_eigh_reconstruction_and_orthonormal():
    a = torch.randn(3, 6, 6, dtype=torch.float64)
    a = a + a.mT
    w, v = torch.linalg.eigh(a.to(TPU))
    w, v = w.cpu(), v.cpu()
    torch.testing.assert_close(v @ torch.diag_embed(w) @ v.mT, a)
    torch.testing.assert_close(v.mT @ v, torch.eye(6, dtype=torch.float64).expand(3, 6, 6))
    assert (w.diff(dim=-1) >= 0).all()  # ascending


@pytest.mark.parametrize("shape", [(0, 0), (2, 0, 0), (1, 1), (5, 5)])
def test_eigvalsh_shapes(shape):
    check(torch.linalg.eigvalsh, _mat(shape, torch.float32))


def test_eigvalsh_noncontiguous_and_repeated():
    a = torch.randn(5, 5, dtype=torch.float64).mT  # non-contiguous
    check(torch.linalg.eigvalsh, a)
    check(torch.linalg.eigvalsh, torch.eye(4, dtype=torch.float64) * 2)   # repeated eigenvalues


@pytest.mark.parametrize("dtype,shape,full", [
    (torch.float32, (5, 3), True), (torch.float64, (3, 5), True), (torch.float64, (5, 3), False),
    (torch.complex64, (2, 4, 4), False), (torch.complex64, (3, 5), True)])
def test_svd(dtype, shape, full):
    k = min(shape[-2:])

    def fn(a):
        u, s, vh = torch.linalg.svd(a, full_matrices=full)
        u, vh = u[..., :k], vh[..., :k, :]
        return u.abs(), s, vh.abs(), u @ vh
    check(fn, _mat(shape, dtype), grad=False)
    u, s, vh = torch.linalg.svd(_mat(shape, dtype).to(TPU), full_matrices=full)
    for q in (u.cpu(), vh.cpu().mH):   # full_matrices: the completed factors are unitary too
        eye = torch.eye(q.shape[-1], dtype=dtype).expand(q.shape[:-2] + (-1, -1))
        torch.testing.assert_close(q.mH @ q, eye, atol=1e-5, rtol=1e-5)


def test_svd_grad_and_torch_svd():
    a = _mat((4, 3), torch.float64, grad=True)
    check(lambda x: (lambda u, s, v: (s, (u @ v.mT).abs()))(*torch.svd(x)), a)


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (2, 0, 0)])
def test_svd_empty(shape):
    check(lambda a: torch.linalg.svd(a), _mat(shape, torch.float32), grad=False)


def test_svdvals_rank_deficient():
    a = torch.randn(6, 2, dtype=torch.float64) @ torch.randn(2, 5, dtype=torch.float64)
    check(torch.linalg.svdvals, a, atol=1e-12, rtol=1e-10)
    check(torch.linalg.matrix_rank, a)


def test_derived_ops():
    check(torch.linalg.pinv, _mat((4, 3), torch.float32), grad=False)
    check(torch.linalg.pinv, _mat((4, 3), torch.float64, grad=True))     # svd program shared with test_svd_grad
    a = _mat((2, 4, 4), torch.float64)
    check(lambda x: torch.linalg.pinv(x + x.mT, hermitian=True), a)
    check(torch.linalg.cond, a)
    check(lambda x: torch.linalg.matrix_norm(x, "nuc"), a)
    check(lambda x: torch.linalg.matrix_norm(x, 2), a)
    check(lambda x: torch.linalg.matrix_rank(x + x.mT, hermitian=True), a)


@pytest.mark.parametrize("driver,shapes,grad", [(None, ((5, 3), (5, 2)), True), ("gels", ((3, 5), (3, 2)), False),
                                                ("gelsd", ((2, 5, 3), (2, 5)), False)])
def test_lstsq(driver, shapes, grad):
    a, b = _mat(shapes[0], torch.float64, grad=grad), _mat(shapes[1], torch.float64, grad=grad)
    # For m > n CPU's solution is a view into LAPACK's bigger (m, k) column-major work buffer; tpu's
    # is dense (column-major only where that buffer is the solution itself, m <= n).
    check(lambda x, y: torch.linalg.lstsq(x, y, driver=driver), a, b, strides=shapes[0][-2] <= shapes[0][-1])


def test_errors():
    t = torch.randn(3)
    for fn in (torch.linalg.eigh, torch.linalg.svdvals):
        with pytest.raises(RuntimeError, match="at least 2 dimensions"):
            fn(t.to(TPU))
    nan = torch.randn(2, 3, 3)
    nan[1, 0, 0] = float("nan")
    with pytest.raises(torch.linalg.LinAlgError, match=r"\(Batch element 1\): The algorithm failed"):
        torch.linalg.svdvals(nan.to(TPU))
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.linalg.lstsq(torch.randn(5, 3).to(TPU), torch.randn(5, 2, dtype=torch.float64).to(TPU))
    with pytest.raises(RuntimeError, match="driver"):
        torch.linalg.lstsq(torch.randn(5, 3).to(TPU), torch.randn(5, 2).to(TPU), driver="nope")


def test_svd_zero_matrix_unitary():
    # zero singular values: U's columns must still be orthonormal (LAPACK's are)
    u, s, vh = torch.linalg.svd(torch.zeros(4, 3).to(TPU), full_matrices=False)
    torch.testing.assert_close(s.cpu(), torch.zeros(3))
    torch.testing.assert_close(u.cpu().mT @ u.cpu(), torch.eye(3))
    torch.testing.assert_close(vh.cpu() @ vh.cpu().mT, torch.eye(3))


def test_lstsq_out_and_rank_deficient_gelsd():
    a, b = torch.randn(2, 5, 3, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
    outs = [torch.empty(0, dtype=dt, device=TPU) for dt in (torch.float64, torch.float64, torch.long, torch.float64)]
    torch.linalg.lstsq(a.to(TPU), b.to(TPU), driver="gelsd", out=outs)
    for o, c in zip(outs, torch.linalg.lstsq(a, b, driver="gelsd")):
        torch.testing.assert_close(o.cpu(), c)
    # gelsd on a rank-deficient tall matrix: CPU returns empty residuals (data-dependent shape);
    # refused on tpu rather than answered with a wrong shape
    a[..., 2] = a[..., 1]
    with pytest.raises(NotImplementedError, match="rank-deficient"):
        torch.linalg.lstsq(a.to(TPU), b.to(TPU), driver="gelsd")
