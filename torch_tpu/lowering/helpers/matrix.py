"""Building blocks for batched matrices (shape (*B, m, n)) in StableHLO, shared by the decompositions
(linalg_decomp) and the eigen/singular value solvers (linalg_eig): real/imaginary parts,
transposes, dynamic rows/columns/entries, identity and triangle masks, and `loop` (a
stablehlo.while over a counter). Each takes the Builder `b` first and returns a Value."""
from __future__ import annotations

import torch

from ..builder import TensorType, Value
from ..linalg import dot

I64 = torch.int64


def real_dtype(dt):
    """The real dtype of a complex one (itself otherwise)."""
    return {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dt, dt)


def real_part(b, x):
    """Real part (x itself for a real dtype)."""
    if not x.dtype.is_complex:
        return x
    return b.op("stablehlo.real", [x], [TensorType(x.shape, real_dtype(x.dtype))])[0]


def imag_part(b, x):
    """Imaginary part of a complex x (real dtype)."""
    return b.op("stablehlo.imag", [x], [TensorType(x.shape, real_dtype(x.dtype))])[0]


def make_complex(b, re, im, dtype):
    """The complex `dtype` value re + i im (re and im of its real dtype, same shape)."""
    return b.op("stablehlo.complex", [re, im], [TensorType(re.shape, dtype)])[0]


def convert_to(b, x, dtype):
    """x converted to `dtype`; a real value becomes the real part of a complex one."""
    if x.dtype == dtype:
        return x
    if dtype.is_complex and not x.dtype.is_complex:
        x = b.convert(x, real_dtype(dtype))
        return make_complex(b, x, b.zeros_like(x), dtype)
    return b.convert(x, dtype)


def conj(b, x):
    """Complex conjugate (x itself for a real dtype)."""
    if not x.dtype.is_complex:
        return x
    return make_complex(b, real_part(b, x), b.negate(imag_part(b, x)), x.dtype)


def magnitude(b, x):
    """|x| with a real result."""
    return b.op("stablehlo.abs", [x], [TensorType(x.shape, real_dtype(x.dtype))])[0]


def abs1(b, x):
    """|re| + |im|: the magnitude LAPACK's i?amax compares (|x| for reals)."""
    if not x.dtype.is_complex:
        return b.abs(x)
    return b.add(b.abs(real_part(b, x)), b.abs(imag_part(b, x)))


def mT(b, x):
    """Transpose of the last two dims."""
    r = x.rank
    return b.transpose(x, list(range(r - 2)) + [r - 1, r - 2])


def mH(b, x):
    """Conjugate transpose of the last two dims."""
    return conj(b, mT(b, x))


def expand(b, x, shape):
    """x (same rank, some dims of size 1) broadcast to shape."""
    return b.broadcast_in_dim(x, shape, list(range(x.rank)))


def bcast_batch(b, x, batch, core=None):
    """x broadcast to batch dims `batch` (numpy rules), its last two dims kept (or set to `core`)."""
    core = tuple(x.shape[-2:]) if core is None else tuple(core)
    return b.broadcast_to(x, tuple(batch) + core)


def zero_index(b):
    """A 0-dim int64 zero (a dynamic_slice start)."""
    return b.constant(0, I64)


def scalar_to(b, k, shape):
    """A 0-dim value broadcast to `shape`."""
    return b.broadcast_in_dim(k, shape, [])


def iota(b, shape, dim):
    """int64 positions along `dim`, broadcast to `shape`."""
    return b.iota(shape, dim, I64)


def col(b, a, k):
    """Column k (a 0-dim i64 Value) of each matrix: shape (*B, m, 1)."""
    return b.dynamic_slice(a, [zero_index(b)] * (a.rank - 1) + [k], a.shape[:-1] + (1,))


def row(b, a, k):
    """Row k of each matrix: shape (*B, 1, n)."""
    return b.dynamic_slice(a, [zero_index(b)] * (a.rank - 2) + [k, zero_index(b)], a.shape[:-2] + (1, a.shape[-1]))


def entry(b, a, i, j):
    """a[..., i, j] as shape (*B, 1, 1)."""
    return b.dynamic_slice(a, [zero_index(b)] * (a.rank - 2) + [i, j], a.shape[:-2] + (1, 1))


def matmul(b, x, y):
    """Batched x @ y (equal batch dims), full precision."""
    r = x.rank
    batch = list(range(r - 2))
    return dot(b, x, y, (batch, batch), ([r - 1], [r - 2]), x.dtype)


def eye(b, shape, dtype):
    """Identity matrices of shape (*B, n, n) (or rectangular)."""
    r = len(shape)
    on = b.compare(iota(b, shape, r - 2), iota(b, shape, r - 1), "EQ")
    return b.select(on, b.constant(1, dtype, shape), b.constant(0, dtype, shape))


def tri(b, x, lower, diagonal=0):
    """tril(x, diagonal) (lower) or triu(x, diagonal)."""
    r = x.rank
    diff = b.subtract(iota(b, x.shape, r - 1), iota(b, x.shape, r - 2))
    keep = b.compare(diff, b.constant(diagonal, I64, x.shape), "LE" if lower else "GE")
    return b.select(keep, x, b.zeros_like(x))


def sum_last(b, x):
    """Sum over the last dim."""
    return b.reduce([x], [b.constant(0, x.dtype)], [x.rank - 1], lambda s, a, e: s.add(a, e))[0]


def pick(b, x, onehot):
    """Sum over the last dim of x where `onehot` holds: the selected entry, exactly (no 0 * inf)."""
    return sum_last(b, b.select(onehot, x, b.zeros_like(x)))


def loop(b, n, init, body):
    """`for k in range(n): state = body(b, k, *state)` as a stablehlo.while; n is an int or a 0-dim
    i64 Value; k is a 0-dim i64 Value. Returns the final state."""
    init = list(init)
    bound = n if isinstance(n, Value) else b.constant(int(n), I64)
    types = [TensorType((), I64)] + [v.type for v in init]

    def cond(s, k, *rest):
        return s.compare(k, bound, "LT")

    def step(s, k, *rest):
        new = body(s, k, *rest)
        return [s.add(k, s.constant(1, I64)), *new]

    regions = [b.region(types, cond), b.region(types, step)]
    return b.op("stablehlo.while", [zero_index(b), *init], types, regions=regions)[1:]


def is_empty(shape):
    """Whether `shape` has no elements."""
    return any(s == 0 for s in shape)


def trsm(b, a, x, *, left, lower, unit=False, transpose="NO_TRANSPOSE"):
    """stablehlo.triangular_solve: op(a) y = x (left) or y op(a) = x; a and x with equal batch dims.
    Only a's `lower`/upper triangle is read (and not its diagonal if `unit`)."""
    if is_empty(x.shape) or is_empty(a.shape):
        return b.zeros_like(x)
    tf = lambda v: "true" if v else "false"  # noqa: E731
    return b.op("stablehlo.triangular_solve", [a, x], [x.type],
                {"left_side": tf(left), "lower": tf(lower), "unit_diagonal": tf(unit),
                 "transpose_a": f"#stablehlo<transpose {transpose}>"})[0]


def broadcast_pair(b, a, x, out_batch):
    """a and x broadcast to batch dims `out_batch`, each keeping its last two dims."""
    return bcast_batch(b, a, out_batch), bcast_batch(b, x, out_batch)


def to_int32(b, x):
    """x converted to int32 (LAPACK's pivot and info type)."""
    return b.convert(x, torch.int32)
