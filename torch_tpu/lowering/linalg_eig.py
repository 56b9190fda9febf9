"""Hermitian eigendecomposition (`_linalg_eigh`) and singular value decomposition (`_linalg_svd`) by
cyclic Jacobi rotations, and least squares (`linalg_lstsq`) built on the SVD.

Both decompositions are `stablehlo.while` loops, batched over the leading dims like the
factorizations in linalg_decomp.py (whose helpers they use): an outer loop of sweeps that stops when
every matrix of the batch has converged (or after a cap), and inside it one rotation per pair of
indices (p < q), taken from a constant table. Each rotation is the 2x2 Hermitian Jacobi rotation

    J = [[c, s g], [-s conj(g), c]]  in rows/cols (p, q),  g = a_pq / |a_pq|,
    tau = (a_qq - a_pp) / (2 |a_pq|),  t = sign(tau) / (|tau| + sqrt(1 + tau^2)),  c = 1/sqrt(1+t^2), s = t c

(Golub & Van Loan's symmetric Schur rotation after a diagonal phase change that makes a_pq real),
which zeroes the (p, q) entry of J^H A J.

- eigh: two-sided Jacobi on the Hermitian matrix built from the UPLO triangle (A <- J^H A J,
  V <- V J); eigenvalues are the final diagonal, sorted ascending as LAPACK returns them.
- svd: one-sided (Hestenes) Jacobi: columns of W = A (or A^H when A is wide) are rotated (W <- W J,
  V <- V J) with the rotation of their 2x2 Gram matrix until all pairs are orthogonal to working
  precision; the singular values are the column norms (sorted descending), U the normalized columns.
  Unlike eigh of A^H A this keeps the small singular values accurate. full_matrices completes U to a
  unitary matrix with the Householder QR of the thin U (linalg_decomp.geqrf).

Signs/phases of the vectors are LAPACK's no more than PyTorch promises (unique up to sign/phase).
"""
from __future__ import annotations

import torch

from .builder import TensorType
from .helpers import matrix
from .linalg_decomp import geqrf, householder_product, take_rows
from .registry import column_major, host_kernel, register

# Sweep caps: Jacobi converges quadratically, typically in 5-10 sweeps at these precisions.
_MAX_SWEEPS = {torch.float32: 20, torch.float64: 30}


def _eps(dtype):
    return torch.finfo(matrix.real_dtype(dtype)).eps


def _pairs(b, n):
    """Constant tables (p, q) of all pairs p < q in cyclic row order, as tensor<Nxi64> values."""
    ps = [p for p in range(n) for q in range(p + 1, n)]
    qs = [q for p in range(n) for q in range(p + 1, n)]
    t = TensorType((len(ps),), matrix.I64)
    mk = lambda xs: b.op("stablehlo.constant", [], [t], {"value": f"dense<[{', '.join(map(str, xs))}]> : {t}"})[0]  # noqa: E731
    return mk(ps), mk(qs)


def _at(s, table, k):
    """table[k] as a 0-dim i64 value."""
    return s.reshape(s.dynamic_slice(table, [k], (1,)), ())


def _rotation(s, app, aqq, apq, dtype):
    """(c, s, g) of the Jacobi rotation zeroing the (p, q) entry of [[app, apq], [conj apq, aqq]]
    (app, aqq real, apq of `dtype`); c, s real and g of `dtype`, shapes (*B,). The identity where
    apq == 0."""
    mag = matrix.magnitude(s, apq)
    zero = s.compare(mag, s.zeros_like(mag), "EQ")
    safe = s.select(zero, s.full_like(mag, 1), mag)
    tau = s.divide(s.subtract(aqq, app), s.multiply(s.full_like(safe, 2), safe))
    sign = s.select(s.compare(tau, s.zeros_like(tau), "LT"), s.full_like(tau, -1), s.full_like(tau, 1))
    at = s.abs(tau)
    # 1/(|tau| + sqrt(1 + tau^2)), written to stay finite for huge |tau| (then t ~ 1/(2|tau|))
    big = s.compare(at, s.full_like(at, 1e150 if at.dtype == torch.float64 else 1e18), "GT")
    root = s.sqrt(s.add(s.full_like(at, 1), s.multiply(at, at)))
    t = s.select(big, s.divide(s.full_like(at, 0.5), at), s.divide(s.full_like(at, 1), s.add(at, root)))
    t = s.select(zero, s.zeros_like(t), s.multiply(sign, t))
    c = s.rsqrt(s.add(s.full_like(t, 1), s.multiply(t, t)))
    sn = s.multiply(t, c)
    if dtype.is_complex:
        g = s.divide(apq, matrix.convert_to(s, safe, dtype))
    else:
        g = s.select(zero, s.full_like(apq, 1), s.unary("sign", apq))
    if dtype.is_complex:
        g = s.select(zero, s.full_like(g, 1), g)
    return c, sn, g


