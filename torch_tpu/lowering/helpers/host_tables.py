"""Host tables turned into programs, shared by resampling (upsample) and pooling: dense constants of
nested Python lists, `take` (x indexed along one dim by a host table), `linear_map` (the sparse
linear map y[o] = sum_l w[o][l] x[idx[o][l]] along one dim, summed in tap order as CPU's kernels
do) and its transpose; plus host rounding to the precision CPU's kernels compute tables in."""
from __future__ import annotations

import struct

import torch

from ..builder import TensorType, scalar_literal

def f32(v: float) -> float:
    """v rounded to float32 (exact IEEE rounding of one double result)."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def _bf16(v: float) -> float:
    bits = struct.unpack("<I", struct.pack("<f", f32(v)))[0]
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def _f16(v: float) -> float:
    return struct.unpack("<e", struct.pack("<e", f32(v)))[0]


def store_round(dtype):
    """Rounding of a value stored in `dtype` (CPU keeps interpolation weights in the input dtype)."""
    return {torch.float32: f32, torch.bfloat16: _bf16, torch.float16: _f16}.get(dtype, float)


def opmath_round(dtype):
    """Rounding of CPU's math type for `dtype`: double for double, else float32."""
    return float if dtype == torch.float64 else f32


def const_table(b, values, dtype):
    """A dense constant of a (nested, rectangular) python list, any rank >= 1."""
    shape = []
    v = values
    while isinstance(v, (list, tuple)):
        shape.append(len(v))
        v = v[0] if len(v) else None
    t = TensorType(tuple(shape), dtype)
    if 0 in shape:
        return b.constant(0, dtype, shape)

    def text(x):
        if isinstance(x, (list, tuple)):
            return "[" + ", ".join(text(y) for y in x) + "]"
        return scalar_literal(x, dtype)
    return b.op("stablehlo.constant", [], [t], {"value": f"dense<{text(values)}> : {t}"})[0]


def take(b, x, dim, table):
    """x indexed along `dim` by a host table of any rank: the table's dims replace `dim`."""
    tshape = []
    v = table
    while isinstance(v, (list, tuple)):
        tshape.append(len(v))
        v = v[0] if len(v) else None
    nt = len(tshape)
    out_shape = tuple(x.shape[:dim]) + tuple(tshape) + tuple(x.shape[dim + 1:])
    if 0 in out_shape:
        return b.constant(0, x.dtype, out_shape)
    idx = b.reshape(const_table(b, table, torch.int64), tuple(tshape) + (1,))
    offset = [i for i in range(len(out_shape)) if not dim <= i < dim + nt]
    sizes = list(x.shape)
    sizes[dim] = 1
    return b.gather(x, idx, offset, [dim], [dim], nt, sizes, out_shape)


def linear_map(b, x, dim, idx, w=None, valid=None):
    """y[.., o, ..] = sum over l of w[o][l] * x[.., idx[o][l], ..] along `dim` (host tables of
    shape (m, L)); taps with valid[o][l] False add nothing (not even 0 * inf). The sum runs over l
    in order, as CPU's kernels accumulate; without weights the taps are just added (or taken when
    L == 1, which keeps integer dtypes exact)."""
    m = len(idx)
    L = max((len(r) for r in idx), default=1) or 1
    if m == 0 or x.shape[dim] == 0:
        shape = list(x.shape)
        shape[dim] = m
        return b.constant(0, x.dtype, shape)
    # ragged rows: pad with index 0, masked out
    pad_valid = [[True] * len(r) + [False] * (L - len(r)) for r in idx]
    if valid is not None:
        pad_valid = [[pv and (valid[o][l] if l < len(valid[o]) else False) for l, pv in enumerate(row)]
                     for o, row in enumerate(pad_valid)]
    idx = [list(r) + [0] * (L - len(r)) for r in idx]
    g = take(b, x, dim, idx)                                           # (.., m, L, ..)
    if w is not None:
        w = [list(r) + [0.0] * (L - len(r)) for r in w]
        g = b.multiply(g, b.broadcast_in_dim(const_table(b, w, x.dtype), g.shape, [dim, dim + 1]))
    if not all(all(r) for r in pad_valid):
        mask = b.broadcast_in_dim(const_table(b, pad_valid, torch.bool), g.shape, [dim, dim + 1])
        g = b.select(mask, g, b.zeros_like(g))
    out_shape = list(g.shape[:dim + 1]) + list(g.shape[dim + 2:])
    if L <= 8:  # sequential, in tap order
        acc = None
        for l in range(L):
            start = [0] * g.rank
            start[dim + 1] = l
            limit = list(g.shape)
            limit[dim + 1] = l + 1
            t = b.reshape(b.slice(g, start, limit), out_shape)
            acc = t if acc is None else b.add(acc, t)
        return acc
    zero = b.constant(0, x.dtype)
    return b.reduce([g], [zero], [dim + 1], lambda bb, a, e: bb.add(a, e))[0]


def transpose_map(idx, w, n_in):
    """The transpose of a map given by (m, L) tables, as ragged (n_in, *) tables: for each input
    position, the output positions that read it (in output order) and their weights."""
    ti = [[] for _ in range(n_in)]
    tw = [[] for _ in range(n_in)]
    for o, row in enumerate(idx):
        for l, i in enumerate(row):
            ti[i].append(o)
            tw[i].append(1.0 if w is None else w[o][l])
    return ti, tw
