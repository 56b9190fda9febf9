"""Matrix decompositions and solvers: Cholesky, triangular solves, LU with partial pivoting and what is
built on it (solve, inverse, determinants), matrix_exp, Householder QR, and Jacobi eigen/singular values.

There are no LAPACK custom calls on the device: apart from stablehlo.triangular_solve every
factorization is written as a `stablehlo.while` loop over columns that updates the whole (batched)
matrix with masks (`select`) and `dynamic_slice`/`dynamic_update_slice`, so one program serves
every batch shape. The results follow LAPACK's conventions, which are what PyTorch's CPU kernels
return: 1-based int32 pivots chosen as the first entry of largest |re| + |im| (i?amax), `info`
codes (the order of the first non-positive-definite leading minor, the first zero pivot of U), the
signs of Householder QR (R's diagonal is -sign(alpha) * norm), and on failure the partially factored
matrix that LAPACK leaves behind (potf2 stores the non-positive pivot and stops).

Errors that depend on the data (`check_errors=True`, deprecated `torch.cholesky` on a
non-positive-definite input) are raised by a `check=` that runs the factorization on the device and
reads `info` back (a host sync), through `_linalg_check_errors` so the messages are CPU's.
"""
from __future__ import annotations

import math

import torch

from .builder import TensorType
from .helpers import matrix
from .registry import column_major, host_kernel, register

# ---------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------
# Cholesky
def cholesky_lower(b, a):
    """Left-looking Cholesky of the lower triangle of each (*B, n, n) matrix, as LAPACK's potf2 does
    it: returns (L, info). Where a leading minor is not positive definite (or NaN), that column's
    diagonal holds the non-positive value, the rest of the matrix is left as it was, and info is the
    1-based column; the upper triangle of L is zero."""
    n = a.shape[-1]
    r = a.rank
    batch = a.shape[:-2]
    rows, cols = matrix.iota(b, a.shape, r - 2), matrix.iota(b, a.shape, r - 1)
    info0 = b.constant(0, torch.int32, batch)

    def body(s, k, x, info):
        kk = matrix.scalar_to(s, k, x.shape)
        done = s.compare(info, s.zeros_like(info), "NE")                       # (*B,)
        left_of_k = s.compare(cols, kk, "LT")
        xl = s.select(left_of_k, x, s.zeros_like(x))                              # L[:, :k]
        rowk = matrix.row(s, xl, k)                                                     # (*B, 1, n)
        # a_kk - sum_j |L[k, j]|^2
        akk = matrix.real_part(s, s.reshape(matrix.entry(s, x, k, k), batch))
        rk = s.reshape(rowk, batch + (n,))
        sq = matrix.sum_last(s, matrix.real_part(s, s.multiply(rk, matrix.conj(s, rk))))
        ajj = s.subtract(akk, sq)
        bad = s.or_(s.compare(ajj, s.zeros_like(ajj), "LE"), s.is_nan(ajj))
        fail_now = s.and_(bad, s.not_(done))
        ok = s.and_(s.not_(bad), s.not_(done))
        root = s.sqrt(s.select(bad, s.full_like(ajj, 1), ajj))
        # column below the diagonal: (a[k+1:, k] - L[k+1:, :k] @ conj(L[k, :k])) / L[k, k]
        prod = matrix.matmul(s, xl, matrix.mH(s, rowk))                                       # (*B, n, 1)
        colk = s.subtract(matrix.col(s, x, k), prod)
        colk = s.multiply(colk, matrix.expand(s, s.reshape(matrix.convert_to(s, s.divide(s.full_like(root, 1), root), x.dtype),
                                                     batch + (1, 1)), colk.shape))
        diag_new = matrix.convert_to(s, s.select(bad, ajj, root), x.dtype)
        okb = s.broadcast_in_dim(ok, x.shape, list(range(r - 2)))
        failb = s.broadcast_in_dim(fail_now, x.shape, list(range(r - 2)))
        at_col = s.compare(cols, kk, "EQ")
        below = s.and_(at_col, s.compare(rows, kk, "GT"))
        at_diag = s.and_(at_col, s.compare(rows, kk, "EQ"))
        x = s.select(s.and_(okb, below), matrix.expand(s, colk, x.shape), x)
        x = s.select(s.and_(s.or_(okb, failb), at_diag),
                     s.broadcast_in_dim(diag_new, x.shape, list(range(r - 2))), x)
        kth = s.add(matrix.scalar_to(s, matrix.to_int32(s, k), info.shape), s.constant(1, torch.int32, info.shape))
        info = s.select(fail_now, kth, info)
        return [x, info]

    if n == 0 or matrix.is_empty(batch):
        return a, info0
    x, info = matrix.loop(b, n, [a, info0], body)
    return matrix.tri(b, x, True), info