def _rotate_cols(s, x, p, q, c, sn, g):
    """x J for the rotation J (c, s, g) in columns p, q of each (*B, m, n) matrix x."""
    bd = list(range(x.rank - 2))
    cols = matrix.iota(s, x.shape, x.rank - 1)
    xp, xq = matrix.expand(s, matrix.col(s, x, p), x.shape), matrix.expand(s, matrix.col(s, x, q), x.shape)
    cb = s.broadcast_in_dim(matrix.convert_to(s, c, x.dtype), x.shape, bd)
    sg = s.broadcast_in_dim(s.multiply(matrix.convert_to(s, sn, x.dtype), g), x.shape, bd)
    newp = s.subtract(s.multiply(cb, xp), s.multiply(matrix.conj(s, sg), xq))
    newq = s.add(s.multiply(sg, xp), s.multiply(cb, xq))
    x = s.select(s.compare(cols, matrix.scalar_to(s, p, x.shape), "EQ"), newp, x)
    return s.select(s.compare(cols, matrix.scalar_to(s, q, x.shape), "EQ"), newq, x)


def _sweeps(b, n, dtype, state, converged, rotate):
    """Jacobi sweeps over the pairs of n indices until `converged(s, *state)` (a 0-dim bool) or the
    cap; `rotate(s, p, q, *state)` applies one rotation. Returns the final state."""
    ptab, qtab = _pairs(b, n)
    npairs = n * (n - 1) // 2
    cap = b.constant(_MAX_SWEEPS[matrix.real_dtype(dtype)], matrix.I64)
    types = [TensorType((), matrix.I64)] + [v.type for v in state]

    def cond(s, k, *st):
        return s.and_(s.compare(k, cap, "LT"), s.not_(converged(s, *st)))

    def sweep(s, k, *st):
        def inner(s2, j, *st2):
            return list(rotate(s2, _at(s2, ptab, j), _at(s2, qtab, j), *st2))
        itypes = [TensorType((), matrix.I64)] + [v.type for v in st]
        bound = s.constant(npairs, matrix.I64)
        icond = lambda s2, j, *r: s2.compare(j, bound, "LT")  # noqa: E731
        ibody = lambda s2, j, *r: [s2.add(j, s2.constant(1, matrix.I64)), *inner(s2, j, *r)]  # noqa: E731
        new = s.op("stablehlo.while", [matrix.zero_index(s), *st], itypes,
                   regions=[s.region(itypes, icond), s.region(itypes, ibody)])[1:]
        return [s.add(k, s.constant(1, matrix.I64)), *new]

    return b.op("stablehlo.while", [matrix.zero_index(b), *state], types,
                regions=[b.region(types, cond), b.region(types, sweep)])[1:]


def _all(s, pred):
    """All entries of a bool value, as a 0-dim bool."""
    if pred.rank == 0:
        return pred
    return s.reduce([pred], [s.constant(True, torch.bool)], list(range(pred.rank)), lambda t, u, v: t.and_(u, v))[0]


def _sq_sum(s, x, mask=None):
    """sum |x|^2 over the last two dims (where mask holds), real, shape (*B,)."""
    a = matrix.magnitude(s, x)
    sq = s.multiply(a, a)
    if mask is not None:
        sq = s.select(mask, sq, s.zeros_like(sq))
    return matrix.sum_last(s, matrix.sum_last(s, sq))


