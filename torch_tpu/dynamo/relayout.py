"""Relayouts between a bucketed graph's two layouts of a tensor of symbolic size (buckets.py):

- *compact*: a 1-D buffer whose first numel elements are the tensor in row-major order of its TRUE
  sizes (how a tensor crosses the program's boundary: any tpu tensor's storage);
- *padded*: the bucket's shape, element (i0, i1, ...) at its row-major place of the BUCKET sizes, the
  padding (indices past a true size) unspecified (what XLA's bounded dynamic dimensions work on).

Both move whole rows, not elements: with k the last symbolic dimension, a "row" is every element
of one index of the dimensions before k, and it is contiguous in both layouts (t_k * P elements in
the compact one, T_k * P in the padded one; P the product of the static sizes after k, T_k the
bound, t_k the true size). So a relayout is one gather (compact -> padded: slices of T_k * P elements
starting at row * t_k * P) or one scatter (padded -> compact) with one index per row. Stop 58 measured
the element-wise form on v5e at 1000x the static program's bytes: a TPU moves a gathered element as
a whole tile.

Why the row slices stay in bounds: the last valid row starts at (R - 1) * t_k * P and reads T_k * P
elements, which ends at or before R * T_k * P <= the padded element count, which the compact buffer
is at least as large as. Rows in the padding may start anywhere: a gather clamps their start (their
values are padding), a scatter skips them or writes only zero bits.

Padded -> compact writes each row's T_k * P elements, of which the last (T_k - t_k) * P overlap the
next rows: the padding is zeroed first and the rows combined with a bitwise OR (in the dtype's
unsigned integer bits), so the overlap writes nothing and the copy is exact bit for bit (a float
add of -0.0 would flush subnormals on TPU).
"""
from __future__ import annotations

import math

import torch

from ..lowering.builder import Builder, Value
from ..lowering.helpers.bounded import static, valid

# Unsigned integer dtypes of each width: a float's bits in the scatter's OR.
_BITS = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}


def mark(b: Builder, x: Value, sizes) -> Value:
    """x with XLA's dynamic size set (set_dimension_size) on each dimension whose true size `sizes`
    gives (an int32 Value; None: static), so that every op after it honours the true sizes."""
    for d, n in enumerate(sizes):
        if n is not None:
            x = b.set_dimension_size(x, n, d)
    return x


def _size(b: Builder, sizes, shape, d) -> Value:
    return sizes[d] if sizes[d] is not None else b.constant(shape[d], torch.int32)


def _row_starts(b: Builder, shape, sizes, k: int) -> tuple[Value, int]:
    """int32 [shape[:k]..., 1]: each row's first element in the compact layout
    (row-major index over the true sizes of dims < k, times the row's true length), and the padded
    row length T_k * P."""
    p = math.prod(shape[k + 1:])
    rows = tuple(shape[:k]) + (1,)
    row_len = b.multiply(_size(b, sizes, shape, k), b.constant(p, torch.int32))
    lin, stride = b.constant(0, torch.int32, rows), row_len
    for d in reversed(range(k)):
        lin = b.add(lin, b.multiply(b.iota(rows, d, torch.int32), b.broadcast_to(stride, rows)))
        stride = b.multiply(stride, _size(b, sizes, shape, d))
    return lin, shape[k] * p


def _last_symbolic(sizes) -> int:
    return max((d for d, n in enumerate(sizes) if n is not None), default=-1)


def to_padded(b: Builder, flat: Value, sizes, shape) -> Value:
    """flat (1-D, compact, at least prod(shape) elements) as `shape` (the bucket's), true sizes
    `sizes` (int32 Values, None where static). Unmarked: the caller marks the symbolic dims (mark)."""
    shape = tuple(shape)
    n = math.prod(shape)
    if flat.shape[0] < n:
        raise ValueError(f"a compact buffer of {flat.shape[0]} elements cannot hold the bucket {shape}")
    k = _last_symbolic(sizes)
    if k <= 0:  # one row: the front of the buffer
        return b.reshape(b.slice(flat, [0], [n]), shape)
    starts, length = _row_starts(b, shape, sizes, k)
    rows = b.gather(flat, starts, [k], [], [0], k, [length], shape[:k] + (length,))
    return b.reshape(rows, shape)


def to_compact(b: Builder, x: Value, sizes, cap: int) -> Value:
    """x (padded: its type's shape is the bucket's; true sizes `sizes`) as a 1-D compact buffer of
    `cap` >= x.numel elements (what lies past the true numel is unspecified)."""
    shape = tuple(x.shape)
    if cap < math.prod(shape):
        raise ValueError(f"a compact buffer of {cap} elements cannot hold the bucket {shape}")
    k = _last_symbolic(sizes)
    if k < 0:
        flat = b.reshape(x, (math.prod(shape),))
        return b.pad(flat, b.constant(0, x.dtype), [0], [cap - flat.shape[0]]) if cap > flat.shape[0] else flat
    dtype = x.dtype
    if dtype.is_complex:  # real and imaginary parts on their own (a bitcast does not take complex)
        re = to_compact(b, b.real_part(x), sizes, cap)
        return b.make_complex(re, to_compact(b, b.imag_part(x), sizes, cap))
    bits = _BITS[dtype.itemsize] if dtype.is_floating_point else dtype  # ints and bool OR as they are
    v = x if bits == dtype else b.bitcast_convert(x, bits)
    v = static(b, b.select(valid(b, shape, sizes), v, b.constant(0, bits, shape)), sizes)
    if k == 0:  # one row: the valid rows are the front already
        flat = b.reshape(v, (math.prod(shape),))
        if cap > flat.shape[0]:
            flat = b.pad(flat, b.constant(0, bits), [0], [cap - flat.shape[0]])
        return flat if bits == dtype else b.bitcast_convert(flat, dtype)
    starts, length = _row_starts(b, shape, sizes, k)
    upd = b.reshape(v, shape[:k] + (length,))
    flat = b.scatter(b.constant(0, bits, (cap,)), starts, upd, [k], [], [0], k,
                     combine=lambda rb, old, new: rb.or_(old, new))
    return flat if bits == dtype else b.bitcast_convert(flat, dtype)