def _cholesky(b, a, upper):
    """(L or U, info) of linalg.cholesky_ex."""
    if upper:  # A = U^H U from the upper triangle: the lower factorization of A^H, transposed back
        low, info = cholesky_lower(b, matrix.mH(b, a))
        return matrix.mH(b, low), info
    return cholesky_lower(b, a)


def _check_cholesky_ex(x, upper=False, check_errors=False):
    if check_errors:
        info = torch.linalg.cholesky_ex(x, upper=upper).info
        torch._linalg_check_errors(info, "linalg.cholesky_ex", is_matrix=x.dim() == 2)


@register("linalg_cholesky_ex", check=_check_cholesky_ex)
def linalg_cholesky_ex(ctx, a, upper=False, check_errors=False):
    return _cholesky(ctx.b, a, upper)


def _check_cholesky(x, upper=False):
    info = torch.linalg.cholesky_ex(x, upper=upper).info
    torch._linalg_check_errors(info, "cholesky", is_matrix=x.dim() == 2)


@register("cholesky", check=_check_cholesky)
def cholesky(ctx, a, upper=False):
    return _cholesky(ctx.b, a, upper)[0]


def _cholesky_solve(b, x, f, upper):
    """Solves (F F^H) y = x (lower F) or (F^H F) y = x (upper F); equal batch dims."""
    if upper:
        y = matrix.trsm(b, f, x, left=True, lower=False, transpose="ADJOINT")
        return matrix.trsm(b, f, y, left=True, lower=False)
    y = matrix.trsm(b, f, x, left=True, lower=True)
    return matrix.trsm(b, f, y, left=True, lower=True, transpose="ADJOINT")


@register("_cholesky_solve_helper")
def cholesky_solve_helper(ctx, x, f, upper):
    out = ctx.out[0]
    batch = out.shape[:-2]
    f, x = matrix.broadcast_pair(ctx.b, f, x, batch)
    return _cholesky_solve(ctx.b, x, f, upper)


@register("cholesky_inverse")
def cholesky_inverse(ctx, f, upper=False):
    b = ctx.b
    return _cholesky_solve(b, matrix.eye(b, f.shape, f.dtype), f, upper)


# ---------------------------------------------------------------------------------------------------
# triangular solves
@register("linalg_solve_triangular")
def linalg_solve_triangular(ctx, a, x, upper, left=True, unitriangular=False):
    b = ctx.b
    out = ctx.out[0]
    batch = out.shape[:-2]
    a, x = matrix.bcast_batch(b, a, batch), matrix.bcast_batch(b, x, batch)
    return matrix.trsm(b, a, x, left=left, lower=not upper, unit=unitriangular)


@register("triangular_solve")
def triangular_solve(ctx, x, a, upper=True, transpose=False, unitriangular=False):
    b = ctx.b
    sol_t, coef_t = ctx.out
    batch = sol_t.shape[:-2]
    a, x = matrix.bcast_batch(b, a, batch), matrix.bcast_batch(b, x, batch)
    sol = matrix.trsm(b, a, x, left=True, lower=not upper, unit=unitriangular,
                transpose="TRANSPOSE" if transpose else "NO_TRANSPOSE")
    return sol, a