def _permute_cols(b, x, idx):
    """x[..., :, idx] (idx (*B, n) i64) for x (*B, m, n)."""
    return matrix.mT(b, take_rows(b, matrix.mT(b, x), idx))


def _sort_with_index(b, vals, descending):
    """(sorted vals, their original positions) along the last dim, stable."""
    idx = matrix.iota(b, vals.shape, vals.rank - 1)
    d = "GT" if descending else "LT"
    out = b.sort([vals, idx], vals.rank - 1, lambda s, a0, a1, i0, i1: s.compare(a0, a1, d))
    return out[0], out[1]


# ---------------------------------------------------------------------------------------------------
# eigh
def hermitian_from(b, a, upper):
    """The Hermitian matrix LAPACK reads: one strict triangle, its conjugate transpose, and the real
    part of the diagonal."""
    strict = matrix.tri(b, a, not upper, 1 if upper else -1)
    r = a.rank
    diag = b.compare(matrix.iota(b, a.shape, r - 2), matrix.iota(b, a.shape, r - 1), "EQ")
    d = b.select(diag, matrix.convert_to(b, matrix.real_part(b, a), a.dtype), b.zeros_like(a))
    return b.add(b.add(strict, matrix.mH(b, strict)), d)


def eigh(b, a, upper=False, vectors=True):
    """(eigenvalues ascending (*B, n) real, eigenvectors (*B, n, n) or None) of the Hermitian matrix
    given by the lower (or upper) triangle of each a (*B, n, n)."""
    n = a.shape[-1]
    r = a.rank
    batch = a.shape[:-2]
    rd = matrix.real_dtype(a.dtype)
    h = hermitian_from(b, a, upper)
    v0 = matrix.eye(b, a.shape, a.dtype)
    offmask = b.compare(matrix.iota(b, a.shape, r - 2), matrix.iota(b, a.shape, r - 1), "NE")
    tol = (_eps(a.dtype) * 0.5) ** 2  # squared: compared with sums of squares

    def converged(s, x, v):
        off = _sq_sum(s, x, offmask)
        tot = _sq_sum(s, x)
        return _all(s, s.compare(off, s.multiply(tot, s.constant(tol, rd, batch)), "LE"))

    def rotate(s, p, q, x, v):
        app = matrix.real_part(s, s.reshape(matrix.entry(s, x, p, p), batch))
        aqq = matrix.real_part(s, s.reshape(matrix.entry(s, x, q, q), batch))
        apq = s.reshape(matrix.entry(s, x, p, q), batch)
        c, sn, g = _rotation(s, app, aqq, apq, a.dtype)
        x = _rotate_cols(s, x, p, q, c, sn, g)
        x = matrix.mH(s, _rotate_cols(s, matrix.mH(s, x), p, q, c, sn, g))   # J^H (A J) = ((A J)^H J)^H
        return x, _rotate_cols(s, v, p, q, c, sn, g) if vectors else v

    if n > 1 and not matrix.is_empty(batch):
        h, v = _sweeps(b, n, a.dtype, [h, v0], converged, rotate)
    else:
        v = v0
    diag = b.compare(matrix.iota(b, a.shape, r - 2), matrix.iota(b, a.shape, r - 1), "EQ")
    w = (matrix.sum_last(b, matrix.real_part(b, b.select(diag, h, b.zeros_like(h)))) if n
         else b.constant(0, rd, batch + (0,)))
    if n == 0 or matrix.is_empty(batch):
        return w, (v if vectors else None)
    w, idx = _sort_with_index(b, w, False)
    return w, (_permute_cols(b, v, idx) if vectors else None)


def _prepare_eigh(a, UPLO="L", compute_v=True):
    """CPU's dimension error (PyTorch's meta kernel raises an AssertionError instead)."""
    if a.dim() < 2:
        raise RuntimeError("linalg.eigh: The input tensor A must have at least 2 dimensions.")
    return [a, UPLO, compute_v]


