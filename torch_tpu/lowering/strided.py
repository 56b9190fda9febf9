"""Reading and writing strided views of a storage inside a program.

A tpu storage is one 1-D PJRT buffer. A tensor is (storage, offset, sizes, strides, dtype) as on
CPU, so reading it is a view read of that buffer and writing it is an update of the buffer:
- contiguous (the common case): slice + reshape / dynamic_update_slice;
- any strided box whose strides nest (slices with steps, transposes, select, unfold without
  overlap): one slice of the padded buffer, reshape, slice, transpose;
- everything else (diagonal, as_strided with overlap): gather / scatter at computed offsets.
Stride-0 dimensions (expand) are read once and broadcast.
The offset is a python int (baked into the program) or a 0-d int64 Value (a runtime operand: eager
passes a view's nonzero offset so that one program serves a view at every offset, issue 49); the
same ops read and write at either (dynamic_slice / dynamic_update_slice for a runtime one).
"""
from __future__ import annotations

import math

import torch

from .builder import Builder, TensorType, Value


def contiguous_strides(sizes):
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.append(acc)
        acc *= max(s, 1)
    return list(reversed(strides))


def is_whole(numel_storage, offset, sizes, strides):
    """True when the view is the whole storage, densely in row-major order."""
    n = math.prod(sizes)
    return offset == 0 and n == numel_storage and (n <= 1 or _dense(sizes, strides))


def _dense(sizes, strides):
    return all(st == c for s, st, c in zip(sizes, strides, contiguous_strides(sizes)) if s != 1)