# ---------------------------------------------------------------------------------------------------
# LU with partial pivoting
def lu_factor(b, a):
    """Right-looking LU with partial pivoting of each (*B, m, n) matrix, as LAPACK's getf2: returns
    (LU, pivots (*B, k) int32 1-based, info (*B,) int32), k = min(m, n). The pivot is the first
    row of largest |re| + |im| at or below the diagonal; a zero pivot sets info (first one) and
    leaves its column unscaled."""
    m, n = a.shape[-2:]
    kmax = min(m, n)
    r = a.rank
    batch = a.shape[:-2]
    rd = matrix.real_dtype(a.dtype)
    rows, cols = matrix.iota(b, a.shape, r - 2), matrix.iota(b, a.shape, r - 1)
    vec_rows = matrix.iota(b, batch + (m,), r - 2)
    piv0 = b.constant(0, torch.int32, batch + (kmax,))
    info0 = b.constant(0, torch.int32, batch)
    bdims = list(range(r - 2))

    def body(s, k, x, piv, info):
        kk = matrix.scalar_to(s, k, x.shape)
        kv = matrix.scalar_to(s, k, vec_rows.shape)
        # pivot row: first max of |re| + |im| among rows >= k (NaNs lose to numbers)
        score = matrix.abs1(s, s.reshape(matrix.col(s, x, k), batch + (m,)))
        score = s.select(s.is_nan(score), s.full_like(score, -0.5), score)
        score = s.select(s.compare(vec_rows, kv, "LT"), s.full_like(score, -1), score)
        best = s.reduce([score], [s.constant(-2, rd)], [r - 2], lambda t, u, v: t.maximum(u, v))[0]
        cand = s.select(s.compare(score, s.broadcast_in_dim(best, score.shape, bdims), "EQ"), vec_rows,
                        s.full_like(vec_rows, m))
        p = s.reduce([cand], [s.constant(m, matrix.I64)], [r - 2], lambda t, u, v: t.minimum(u, v))[0]  # (*B,)
        # swap rows k and p
        pb = s.broadcast_in_dim(p, x.shape, bdims)
        is_p = s.compare(rows, pb, "EQ")
        row_k = matrix.expand(s, matrix.row(s, x, k), x.shape)
        row_p = matrix.pick(s, matrix.mT(s, x), matrix.mT(s, is_p))                              # (*B, n)
        row_p = s.broadcast_in_dim(row_p, x.shape, bdims + [r - 1])
        is_k = s.compare(rows, kk, "EQ")
        x = s.select(is_k, row_p, s.select(is_p, row_k, x))
        # multipliers l = a[k+1:, k] / a[k, k] (not when the pivot is zero)
        pivot = matrix.expand(s, matrix.entry(s, x, k, k), x.shape)
        nonzero = s.compare(pivot, s.zeros_like(pivot), "NE")
        colk = matrix.expand(s, matrix.col(s, x, k), x.shape)
        l = s.select(nonzero, s.multiply(colk, s.divide(s.full_like(pivot, 1), pivot)), colk)
        below = s.compare(rows, kk, "GT")
        at_col = s.compare(cols, kk, "EQ")
        x = s.select(s.and_(below, at_col), l, x)
        # trailing update a[k+1:, k+1:] -= l * a[k, k+1:]
        row_k = matrix.expand(s, matrix.row(s, x, k), x.shape)
        upd = s.subtract(x, s.multiply(l, row_k))
        x = s.select(s.and_(below, s.compare(cols, kk, "GT")), upd, x)
        piv = s.dynamic_update_slice(piv, s.reshape(s.add(matrix.to_int32(s, p), s.constant(1, torch.int32, p.shape)),
                                                    batch + (1,)), [matrix.zero_index(s)] * (r - 2) + [k])
        pz = s.reshape(matrix.entry(s, x, k, k), batch)
        zero_piv = s.compare(pz, s.zeros_like(pz), "EQ")
        first = s.and_(zero_piv, s.compare(info, s.zeros_like(info), "EQ"))
        kth = s.add(matrix.scalar_to(s, matrix.to_int32(s, k), info.shape), s.constant(1, torch.int32, info.shape))
        info = s.select(first, kth, info)
        return [x, piv, info]

    if kmax == 0 or matrix.is_empty(batch):
        return a, piv0, info0
    return tuple(matrix.loop(b, kmax, [a, piv0, info0], body))


def pivots_to_perm(b, piv, m):
    """The row permutation (*B, m) i64 that LAPACK's sequential swaps (1-based pivots (*B, k))
    apply: row i of P^T A is row perm[i] of A."""
    batch = piv.shape[:-1]
    r = len(batch) + 1
    k = piv.shape[-1]
    idx = matrix.iota(b, batch + (m,), r - 1)
    bdims = list(range(r - 1))

    def body(s, i, perm):
        iv = matrix.scalar_to(s, i, perm.shape)
        pi = s.subtract(s.convert(s.reshape(s.dynamic_slice(piv, [matrix.zero_index(s)] * (r - 1) + [i], batch + (1,)),
                                            batch), matrix.I64), s.constant(1, matrix.I64, batch))
        pb = s.broadcast_in_dim(pi, perm.shape, bdims)
        is_p = s.compare(idx, pb, "EQ")
        vi = s.broadcast_in_dim(s.reshape(s.dynamic_slice(perm, [matrix.zero_index(s)] * (r - 1) + [i], batch + (1,)), batch),
                                perm.shape, bdims)
        vp = s.broadcast_in_dim(matrix.pick(s, perm, is_p), perm.shape, bdims)
        return [s.select(s.compare(idx, iv, "EQ"), vp, s.select(is_p, vi, perm))]

    if k == 0 or m == 0 or matrix.is_empty(batch):
        return idx
    return matrix.loop(b, k, [idx], body)[0]


def take_rows(b, x, idx):
    """out[..., i, :] = x[..., idx[..., i], :] for x (*B, m, c) and idx (*B, r) i64 (a gather)."""
    batch = x.shape[:-2]
    nb = len(batch)
    r = idx.shape[-1]
    c = x.shape[-1]
    if matrix.is_empty(x.shape) or r == 0:
        return b.constant(0, x.dtype, batch + (r, c))
    parts = [b.reshape(matrix.iota(b, idx.shape, d), idx.shape + (1,)) for d in range(nb)]
    parts.append(b.reshape(idx, idx.shape + (1,)))
    full = b.concatenate(parts, nb + 1)
    return b.gather(x, full, offset_dims=[nb + 1], collapsed=list(range(nb + 1)),
                    start_index_map=list(range(nb + 1)), index_vector_dim=nb + 1,
                    slice_sizes=[1] * (nb + 1) + [c], out_shape=batch + (r, c))