@register("_linalg_eigh", prepare=_prepare_eigh)
def linalg_eigh(ctx, a, UPLO="L", compute_v=True):
    b = ctx.b
    w_t, v_t = ctx.out
    if UPLO not in ("L", "U", "l", "u"):
        raise RuntimeError(f"Expected UPLO argument to be 'L' or 'U', but got {UPLO}")
    w, v = eigh(b, a, UPLO in ("U", "u"), compute_v)
    return w, (v if compute_v else b.constant(0, v_t.dtype, v_t.shape))


# ---------------------------------------------------------------------------------------------------
# svd
def _svd_tall(b, a, vectors):
    """One-sided Jacobi of each a (*B, m, n) with m >= n: (W with orthogonal columns (*B, m, n),
    V (*B, n, n)) such that a V = W, columns sorted by descending norm, and the norms (*B, n)."""
    m, n = a.shape[-2:]
    batch = a.shape[:-2]
    rd = matrix.real_dtype(a.dtype)
    v0 = matrix.eye(b, batch + (n, n), a.dtype)
    tol = _eps(a.dtype) * n
    square = batch + (n, n)
    offmask = b.compare(matrix.iota(b, square, len(batch)), matrix.iota(b, square, len(batch) + 1), "NE")

    def converged(s, w, v):
        # every pair: |w_p^H w_q| <= tol * |w_p| |w_q| (zero columns are orthogonal to all)
        g = matrix.matmul(s, matrix.mH(s, w), w)
        gd = matrix.magnitude(s, g)
        diag = matrix.sum_last(s, s.select(offmask, s.zeros_like(gd), gd))               # |w_j|^2 (*B, n)
        nr = s.sqrt(diag)
        bound = s.multiply(s.broadcast_in_dim(nr, gd.shape, list(range(len(batch))) + [len(batch) + 1]),
                           s.broadcast_in_dim(nr, gd.shape, list(range(len(batch))) + [len(batch)]))
        ok = s.or_(s.not_(offmask), s.compare(gd, s.multiply(bound, s.constant(tol, rd, gd.shape)), "LE"))
        return _all(s, ok)

    def rotate(s, p, q, w, v):
        wp, wq = matrix.col(s, w, p), matrix.col(s, w, q)                                       # (*B, m, 1)
        alpha = matrix.real_part(s, s.reshape(matrix.matmul(s, matrix.mH(s, wp), wp), batch))
        beta = matrix.real_part(s, s.reshape(matrix.matmul(s, matrix.mH(s, wq), wq), batch))
        gamma = s.reshape(matrix.matmul(s, matrix.mH(s, wp), wq), batch)
        c, sn, g = _rotation(s, alpha, beta, gamma, a.dtype)
        return _rotate_cols(s, w, p, q, c, sn, g), (_rotate_cols(s, v, p, q, c, sn, g) if vectors else v)

    w, v = a, v0
    if n > 1 and not matrix.is_empty(a.shape):
        w, v = _sweeps(b, n, a.dtype, [w, v], converged, rotate)
    aw = matrix.magnitude(b, w)
    # column norms
    s_ = b.sqrt(matrix.sum_last(b, matrix.mT(b, b.multiply(aw, aw)))) if m else b.constant(0, rd, batch + (n,))
    if n > 1 and not matrix.is_empty(a.shape):
        s_, idx = _sort_with_index(b, s_, True)
        w, v = _permute_cols(b, w, idx), _permute_cols(b, v, idx)
    return w, v, s_