def _as_dtype(b: Builder, base: Value, dtype: torch.dtype) -> Value:
    """The 1-D storage buffer reinterpreted as `dtype` (its bytes unchanged), as a storage shared by
    tensors of different dtypes is (x.view(torch.uint8), torch.save / torch.load of storages)."""
    if base.dtype == dtype:
        return base
    # bitcast_convert takes no complex types: a complex buffer is its interleaved (real, imag)
    # floats, which is also its byte layout (view_as_real / view_as_complex views).
    if base.dtype.is_complex:
        part, n = base.dtype.to_real(), base.shape[0]
        pair = [b.reshape(b.unary(k, base, part), [n, 1]) for k in ("real", "imag")]
        return _as_dtype(b, b.reshape(b.concatenate(pair, 1), [2 * n]), dtype)
    if dtype.is_complex:
        flat = _as_dtype(b, base, dtype.to_real())
        m = flat.shape[0] // 2
        pairs = b.reshape(b.slice(flat, [0], [2 * m]), [m, 2])
        re, im = (b.reshape(b.slice(pairs, [0, k], [m, k + 1]), [m]) for k in (0, 1))
        return b.op("stablehlo.complex", [re, im], [TensorType((m,), dtype)])[0]
    if dtype == torch.bool or base.dtype == torch.bool:  # PRED cannot be bitcast: go through uint8
        if dtype == torch.bool:
            return b.convert(_as_dtype(b, base, torch.uint8), torch.bool)
        base = b.convert(base, torch.uint8)
        if dtype == torch.uint8:
            return base
    src, dst = base.dtype.itemsize, dtype.itemsize
    if src == dst:
        return b.bitcast_convert(base, dtype)
    n = base.shape[0]
    if src > dst:  # e.g. float32 -> uint8: each element becomes src/dst elements
        r = src // dst
        wide = b.op("stablehlo.bitcast_convert", [base], [TensorType((n, r), dtype)])[0]
        return b.reshape(wide, [n * r])
    r = dst // src  # e.g. uint8 -> float32: groups of dst/src elements become one
    usable = (n // r) * r
    base = b.slice(base, [0], [usable]) if usable != n else base
    return b.op("stablehlo.bitcast_convert", [b.reshape(base, [usable // r, r])], [TensorType((usable // r,), dtype)])[0]


def _offset_slice(b: Builder, base: Value, offset, size: int) -> Value:
    """base[offset : offset + size] of the 1-D base; offset an int or a 0-d int64 Value (the caller
    makes sure the window fits: dynamic_slice would clamp its start)."""
    if isinstance(offset, int):
        return b.slice(base, [offset], [offset + size])
    return b.dynamic_slice(base, [offset], [size])


def _flat_offsets(b: Builder, offset, sizes, strides) -> Value:
    """i64 tensor of `sizes` holding offset + sum_k i_k * stride_k (offset: an int or a 0-d Value)."""
    if isinstance(offset, int):
        idx = b.constant(offset, torch.int64, tuple(sizes))
    else:
        idx = b.broadcast_in_dim(b.convert(offset, torch.int64), tuple(sizes), [])
    for d, (s, st) in enumerate(zip(sizes, strides)):
        if s > 1 and st != 0:
            term = b.multiply(b.iota(sizes, d), b.constant(st, torch.int64, tuple(sizes)))
            idx = b.add(idx, term)
    return idx


def _box_plan(sizes, strides):
    """For a view without size-1/stride-0 dims: (order, extents) when its strides nest, else None.
    order: dims by decreasing stride; extents: the reshape of the window that exposes the box."""
    order = sorted(range(len(sizes)), key=lambda i: -strides[i])
    ss = [sizes[i] for i in order]
    st = [strides[i] for i in order]
    for k in range(len(st) - 1):
        if st[k] % st[k + 1] != 0 or st[k] < st[k + 1] * ss[k + 1]:
            return None
    extents = [ss[0]] + [st[k - 1] // st[k] for k in range(1, len(st))] + [st[-1]]
    return order, extents


def dense_order(sizes, strides):
    """The dims from outermost to innermost in memory when (sizes, strides) lay the tensor's numel
    elements out densely from offset 0 (a permutation of row-major, e.g. channels_last); else None.
    Size-1 dims may sit anywhere. Transposing a value by this order and flattening it gives the
    storage's elements in memory order."""
    order = sorted(range(len(sizes)), key=lambda d: -strides[d])
    expect = 1
    for d in reversed(order):
        if sizes[d] == 1:
            continue
        if strides[d] != expect:
            return None
        expect *= sizes[d]
    return order


def read_view(b: Builder, base: Value, offset, sizes, strides, dtype: torch.dtype) -> Value:
    """The value of the view (offset, sizes, strides) of the 1-D `base`, as a tensor of `sizes`;
    offset: an int, or a 0-d int64 Value holding one for which the view lies in the storage."""
    sizes, strides = list(sizes), list(strides)
    base = _as_dtype(b, base, dtype)
    n = math.prod(sizes)
    if n == 0:
        return b.constant(0, dtype, tuple(sizes))
    if _dense(sizes, strides):
        return b.reshape(_offset_slice(b, base, offset, n), sizes)
    keep = [i for i in range(len(sizes)) if sizes[i] != 1 and strides[i] != 0]
    core_sizes = [sizes[i] for i in keep]
    core_strides = [strides[i] for i in keep]
    plan = _box_plan(core_sizes, core_strides) if keep else None
    if not keep:
        core = b.reshape(_offset_slice(b, base, offset, 1), [])
    elif plan is not None:
        order, extents = plan
        window = math.prod(extents)
        # The box's last row may end before the window does: pad the buffer. With a runtime offset,
        # by what the window reaches past the view's last element (a valid view ends in the storage).
        over = window - (base.shape[0] - offset) if isinstance(offset, int) else \
            window - 1 - sum((s - 1) * st for s, st in zip(core_sizes, core_strides))
        if over > 0:
            base = b.pad(base, b.constant(0, dtype), [0], [over])
        box = b.reshape(_offset_slice(b, base, offset, window), extents)
        ordered_sizes = [core_sizes[i] for i in order]
        box = b.slice(box, [0] * len(extents), ordered_sizes + [1])
        box = b.reshape(box, ordered_sizes)
        inverse = [order.index(i) for i in range(len(order))]
        core = b.transpose(box, inverse)
    else:
        core = b.gather(base, b.reshape(_flat_offsets(b, offset, core_sizes, core_strides), core_sizes + [1]),
                        offset_dims=[], collapsed=[0], start_index_map=[0], index_vector_dim=len(core_sizes),
                        slice_sizes=[1], out_shape=core_sizes)
    core = b.reshape(core, [sizes[i] if i in keep else 1 for i in range(len(sizes))])
    return b.broadcast_to(core, sizes)


def write_view(b: Builder, base: Value, offset, sizes, strides, value: Value) -> Value:
    """`base` (1-D) with the view (offset, sizes, strides) replaced by `value` (shape `sizes`);
    offset as read_view's.
    Where a stride-0 dimension makes several elements one, the last one is written, as on CPU."""
    sizes, strides = list(sizes), list(strides)
    store_dtype = base.dtype
    if value.dtype != store_dtype:  # write in the view's dtype, then back to the storage's bytes
        view_base = _as_dtype(b, base, value.dtype)
        new = write_view(b, view_base, offset, sizes, strides, value)
        out = _as_dtype(b, new, store_dtype)
        if out.shape != base.shape:  # a partial trailing group of bytes: keep the old tail
            out = b.concatenate([out, b.slice(base, [out.shape[0]], [base.shape[0]])], 0)
        return out
    n = math.prod(sizes)
    if n == 0:
        return base
    if _dense(sizes, strides):
        flat = b.reshape(value, [n])
        if n == base.shape[0]:
            return flat
        start = b.constant(offset, torch.int64) if isinstance(offset, int) else offset
        return b.dynamic_update_slice(base, flat, [start])
    # Collapse stride-0 dims to their last element (the write that lands last on CPU).
    for d in range(len(sizes)):
        if strides[d] == 0 and sizes[d] > 1:
            start = [0] * len(sizes)
            start[d] = sizes[d] - 1
            value = b.slice(value, start, list(value.shape))
            sizes[d] = 1
    keep = [i for i in range(len(sizes)) if sizes[i] != 1]
    core_sizes = [sizes[i] for i in keep]
    core_strides = [strides[i] for i in keep]
    value = b.reshape(value, core_sizes)
    idx = _flat_offsets(b, offset, core_sizes, core_strides)
    idx = b.reshape(idx, core_sizes + [1])
    return b.scatter(base, idx, value, update_window_dims=[], inserted_window_dims=[0],
                     scatter_dims_to_operand_dims=[0], index_vector_dim=len(core_sizes))