def inverse_perm(b, perm):
    """The inverse of permutations (*B, m) (a sort of the positions by value)."""
    m = perm.shape[-1]
    if m == 0:
        return perm
    pos = matrix.iota(b, perm.shape, perm.rank - 1)
    return b.sort([perm, pos], perm.rank - 1, lambda s, a0, a1, p0, p1: s.compare(a0, a1, "LT"))[1]


def lu_solve(b, lu, piv, x, left=True, adjoint=False):
    """Solves A y = x (left) or y A = x with A = P L U given as (LU, pivots); adjoint: A^H instead.
    LU (*B, n, n), pivots (*B, n), x (*B, n, c) or (*B, c, n): equal batch dims."""
    n = lu.shape[-1]
    if not left:  # y A = x  <=>  A^H y^H = x^H
        return matrix.mH(b, lu_solve(b, lu, piv, matrix.mH(b, x), True, not adjoint))
    perm = pivots_to_perm(b, piv, n)
    if not adjoint:  # y = U^-1 L^-1 P^T x
        y = take_rows(b, x, perm)
        y = matrix.trsm(b, lu, y, left=True, lower=True, unit=True)
        return matrix.trsm(b, lu, y, left=True, lower=False)
    # A^H = U^H L^H P^T: y = P L^-H U^-H x
    y = matrix.trsm(b, lu, x, left=True, lower=False, transpose="ADJOINT")
    y = matrix.trsm(b, lu, y, left=True, lower=True, unit=True, transpose="ADJOINT")
    return take_rows(b, y, inverse_perm(b, perm))


def _check_lu_factor_ex(a, pivot=True, check_errors=False):
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the CPU")
    if check_errors:
        info = torch.linalg.lu_factor_ex(a).info
        torch._linalg_check_errors(info, "torch.linalg.lu_factor_ex", is_matrix=a.dim() == 2)


@register("linalg_lu_factor_ex", check=_check_lu_factor_ex)
def linalg_lu_factor_ex(ctx, a, pivot=True, check_errors=False):
    return lu_factor(ctx.b, a)


def _unpack(b, lu, piv, out_types, unpack_data=True, unpack_pivots=True):
    """(P, L, U) of lu_unpack."""
    p_t, l_t, u_t = out_types
    m, n = lu.shape[-2:]
    k = min(m, n)
    if unpack_pivots and p_t.numel:
        perm = pivots_to_perm(b, piv, m)                              # (*B, m): P[perm[i], i] = 1
        shape = perm.shape[:-1] + (m, m)
        r = len(shape)
        hit = b.compare(b.broadcast_in_dim(perm, shape, list(range(r - 2)) + [r - 1]), matrix.iota(b, shape, r - 2),
                        "EQ")
        p = b.select(hit, b.constant(1, p_t.dtype, shape), b.constant(0, p_t.dtype, shape))
    else:
        p = b.constant(0, p_t.dtype, p_t.shape)
    if unpack_data and l_t.numel + u_t.numel:
        r = lu.rank
        lpart = b.slice(lu, [0] * r, list(lu.shape[:-1]) + [k])
        low = b.add(matrix.tri(b, lpart, True, -1), matrix.eye(b, lpart.shape, lu.dtype))
        upart = b.slice(lu, [0] * r, list(lu.shape[:-2]) + [k, n])
        up = matrix.tri(b, upart, False)
    else:
        low = b.constant(0, l_t.dtype, l_t.shape)
        up = b.constant(0, u_t.dtype, u_t.shape)
    return p, low, up


@register("lu_unpack")
def lu_unpack(ctx, lu, piv, unpack_data=True, unpack_pivots=True):
    b = ctx.b
    batch = ctx.out[1].shape[:-2] if unpack_data else ctx.out[0].shape[:-2]
    lu = matrix.bcast_batch(b, lu, batch) if len(batch) >= lu.rank - 2 else lu
    piv = b.broadcast_to(piv, lu.shape[:-2] + piv.shape[-1:])
    return _unpack(b, lu, piv, ctx.out, unpack_data, unpack_pivots)


def _check_lu(a, pivot=True):
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the CPU")


@register("linalg_lu", check=_check_lu)
def linalg_lu(ctx, a, pivot=True):
    b = ctx.b
    lu, piv, _ = lu_factor(b, a)
    return _unpack(b, lu, piv, ctx.out)


@register("linalg_lu_solve")
def linalg_lu_solve(ctx, lu, piv, x, left=True, adjoint=False):
    b = ctx.b
    out = ctx.out[0]
    batch = out.shape[:-2]
    lu = matrix.bcast_batch(b, lu, batch)
    piv = b.broadcast_to(piv, batch + piv.shape[-1:])
    x = matrix.bcast_batch(b, x, batch)
    return lu_solve(b, lu, piv, x, left, adjoint)