def _left_vectors(b, w, s_, full):
    """U from the orthogonal columns w (*B, m, k) and their norms s_: w / s_, made exactly unitary
    (and completed to (*B, m, m) when `full`) through its Householder QR: U = Q * phase(diag R),
    which is w / s_ where s_ > 0, and for zero singular values (zero columns, sorted last) continues
    with columns orthonormal to the others, as LAPACK's U is."""
    m, k = w.shape[-2:]
    batch = w.shape[:-2]
    nb = len(batch)
    nz = b.compare(s_, b.zeros_like(s_), "GT")
    inv = b.select(nz, b.divide(b.full_like(s_, 1), s_), b.zeros_like(s_))
    u = b.multiply(w, b.broadcast_in_dim(matrix.convert_to(b, inv, w.dtype), w.shape, list(range(nb)) + [nb + 1]))
    if k == 0:
        return matrix.eye(b, batch + (m, m), w.dtype) if full else u
    fact, tau = geqrf(b, u)
    q = householder_product(b, fact, tau, m if full else k)
    on = b.compare(matrix.iota(b, (m, k), 0), matrix.iota(b, (m, k), 1), "EQ")
    diag = b.select(b.broadcast_in_dim(on, w.shape, [nb, nb + 1]), fact, b.zeros_like(fact))
    d = matrix.sum_last(b, matrix.mT(b, diag))
    mag = matrix.magnitude(b, d)
    zero = b.compare(mag, b.zeros_like(mag), "EQ")
    safe = matrix.convert_to(b, b.select(zero, b.full_like(mag, 1), mag), d.dtype)
    ph = b.select(zero, b.full_like(d, 1), b.divide(d, safe))
    shape = q.shape
    phb = b.broadcast_in_dim(ph, batch + (1, k), list(range(nb)) + [nb + 1])
    if full and m > k:
        phb = b.concatenate([phb, b.constant(1, d.dtype, batch + (1, m - k))], nb + 1)
    return b.multiply(q, matrix.expand(b, phb, shape))


def svd(b, a, full, vectors):
    """(U, S, Vh) of each a (*B, m, n): S (*B, k) descending real, U (*B, m, k or m), Vh (*B, k or n, n);
    U and Vh are None unless `vectors`."""
    m, n = a.shape[-2:]
    wide = m < n
    x = matrix.mH(b, a) if wide else a                                  # tall: (*B, M, N), M >= N
    w, v, s_ = _svd_tall(b, x, vectors)
    if not vectors:
        return None, s_, None
    u = _left_vectors(b, w, s_, full)                             # (*B, M, N or M)
    if wide:   # a^H = u S v^H  =>  a = v S u^H
        return v, s_, matrix.mH(b, u)
    return u, s_, matrix.mH(b, v)


def _check_svd(a, full_matrices=False, compute_uv=True, driver=None):
    """LAPACK's gesdd rejects a NaN input, and CPU raises (naming the first batch element that has one);
    one reduction and a host sync per call."""
    if a.numel() == 0:
        return
    bad = a.isnan().flatten(-2).any(-1).flatten()
    if bool(bad.any()):
        where = "" if a.dim() == 2 else f"(Batch element {int(bad.int().argmax())}): "
        raise torch.linalg.LinAlgError(f"linalg.svd: {where}The algorithm failed to converge because the input "
                                       "matrix contained non-finite values.")


@register("_linalg_svd", check=_check_svd,
          layout=lambda outs, *args: [None, None, column_major(outs[2])])  # Vh as LAPACK's, not as meta
def linalg_svd(ctx, a, full_matrices=False, compute_uv=True, driver=None):
    b = ctx.b
    u_t, s_t, vh_t = ctx.out
    m, n = a.shape[-2:]
    if matrix.is_empty(a.shape):
        s_ = b.constant(0, s_t.dtype, s_t.shape)
        mk = lambda t: matrix.eye(b, t.shape, t.dtype) if t.numel else b.constant(0, t.dtype, t.shape)  # noqa: E731
        return (mk(u_t) if compute_uv else b.constant(0, u_t.dtype, u_t.shape), s_,
                mk(vh_t) if compute_uv else b.constant(0, vh_t.dtype, vh_t.shape))
    u, s_, vh = svd(b, a, full_matrices, compute_uv)
    if not compute_uv:
        return b.constant(0, u_t.dtype, u_t.shape), s_, b.constant(0, vh_t.dtype, vh_t.shape)
    return u, s_, vh


# ---------------------------------------------------------------------------------------------------
# least squares
_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _lstsq_shapes(a, other, driver):
    """CPU's argument checks and result shapes of linalg_lstsq: (solution, residuals, rank,
    singular_values) shapes, the vector case, and the driver."""
    pre = "torch.linalg.lstsq: "
    if a.dim() < 2:
        raise RuntimeError(pre + "input must have at least 2 dimensions.")
    if other.dim() < 1:
        raise RuntimeError(pre + "other must have at least 1 dimension.")
    if not (a.dim() >= other.dim() and a.dim() - other.dim() <= 1):
        raise RuntimeError(pre + "input.dim() must be greater or equal to other.dim() and "
                           "(input.dim() - other.dim()) <= 1")
    if a.dtype != other.dtype:
        raise RuntimeError(pre + f"Expected input and other to have the same dtype, but got input's dtype "
                           f"{_c10_name(a.dtype)} and other's dtype {_c10_name(other.dtype)}")
    driver = "gelsy" if driver is None else driver
    if driver not in _DRIVERS:
        raise RuntimeError(pre + "parameter `driver` should be one of (gels, gelsy, gelsd, gelss)")
    vector = other.dim() == a.dim() - 1
    m, n = a.shape[-2:]
    if vector and other.shape[-1] != m:
        raise RuntimeError(pre + "input.size(-2) should match other.size(-1)")
    if not vector and other.shape[-2] != m:
        raise RuntimeError(pre + "input.size(-2) should match other.size(-2)")
    obatch = other.shape[:-1] if vector else other.shape[:-2]
    batch = tuple(torch.broadcast_shapes(a.shape[:-2], obatch))
    k = 1 if vector else other.shape[-1]
    sol = batch + ((n,) if vector else (n, k))
    res = batch + (k,) if (m > n and driver != "gelsy") else (0,)
    rank = (0,) if driver == "gels" else batch
    sv = batch + (min(m, n),) if driver in ("gelsd", "gelss") else (0,)
    return sol, res, rank, sv, vector, driver


def _c10_name(dt):
    """The scalar-type name CPU's messages print (Float, Double, ComplexFloat, ...)."""
    return {torch.float32: "Float", torch.float64: "Double", torch.complex64: "ComplexFloat",
            torch.complex128: "ComplexDouble", torch.float16: "Half", torch.bfloat16: "BFloat16"}.get(dt, str(dt))


def _lstsq_meta(a, other, rcond=None, *, driver=None):
    """Result types of linalg_lstsq (PyTorch registers no meta kernel for it)."""
    sol, res, rank, sv, _, _ = _lstsq_shapes(a, other, driver)
    rd = matrix.real_dtype(a.dtype)
    return (a.new_empty(sol), a.new_empty(res, dtype=rd), a.new_empty(rank, dtype=torch.int64),
            a.new_empty(sv, dtype=rd))


def _lstsq_out_meta(a, other, rcond=None, *, driver=None, solution, residuals, rank, singular_values):
    """linalg_lstsq.out on meta tensors: the out= tensors resized to the results' shapes."""
    outs = (solution, residuals, rank, singular_values)
    for o, shape in zip(outs, _lstsq_shapes(a, other, driver)[:4]):
        o.resize_(shape)
    return outs


if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::linalg_lstsq", "Meta"):
    host_kernel("linalg_lstsq", _lstsq_meta, "Meta")
if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::linalg_lstsq.out", "Meta"):
    host_kernel("linalg_lstsq.out", _lstsq_out_meta, "Meta")


def _check_lstsq(a, other, rcond=None, driver=None):
    """gelsd/gelss leave the residuals empty when some matrix is rank deficient (a data-dependent
    shape no meta kernel can give): refused here, with tensors unchanged, instead of a wrong shape."""
    _, res, _, _, _, drv = _lstsq_shapes(a, other, driver)
    if drv in ("gelsd", "gelss") and res != (0,) and a.numel():
        n = a.shape[-1]
        rank = torch.linalg.lstsq(a, other, rcond, driver="gelsy").rank
        if bool((rank != n).any()):
            raise NotImplementedError("torch.linalg.lstsq on tpu: driver='gelsd'/'gelss' with a rank-deficient "
                                      "tall input (CPU returns empty residuals) is not supported; use "
                                      "driver='gelsy' or compute the residuals from the solution")