def _vector_rhs(a, x):
    """linalg.solve's rule: x is a (batch of) vector(s) if 1-D, or if its shape is A's minus the last dim."""
    return x.rank == 1 or (x.rank == a.rank - 1 and tuple(x.shape) == tuple(a.shape[:-1]))


def _check_solve_ex(a, x, left=True, check_errors=False):
    if check_errors:
        info = torch.linalg.solve_ex(a, x, left=left).info
        torch._linalg_check_errors(info, "torch.linalg.solve_ex", is_matrix=a.dim() == 2)


@register("_linalg_solve_ex", check=_check_solve_ex)
def linalg_solve_ex(ctx, a, x, left=True, check_errors=False):
    b = ctx.b
    # result, LU, pivots, info: the meta kernel gives their types
    lu, piv, info = lu_factor(b, a)
    vec = _vector_rhs(a, x)
    if vec:
        x = b.reshape(x, x.shape + (1,) if left else x.shape[:-1] + (1, x.shape[-1]))
    batch = tuple(torch.broadcast_shapes(a.shape[:-2], x.shape[:-2]))
    lub = matrix.bcast_batch(b, lu, batch)
    pivb = b.broadcast_to(piv, batch + piv.shape[-1:])
    x = matrix.bcast_batch(b, x, batch)
    res = lu_solve(b, lub, pivb, x, left, False)
    return res, lu, piv, info


def _check_inv_ex(a, check_errors=False):
    if check_errors:
        info = torch.linalg.inv_ex(a).info
        torch._linalg_check_errors(info, "linalg.inv_ex", is_matrix=a.dim() == 2)


@register("linalg_inv_ex", check=_check_inv_ex)
def linalg_inv_ex(ctx, a, check_errors=False):
    b = ctx.b
    lu, piv, info = lu_factor(b, a)
    return lu_solve(b, lu, piv, matrix.eye(b, a.shape, a.dtype)), info


def _perm_sign(b, piv, dtype):
    """(-1)^(number of pivots that swap), as `dtype`, shape (*B,)."""
    k = piv.shape[-1]
    pos = b.add(b.iota(piv.shape, piv.rank - 1, torch.int32), b.constant(1, torch.int32, piv.shape))
    swaps = b.convert(b.compare(piv, pos, "NE"), torch.int32)
    count = matrix.sum_last(b, swaps) if k else b.constant(0, torch.int32, piv.shape[:-1])
    odd = b.compare(b.remainder(count, b.full_like(count, 2)), b.zeros_like(count), "NE")
    return b.select(odd, b.constant(-1, dtype, odd.shape), b.constant(1, dtype, odd.shape))


def _diagonal(b, x):
    """The main diagonal of each (*B, n, n) matrix: (*B, n)."""
    r = x.rank
    on = b.compare(matrix.iota(b, x.shape, r - 2), matrix.iota(b, x.shape, r - 1), "EQ")
    return matrix.pick(b, x, on)


def _det_lu(b, a):
    """The LU that _linalg_det and _linalg_slogdet return (their backward formulas read it): CPU hands
    a contiguous real A to LAPACK as the column-major A^T, so that case factors A^T, as CPU does."""
    ex = a.example
    if isinstance(ex, torch.Tensor) and ex.is_contiguous() and not a.dtype.is_complex:
        a = matrix.mT(b, a)
    return lu_factor(b, a)


@register("_linalg_det")
def linalg_det(ctx, a):
    b = ctx.b
    lu, piv, _ = _det_lu(b, a)
    d = _diagonal(b, lu)
    prod = b.reduce([d], [b.constant(1, d.dtype)], [d.rank - 1], lambda s, u, v: s.multiply(u, v))[0]
    return b.multiply(prod, _perm_sign(b, piv, a.dtype)), lu, piv


@register("_linalg_slogdet")
def linalg_slogdet(ctx, a):
    b = ctx.b
    lu, piv, _ = _det_lu(b, a)
    d = _diagonal(b, lu)
    mag = matrix.magnitude(b, d)
    if a.dtype.is_complex:
        unit = b.unary("sign", d)                          # d / |d|, 0 at 0
    else:
        zero = b.zeros_like(d)
        unit = b.select(b.compare(d, zero, "EQ"), zero, b.unary("sign", d))
    sign = b.reduce([unit], [b.constant(1, d.dtype)], [d.rank - 1], lambda s, u, v: s.multiply(u, v))[0]
    sign = b.multiply(sign, _perm_sign(b, piv, a.dtype))
    logabs = matrix.sum_last(b, b.log(mag))
    return sign, logabs, lu, piv