def _lstsq_layout(outs, a, *args):
    """CPU's solution is the top of LAPACK's column-major (max(m, n), k) work buffer: column-major
    too when m <= n; for m > n a strided view of that bigger buffer, which a fresh tpu result does
    not reproduce (it stays row-major)."""
    return [column_major(outs[0]) if a.shape[-2] <= a.shape[-1] else None, None, None, None]


@register("linalg_lstsq", check=_check_lstsq, layout=_lstsq_layout)
def linalg_lstsq(ctx, a, other, rcond=None, driver=None):
    """Least squares through the SVD: x = V diag(1/s, s > rcond * s_max) U^H B, the minimum-norm
    solution of the numerical-rank problem (what gelsd/gelss return, and gelsy/gels for full rank);
    rank counts those singular values; residuals are |A x - B|^2 summed over the rows."""
    b = ctx.b
    sol_t, res_t, rank_t, sv_t = ctx.out
    _, _, _, _, vector, drv = _lstsq_shapes(a.example if a.example is not None else
                                            torch.empty(a.shape, dtype=a.dtype, device="meta"),
                                            torch.empty(other.shape, dtype=other.dtype, device="meta"), driver)
    m, n = a.shape[-2:]
    rd = matrix.real_dtype(a.dtype)
    batch = tuple(sol_t.shape[:-1] if vector else sol_t.shape[:-2])
    if vector:
        other = b.reshape(other, other.shape + (1,))
    k = other.shape[-1]
    a = matrix.bcast_batch(b, a, batch)
    other = matrix.bcast_batch(b, other, batch)
    kk = min(m, n)
    if rcond is None or rcond < 0:
        rcond = _eps(a.dtype) * max(m, n)
    if matrix.is_empty(a.shape) or k == 0 or matrix.is_empty(batch):
        x = b.constant(0, a.dtype, batch + (n, k))
        s_ = b.constant(0, rd, batch + (kk,))
        rank = b.constant(0, torch.int64, batch)
    else:
        u, s_, vh = svd(b, a, False, True)                           # (*B, m, kk), (*B, kk), (*B, kk, n)
        bd = list(range(len(batch)))
        smax = b.reduce([s_], [b.constant(0, rd)], [len(batch)], lambda t, x1, y1: t.maximum(x1, y1))[0]
        cut = b.broadcast_in_dim(b.multiply(smax, b.constant(rcond, rd, batch)), s_.shape, bd)
        keep = b.compare(s_, cut, "GT")
        inv = b.select(keep, b.divide(b.full_like(s_, 1), b.select(keep, s_, b.full_like(s_, 1))), b.zeros_like(s_))
        uhb = matrix.matmul(b, matrix.mH(b, u), other)                            # (*B, kk, k)
        uhb = b.multiply(uhb, b.broadcast_in_dim(matrix.convert_to(b, inv, a.dtype), uhb.shape, bd + [len(batch)]))
        x = matrix.matmul(b, matrix.mH(b, vh), uhb)                               # (*B, n, k)
        rank = matrix.sum_last(b, b.convert(keep, torch.int64))
    outs = [b.reshape(x, sol_t.shape) if vector else x]
    if res_t.numel:
        r = b.subtract(matrix.matmul(b, a, x), other) if not matrix.is_empty(a.shape) else other
        ra = matrix.magnitude(b, r)
        outs.append(matrix.sum_last(b, matrix.mT(b, b.multiply(ra, ra))) if m else b.constant(0, rd, res_t.shape))
    else:
        outs.append(b.constant(0, rd, res_t.shape))
    outs.append(rank if rank_t.numel or rank_t.shape == () else b.constant(0, torch.int64, rank_t.shape))
    if drv == "gels":
        outs[-1] = b.constant(0, torch.int64, rank_t.shape)
    outs.append(s_ if sv_t.numel or sv_t.shape == batch + (kk,) else b.constant(0, rd, sv_t.shape))
    return tuple(outs)