# ---------------------------------------------------------------------------------------------------
# matrix exponential: scaling and squaring with a diagonal Pade approximant (Higham 2005)
_PADE = {
    7: [17297280.0, 8648640.0, 1995840.0, 277200.0, 25200.0, 1512.0, 56.0, 1.0],
    13: [64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0,
         129060195264000.0, 10559470521600.0, 670442572800.0, 33522128640.0, 1323241920.0,
         40840800.0, 960960.0, 16380.0, 182.0, 1.0],
}
# 1-norm bounds up to which the degree-m approximant is accurate to unit roundoff (Higham 2005):
# degree 7 for single precision, 13 for double.
_THETA = {7: 3.925724783138660, 13: 5.371920351148152}


def _pade(b, a, m):
    """(U, V): odd and even parts of the degree-m Pade numerator, exp(A) ~ (V - U)^-1 (V + U)."""
    c = _PADE[m]
    eye = matrix.eye(b, a.shape, a.dtype)
    scale = lambda x, v: b.multiply(x, b.constant(v, a.dtype, a.shape))  # noqa: E731
    a2 = matrix.matmul(b, a, a)
    if m == 13:
        a4 = matrix.matmul(b, a2, a2)
        a6 = matrix.matmul(b, a4, a2)
        u = matrix.matmul(b, a6, b.add(b.add(scale(a6, c[13]), scale(a4, c[11])), scale(a2, c[9])))
        u = b.add(u, b.add(b.add(b.add(scale(a6, c[7]), scale(a4, c[5])), scale(a2, c[3])), scale(eye, c[1])))
        u = matrix.matmul(b, a, u)
        v = matrix.matmul(b, a6, b.add(b.add(scale(a6, c[12]), scale(a4, c[10])), scale(a2, c[8])))
        v = b.add(v, b.add(b.add(b.add(scale(a6, c[6]), scale(a4, c[4])), scale(a2, c[2])), scale(eye, c[0])))
        return u, v
    powers = [eye, a2]
    while 2 * len(powers) <= m:
        powers.append(matrix.matmul(b, powers[-1], a2))
    u = v = None
    for j, pw in enumerate(powers):
        if 2 * j + 1 <= m:
            t = scale(pw, c[2 * j + 1])
            u = t if u is None else b.add(u, t)
        t = scale(pw, c[2 * j])
        v = t if v is None else b.add(v, t)
    return matrix.matmul(b, a, u), v


@register("linalg_matrix_exp")
def linalg_matrix_exp(ctx, a):
    b = ctx.b
    if a.dtype in (torch.float16, torch.bfloat16):  # half precision: computed in float32, rounded once
        return b.convert(_matrix_exp(b, b.convert(a, torch.float32)), a.dtype)
    return _matrix_exp(b, a)


def _matrix_exp(b, a):
    """exp of each (*B, n, n) matrix: scaling and squaring with a Pade approximant of degree 7
    (single precision) or 13 (double)."""
    n = a.shape[-1]
    if n == 0 or matrix.is_empty(a.shape):
        return a
    if n == 1:
        return b.exp(a)
    m = 13 if a.dtype in (torch.float64, torch.complex128) else 7
    rd = matrix.real_dtype(a.dtype)
    batch = a.shape[:-2]
    r = a.rank
    bdims = list(range(r - 2))
    # s = max(0, ceil(log2(|A|_1 / theta))) per matrix
    colsum = b.reduce([matrix.magnitude(b, a)], [b.constant(0, rd)], [r - 2], lambda s, u, v: s.add(u, v))[0]
    norm = b.reduce([colsum], [b.constant(-math.inf, rd)], [r - 2], lambda s, u, v: s.maximum(u, v))[0]
    ratio = b.divide(norm, b.constant(_THETA[m], rd, batch))
    steps = b.unary("ceil", b.divide(b.log(ratio), b.constant(math.log(2.0), rd, batch)))
    finite = b.and_(b.compare(steps, b.constant(-1, rd, batch), "GT"), b.compare(steps, b.constant(1000, rd, batch), "LT"))
    steps = b.select(finite, steps, b.zeros_like(steps))
    steps = b.op("stablehlo.convert", [steps], [TensorType(batch, matrix.I64)])[0]
    big = b.compare(ratio, b.constant(1, rd, batch), "GT")
    steps = b.select(big, steps, b.zeros_like(steps))
    factor = b.power(b.constant(2, rd, batch), b.convert(b.negate(steps), rd))
    a_s = b.multiply(a, b.broadcast_in_dim(matrix.convert_to(b, factor, a.dtype), a.shape, bdims))
    u, v = _pade(b, a_s, m)
    lu, piv, _ = lu_factor(b, b.subtract(v, u))
    e = lu_solve(b, lu, piv, b.add(v, u))
    most = b.reduce([steps], [b.constant(0, matrix.I64)], bdims, lambda s, x, y: s.maximum(x, y))[0] if bdims else steps

    def square(s, k, x):
        again = s.broadcast_in_dim(s.compare(matrix.scalar_to(s, k, steps.shape), steps, "LT"), x.shape, bdims)
        return [s.select(again, matrix.matmul(s, x, x), x)]

    return matrix.loop(b, most, [e], square)[0]


# ---------------------------------------------------------------------------------------------------
# Householder QR
def geqrf(b, a):
    """Householder QR of each (*B, m, n) matrix as LAPACK's geqr2: returns (a, tau) with R in the upper
    triangle and the reflectors' vectors below it (unit first entry implied). Reflector k maps
    (alpha, x) to (beta, 0) with beta = -sign(re alpha) * |(alpha, x)|, tau = (beta - alpha) / beta;
    tau = 0 (no reflection) when x = 0 and alpha is real."""
    m, n = a.shape[-2:]
    kmax = min(m, n)
    r = a.rank
    batch = a.shape[:-2]
    bdims = list(range(r - 2))
    rows, cols = matrix.iota(b, a.shape, r - 2), matrix.iota(b, a.shape, r - 1)
    vrows = matrix.iota(b, batch + (m,), r - 2)
    tau0 = b.constant(0, a.dtype, batch + (kmax,))

    def body(s, k, x, tau):
        kk = matrix.scalar_to(s, k, x.shape)
        kv = matrix.scalar_to(s, k, vrows.shape)
        col = s.reshape(matrix.col(s, x, k), batch + (m,))
        below = s.compare(vrows, kv, "GT")
        xs = s.select(below, col, s.zeros_like(col))
        alpha = s.reshape(matrix.entry(s, x, k, k), batch)
        xnorm2 = matrix.sum_last(s, matrix.real_part(s, s.multiply(xs, matrix.conj(s, xs))))
        ar = matrix.real_part(s, alpha)
        ai = matrix.imag_part(s, alpha) if a.dtype.is_complex else None
        norm2 = s.add(s.multiply(ar, ar), xnorm2)
        if ai is not None:
            norm2 = s.add(norm2, s.multiply(ai, ai))
        nrm = s.sqrt(norm2)
        neg = s.compare(ar, s.zeros_like(ar), "LT")
        beta = s.select(neg, nrm, s.negate(nrm))                       # -sign(re alpha) * norm
        skip = s.compare(xnorm2, s.zeros_like(xnorm2), "EQ")
        if ai is not None:
            skip = s.and_(skip, s.compare(ai, s.zeros_like(ai), "EQ"))
        safe_beta = s.select(skip, s.full_like(beta, 1), beta)
        bc = matrix.convert_to(s, safe_beta, a.dtype)
        t = s.divide(s.subtract(bc, alpha), bc)                         # (beta - alpha) / beta
        t = s.select(skip, s.zeros_like(t), t)
        denom = s.subtract(alpha, bc)
        denom = s.select(skip, s.full_like(denom, 1), denom)
        scale = s.divide(s.full_like(denom, 1), denom)
        v = s.multiply(xs, s.broadcast_in_dim(scale, xs.shape, bdims))
        v = s.select(s.compare(vrows, kv, "EQ"), s.full_like(v, 1), v)  # (*B, m): 0 above k, 1 at k
        # apply H^H = I - conj(tau) v v^H to the columns right of k: A -= conj(tau) v (v^H A)
        vm = s.reshape(v, batch + (m, 1))
        rows_ok = s.compare(rows, kk, "GE")
        xa = s.select(rows_ok, x, s.zeros_like(x))
        w = matrix.matmul(s, matrix.mH(s, vm), xa)                                  # (*B, 1, n)
        tc = s.broadcast_in_dim(matrix.conj(s, t), x.shape, bdims)
        upd = s.subtract(x, s.multiply(tc, matrix.matmul(s, vm, w)))
        right = s.compare(cols, kk, "GT")
        x = s.select(s.and_(right, rows_ok), upd, x)
        # store beta on the diagonal and v below it (unless the reflection is skipped)
        at_col = s.compare(cols, kk, "EQ")
        diag = s.broadcast_in_dim(s.select(skip, alpha, matrix.convert_to(s, beta, a.dtype)), v.shape, bdims)
        newcol = s.select(s.compare(vrows, kv, "EQ"), diag, s.select(s.broadcast_in_dim(skip, v.shape, bdims), col, v))
        x = s.select(s.and_(at_col, rows_ok), s.broadcast_in_dim(newcol, x.shape, bdims + [r - 2]), x)
        tau = s.dynamic_update_slice(tau, s.reshape(t, batch + (1,)), [matrix.zero_index(s)] * (r - 2) + [k])
        return [x, tau]

    if kmax == 0 or matrix.is_empty(batch):
        return a, tau0
    return tuple(matrix.loop(b, kmax, [a, tau0], body))


def _reflector(s, v_all, tau, i):
    """Reflector i of a geqrf result: (v (*B, m, 1) with zeros above i and 1 at i, tau_i (*B,))."""
    m = v_all.shape[-2]
    r = v_all.rank
    batch = v_all.shape[:-2]
    vrows = matrix.iota(s, batch + (m,), r - 2)
    iv = matrix.scalar_to(s, i, vrows.shape)
    col = s.reshape(matrix.col(s, v_all, i), batch + (m,))
    v = s.select(s.compare(vrows, iv, "GT"), col, s.zeros_like(col))
    v = s.select(s.compare(vrows, iv, "EQ"), s.full_like(v, 1), v)
    t = s.reshape(s.dynamic_slice(tau, [matrix.zero_index(s)] * (r - 2) + [i], batch + (1,)), batch)
    return s.reshape(v, batch + (m, 1)), t


def apply_reflectors(b, v_all, tau, c, left=True, adjoint=False, reverse=False):
    """c multiplied by the reflectors H_i = I - tau_i v_i v_i^H of (v_all, tau), i in order
    (or reversed): left: c <- H_i c (H_i^H c if adjoint); right: c <- c H_i (c H_i^H)."""
    k = tau.shape[-1]
    bdims = list(range(c.rank - 2))

    def body(s, i, x):
        j = s.subtract(s.constant(k - 1, matrix.I64), i) if reverse else i
        v, t = _reflector(s, v_all, tau, j)
        if adjoint:
            t = matrix.conj(s, t)
        tb = s.broadcast_in_dim(t, x.shape, bdims)
        if left:   # x - t v (v^H x)
            return [s.subtract(x, s.multiply(tb, matrix.matmul(s, v, matrix.matmul(s, matrix.mH(s, v), x))))]
        xvvh = matrix.matmul(s, matrix.matmul(s, x, v), matrix.mH(s, v))
        return [s.subtract(x, s.multiply(tb, xvvh))]  # x - t (x v) v^H

    if k == 0 or matrix.is_empty(c.shape):
        return c
    return matrix.loop(b, k, [c], body)[0]


def _geqrf_meta(a):
    """Result types of geqrf (PyTorch has no meta kernel for it): a's shape, column-major as LAPACK's
    on CPU, and tau (*B, min(m, n))."""
    if a.dim() < 2:
        raise RuntimeError("torch.geqrf: input must have at least 2 dimensions.")
    return (torch.empty_strided(a.shape, column_major(a), dtype=a.dtype, device=a.device),
            a.new_empty(a.shape[:-2] + (min(a.shape[-2:]),)))


if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::geqrf", "Meta"):
    host_kernel("geqrf", _geqrf_meta, "Meta")


@register("geqrf")
def geqrf_(ctx, a):
    return geqrf(ctx.b, a)


def householder_product(b, v_all, tau, ncols):
    """The first `ncols` columns of H_1 ... H_k (LAPACK's orgqr), v_all (*B, m, >=k)."""
    m = v_all.shape[-2]
    eye = matrix.eye(b, v_all.shape[:-2] + (m, ncols), v_all.dtype)
    return apply_reflectors(b, v_all, tau, eye, left=True, reverse=True)


@register("linalg_householder_product")
def linalg_householder_product(ctx, v, tau):
    b = ctx.b
    out = ctx.out[0]
    batch = out.shape[:-2]
    v = matrix.bcast_batch(b, v, batch)
    tau = b.broadcast_to(tau, batch + tau.shape[-1:])
    return householder_product(b, v, tau, v.shape[-1])


@register("ormqr")
def ormqr(ctx, v, tau, c, left=True, transpose=False):
    b = ctx.b
    out = ctx.out[0]
    batch = out.shape[:-2]
    v = matrix.bcast_batch(b, v, batch)
    tau = b.broadcast_to(tau, batch + tau.shape[-1:])
    c = matrix.bcast_batch(b, c, batch)
    # Q = H_1 ... H_k: Q c applies H_k first; Q^H c applies H_1^H first; c Q applies H_1 first
    reverse = (left and not transpose) or (not left and transpose)
    return apply_reflectors(b, v, tau, c, left=left, adjoint=transpose, reverse=reverse)


@register("linalg_qr")
def linalg_qr(ctx, a, mode="reduced"):
    b = ctx.b
    q_t, r_t = ctx.out
    n = a.shape[-1]
    fact, tau = geqrf(b, a)
    rows = r_t.shape[-2]
    r = matrix.tri(b, b.slice(fact, [0] * a.rank, list(a.shape[:-2]) + [rows, n]), False)
    if mode == "r":
        return b.constant(0, q_t.dtype, q_t.shape), r
    ncols = q_t.shape[-1]
    return householder_product(b, fact, tau, ncols), r
