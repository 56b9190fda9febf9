"""Indexing ops: index_select, gather, scatter (all reduce modes), embedding and its backward,
advanced indexing (index.Tensor, index_put), index_add/copy/fill, masked_fill, nonzero.

StableHLO gather/scatter clamp or drop out-of-range indices silently, so every op that takes
indices checks them: index_select, gather, scatter and embedding on the device (`bounds`: the
program writes nothing for bad indices and the error surfaces at the next synchronisation, as CUDA's
device-side asserts do), the others with a `check` that downloads them (a host sync) and raises what
CPU raises before anything runs. Bool masks in index/index_put make shapes data-dependent: `prepare` turns them into long
indices with `nonzero`, which counts the mask on the host (download) and computes the indices on
the device (nonzero_static).
"""
from __future__ import annotations

import warnings

import torch

from .elementwise import compute_dtype
from .helpers import arith, points
from .helpers.checks import broadcast_index_shapes, meta_result, scalar_type_name
from .registry import IndexBound, check_reads, host_kernel, in_format, register



# -- helpers ------------------------------------------------------------------------------------
def _empty_out(ctx, i=0):
    t = ctx.out[i]
    return ctx.b.constant(0, t.dtype, t.shape) if t.numel == 0 else None


def _wrap(b, idx, size):
    """Negative indices count from the end (as CPU does where it allows them)."""
    zero = b.zeros_like(idx)
    return b.select(b.compare(idx, zero, "LT"), b.add(idx, b.full_like(idx, size)), idx)


def _dim(d, rank):
    return d % rank if rank else 0


_IDENTITY = {"sum": 0, "mean": 0, "prod": 1, "amax": "-inf", "amin": "inf"}


def _identity(name, dtype):
    v = _IDENTITY[name]
    if isinstance(v, str):
        if dtype.is_floating_point:
            return float(v)
        if dtype == torch.bool:
            return v == "inf"
        info = torch.iinfo(dtype)
        return info.max if v == "inf" else info.min
    return v


# -- index_select / gather / scatter -----------------------------------------------------------------
def _index_select_bounds(x, dim, index):
    d = _dim(dim, x.dim())
    size = x.shape[d] if x.dim() else 1
    if x.dim() <= 1 or d == 0:
        return [IndexBound(index, size, IndexError, "index out of range in self")]
    return [IndexBound(index, size, RuntimeError, "INDICES element is out of DATA bounds, id={value} axis_dim={size}")]


@register("index_select", bounds=_index_select_bounds)
def index_select(ctx, x, dim, index):
    b = ctx.b
    e = _empty_out(ctx)
    if e is not None:
        return e
    if x.rank == 0:
        x = b.reshape(x, [1])
    d = _dim(dim, x.rank)
    n = index.type.numel
    idx = b.reshape(points.to_i64(b, index), [n, 1])
    sizes = list(x.shape)
    sizes[d] = 1
    out = list(x.shape)
    out[d] = n
    return b.gather(x, idx, offset_dims=[i for i in range(x.rank) if i != d], collapsed=[d], start_index_map=[d],
                    index_vector_dim=1, slice_sizes=sizes, out_shape=out)


def _gather_bounds(x, dim, index, *rest, **kw):
    d = _dim(dim, x.dim())
    n = x.shape[d] if x.dim() else 1
    return [IndexBound(index, n, RuntimeError, f"index {{value}} is out of bounds for dimension {d} with size {{size}}")]


def _as_rank1(b, x, index):
    if x.rank == 0:
        x = b.reshape(x, [1])
    if index.rank == 0:
        index = b.reshape(index, [1])
    return x, index


@register("gather", bounds=_gather_bounds)
def gather(ctx, x, dim, index, sparse_grad=False):
    b = ctx.b
    e = _empty_out(ctx)
    if e is not None:
        return e
    x, index = _as_rank1(b, x, index)
    return points.point_gather(b, x, points.coords(b, points.to_i64(b, index), _dim(dim, x.rank), x.rank))


def _scatter(ctx, x, dim, index, src, reduce=None, include_self=True):
    """Scatter of src (a tensor at least index's shape, or a 0-dim value) into x along dim."""
    b = ctx.b
    out = ctx.out[0]
    if index.type.numel == 0 or out.numel == 0:
        return x
    dt = out.dtype
    x, index = _as_rank1(b, b.convert(x, dt), index)
    d = _dim(dim, x.rank)
    coords = points.coords(b, points.to_i64(b, index), d, x.rank)
    shape = index.shape
    src = b.convert(src, dt)
    if src.rank == 0:
        upd = b.broadcast_to(src, shape)
    else:
        upd = b.slice(src, [0] * src.rank, list(shape)) if src.shape != shape else src
    if reduce is None:
        return points.point_scatter(b, x, coords, upd)
    cd = compute_dtype(dt)
    xc, uc = b.convert(x, cd), b.convert(upd, cd)
    if not include_self:
        ident = b.constant(_identity(reduce, cd), cd, shape)
        xc = points.point_scatter(b, xc, coords, ident)
    if reduce == "mean":
        total = points.point_scatter(b, xc, coords, uc, points.combine_fn("sum", cd))
        ones = b.constant(1, cd, shape)
        count = b.constant(1 if include_self else 0, cd, x.shape)
        count = points.point_scatter(b, count, coords, ones, points.combine_fn("sum", cd))
        if cd != dt:  # CPU: the sum and the counts land in self's half-precision dtype before the division
            total, count = (b.convert(b.convert(v, dt), cd) for v in (total, count))
        count = b.maximum(count, b.constant(1, cd, x.shape))
        if cd.is_floating_point:
            r = b.divide(total, count)
        else:
            r = arith.floor_div_int(b, total, count)
    else:
        r = points.point_scatter(b, xc, coords, uc, points.combine_fn(reduce, cd))
    return b.convert(r, dt)


@register("scatter.src", "scatter.value", bounds=_gather_bounds)
def scatter(ctx, x, dim, index, src):
    return _scatter(ctx, x, dim, index, src)


@register("scatter.reduce", "scatter.value_reduce", bounds=_gather_bounds)
def scatter_reduce_old(ctx, x, dim, index, src, reduce):
    return _scatter(ctx, x, dim, index, src, {"add": "sum", "multiply": "prod"}[reduce])


@register("scatter_add", bounds=_gather_bounds)
def scatter_add(ctx, x, dim, index, src):
    return _scatter(ctx, x, dim, index, src, "sum")


@register("scatter_reduce.two", bounds=_gather_bounds)
def scatter_reduce(ctx, x, dim, index, src, reduce, include_self=True):
    return _scatter(ctx, x, dim, index, src, reduce, include_self)


# -- embedding ------------------------------------------------------------------------------------------
def _embedding_bounds(weight, indices, *rest):
    return [IndexBound(indices, weight.shape[0], IndexError, "index out of range in self")]


@register("embedding", bounds=_embedding_bounds)
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    b = ctx.b
    e = _empty_out(ctx)
    if e is not None:
        return e
    idx = b.reshape(points.to_i64(b, indices), indices.shape + (1,))
    dims = list(range(indices.rank, indices.rank + weight.rank - 1))
    return b.gather(weight, idx, offset_dims=dims, collapsed=[0], start_index_map=[0],
                    index_vector_dim=indices.rank, slice_sizes=[1] + list(weight.shape[1:]),
                    out_shape=ctx.out[0].shape)


def embedding_renorm_(weight, indices, max_norm, norm_type):
    """aten::embedding_renorm_ on tpu tensors (nn.Embedding(max_norm=...) before every lookup): each row
    of weight (V, D) that indices name, whose norm_type-norm exceeds max_norm, is scaled in place by
    max_norm / (norm + 1e-7), as CPU's kernel does; rows named twice are scaled once (every copy of a
    row is computed from its old value, so the writes agree). Arguments CPU refuses (a weight that is
    not 2-D, indices not int64/int32) raise CPU's own error, from CPU's kernel on one-element tensors."""
    if weight.dim() != 2 or indices.dtype not in (torch.int64, torch.int32):
        torch.ops.aten.embedding_renorm_(torch.zeros([1] * weight.dim(), dtype=weight.dtype),
                                         torch.zeros([1] * indices.dim(), dtype=indices.dtype), max_norm, norm_type)
    idx = indices.reshape(-1)
    if idx.numel() == 0:
        return weight
    rows = weight.index_select(0, idx)
    norms = torch.linalg.vector_norm(rows, ord=norm_type, dim=1, keepdim=True)
    scale = torch.where(norms > max_norm, max_norm / (norms + 1e-7), torch.ones_like(norms))
    weight.index_copy_(0, idx.to(torch.int64), rows * scale)
    return weight


host_kernel("embedding_renorm_", embedding_renorm_)


@register("embedding_dense_backward")
def embedding_dense_backward(ctx, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    b = ctx.b
    out = ctx.out[0]
    cd = compute_dtype(out.dtype)
    n = indices.type.numel
    if n == 0 or out.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    row = out.shape[1:]
    g = b.reshape(b.convert(grad, cd), (n,) + row)
    idx = b.reshape(points.to_i64(b, indices), [n, 1])
    if padding_idx is not None and padding_idx >= 0:  # its rows get no gradient: send them out of range
        idx = b.select(b.compare(idx, b.full_like(idx, padding_idx), "EQ"), b.full_like(idx, num_weights), idx)
    add = points.combine_fn("sum", cd)
    if scale_grad_by_freq:
        counts = b.scatter(b.constant(0, cd, (num_weights,)), idx, b.constant(1, cd, (n,)), [], [0], [0], 1, add)
        mine = b.gather(counts, b.clamp(b.constant(0, torch.int64), idx, b.constant(num_weights - 1, torch.int64)),
                        [], [0], [0], 1, [1], (n,))
        g = b.divide(g, b.broadcast_in_dim(mine, g.shape, [0]))
    r = b.scatter(b.constant(0, cd, out.shape), idx, g, update_window_dims=list(range(1, len(out.shape))),
                  inserted_window_dims=[0], scatter_dims_to_operand_dims=[0], index_vector_dim=1, combine=add)
    return b.convert(r, out.dtype)


# -- nonzero (host sync for the count) ----------------------------------------------------------------
@register("nonzero_static", layout=lambda outs, *args: [in_format(outs[0], torch.contiguous_format)])  # meta: (1, n)
def nonzero_static(ctx, x, size, fill_value=-1):
    """The first `size` nonzero coordinates in row-major order, then rows of fill_value: a stable
    sort of (is_zero, position) brings the nonzero positions first, in order."""
    b = ctx.b
    out = ctx.out[0]
    if out.numel == 0:
        return b.constant(0, out.dtype, out.shape)
    n = x.type.numel
    if n == 0:
        return b.constant(fill_value, torch.int64, out.shape)
    flat = b.reshape(x, [n])
    zero = b.compare(flat, b.zeros_like(flat), "EQ") if flat.dtype != torch.bool else b.not_(flat)
    key = b.convert(zero, torch.int32)
    pos = b.iota((n,), 0)

    def less(sb, a0, a1, p0, p1):
        return sb.compare(a0, a1, "LT")
    skey, spos = b.sort([key, pos], 0, less, stable=True)
    if size <= n:
        skey, spos = b.slice(skey, [0], [size]), b.slice(spos, [0], [size])
    else:
        skey = b.pad(skey, b.constant(1, torch.int32), [0], [size - n])
        spos = b.pad(spos, b.constant(0, torch.int64), [0], [size - n])
    cols = []
    stride = 1
    for s in reversed(x.shape):
        c = b.divide(spos, b.constant(stride, torch.int64, (size,)))
        cols.append(b.remainder(c, b.constant(s, torch.int64, (size,))))
        stride *= s
    coords = b.concatenate([b.reshape(c, [size, 1]) for c in reversed(cols)], 1)
    filled = b.broadcast_in_dim(b.compare(skey, b.constant(0, torch.int32, (size,)), "NE"), coords.shape, [0])
    return b.select(filled, b.constant(fill_value, torch.int64, coords.shape), coords)


def nonzero(x):
    """CPU's nonzero: the (count, dim) coordinates, column-major (strides (1, count))."""
    mask = x if x.dtype == torch.bool else torch.ne(x, 0)
    count = int(mask.cpu().sum())  # the data-dependent size: a host sync
    out = torch.empty_strided((count, x.dim()), (1, count), dtype=torch.int64, device=x.device)
    return torch.ops.aten.nonzero_static.out(x, size=count, fill_value=-1, out=out)


def _into_out(result, out):
    """An out= overload's ending for a host kernel: out (on the op's device, checked before anything
    is computed) resized to the result and written, as PyTorch's out= ops do."""
    out.resize_(result.shape)
    return out.copy_(result)


def _same_device_out(x, out):
    """PyTorch's error for an out= tensor on another device (RuntimeError), raised before the op runs."""
    if out.device != x.device:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{x.device} and {out.device}!")


def nonzero_out(x, *, out):
    _same_device_out(x, out)
    if out.dtype != torch.int64:  # CPU's check and words (before anything runs)
        raise RuntimeError("nonzero: Expected out tensor to have scalar type Long but got scalar type"
                           f"{scalar_type_name(out.dtype)}")
    return _into_out(nonzero(x), out)


host_kernel("nonzero", nonzero)
host_kernel("nonzero.out", nonzero_out)


def masked_select(x, mask):
    if mask.dtype != torch.bool:
        raise RuntimeError("masked_select: expected BoolTensor for mask")
    xb, mb = torch.broadcast_tensors(x, mask)
    if xb.dim() == 0:  # a 1-D result of 0 or 1 elements, as CPU's (index takes no 0-dim mask)
        xb, mb = xb.reshape(1), mb.reshape(1)
    return torch.ops.aten.index.Tensor(xb, [mb])


def masked_select_out(x, mask, *, out):
    _same_device_out(x, out)
    return _into_out(masked_select(x, mask), out)


def one_hot(self, num_classes=-1):
    """F.one_hot of tpu tensors (ATen's composite, Onehot.cpp) with CPU's class errors at the call:
    "Class values must be non-negative." and "Class values must be smaller than num_classes.". On
    accelerators the composite leaves them to scatter's device-side bounds check (CUDA's device
    assert), found at a later sync after the call had returned a tensor of zeros; PyTorch's own
    test_one_hot expects the error at the call on every device but CUDA. So min and max are read
    (aminmax: one host read per call, which num_classes=-1 needs anyway for max).
    Traced (fake or functional tensors), the composite's own traceable form."""
    if self.dtype != torch.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if torch._C._dispatch_keys(self).has(torch._C.DispatchKey.Python):
        if num_classes == -1:
            num_classes = int(self.max().item()) + 1
        return torch.eq(self.unsqueeze(-1), torch.arange(num_classes, device=self.device)).to(torch.int64)
    shape = list(self.shape)
    if self.numel() == 0:
        if num_classes <= 0:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        return torch.empty(shape + [num_classes], dtype=torch.int64, device=self.device)
    lo, hi = torch.stack(torch.aminmax(self)).tolist()
    if lo < 0:
        raise RuntimeError("Class values must be non-negative.")
    if num_classes == -1:
        num_classes = hi + 1
    elif hi >= num_classes:
        raise RuntimeError("Class values must be smaller than num_classes.")
    ret = torch.zeros(shape + [num_classes], dtype=torch.int64, device=self.device)
    return ret.scatter_(-1, self.unsqueeze(-1), 1)


# Before autograd (one_hot is a composite; its integer result has no gradient).
host_kernel("one_hot", one_hot, "AutogradPrivateUse1")
host_kernel("masked_select", masked_select)
host_kernel("masked_select.out", masked_select_out)


# -- advanced indexing -----------------------------------------------------------------------------------
def _prepare_indices(x, indices):
    """Bool/byte masks -> one long index per masked dim (nonzero); CPU index tensors move to x's
    device (as CUDA allows)."""
    out = []
    d = 0
    for i in indices:
        if i is None:
            out.append(None)
            d += 1
            continue
        if i.device != x.device:
            i = i.to(x.device)
        if i.dtype in (torch.bool, torch.uint8):
            _check_mask(x, i, d)
            nz = nonzero(i)
            out.extend(nz.select(1, k) for k in range(i.dim()))
            d += i.dim()
        else:
            out.append(i)
            d += 1
    return out


def _check_mask(x, mask, d) -> None:
    """CPU's checks of a bool/byte mask indexing x from dimension d."""
    if mask.dtype == torch.uint8:  # CPU's deprecation warning, word for word
        warnings.warn("indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool "
                      "instead.", UserWarning, stacklevel=3)
    for k in range(mask.dim()):
        if d + k >= x.dim() or mask.shape[k] != x.shape[d + k]:
            raise IndexError(f"The shape of the mask {list(mask.shape)} at index {k} does not match the "
                             f"shape of the indexed tensor {list(x.shape)} at index {d + k}")


def _one_mask(x, indices):
    """`x[:, ..., mask] = v` (one bool/byte mask after only full slices): the index list with the mask
    checked, on x's device, as bool; else None."""
    masks = [d for d, i in enumerate(indices) if i is not None]
    if len(masks) != 1 or indices[masks[0]].dtype not in (torch.bool, torch.uint8):
        return None
    d = masks[0]
    mask = indices[d]
    _check_mask(x, mask, d)
    if mask.dim() == 0:  # a 0-dim mask adds a dimension (x[True]): the general path
        return None
    return [None] * d + [mask.to(x.device, torch.bool)]


def _prepare_index(x, indices):
    return [x, _prepare_indices(x, indices)]


def _prepare_index_put(x, indices, values, accumulate=False, *rest):
    if values.device != x.device and values.dim() == 0:
        values = values.to(x.device)
    if values.numel() == 1 and values.device == x.device:
        # One value for every masked element (`x[mask] = 0`): a select by the mask itself (index_put's
        # lowering), with no nonzero, so no host sync and one program whatever the mask holds.
        masked = _one_mask(x, indices)
        if masked is not None:
            return [x, masked, values, accumulate, *rest]
    return [x, _prepare_indices(x, indices), values, accumulate, *rest]


def _index_bounds(x, indices, *rest):
    """Advanced indexing's index tensors (bool masks already turned into long indices by
    `prepare`); what shapes and dtypes alone make wrong is raised here."""
    if len(indices) > x.dim():
        raise IndexError(f"too many indices for tensor of dimension {x.dim()} (got {len(indices)})")
    out, k = [], -1
    for d, i in enumerate(indices):
        k += i is not None  # CPU's message numbers the index tensors, not x's dimensions (x[:, i]: 0)
        if i is not None and i.dtype == torch.bool:  # index_put's one mask (_one_mask): nothing to bound
            continue
        if i is not None:
            if i.dtype not in (torch.int64, torch.int32):
                raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
            # every index is out of bounds: CPU's message, no program (a symbolic size is not
            # asked: it would add a guard to a graph already compiled, and Dynamo keeps 0 static)
            if isinstance(x.shape[d], int) and x.shape[d] == 0 and i.numel() > 0:
                raise IndexError("index is out of bounds for dimension with size 0")
            out.append(IndexBound(i, x.shape[d], IndexError,
                                  f"index {{value}} is out of bounds for dimension {k} with size {{size}}",
                                  negative_ok=True))
    return out


def _advanced(ctx, x, indices):
    """(indices tensor B+(k,), advanced dims, gather/scatter window dims in the result, result shape)."""
    b = ctx.b
    indices = list(indices) + [None] * (x.rank - len(indices))
    adv = [d for d, i in enumerate(indices) if i is not None]
    bshape = broadcast_index_shapes([indices[d].shape for d in adv])
    cols = []
    for d in adv:
        i = b.broadcast_to(points.to_i64(b, indices[d]), bshape)
        cols.append(b.reshape(_wrap(b, i, x.shape[d]), bshape + (1,)))
    idx = b.concatenate(cols, len(bshape))
    rest = [d for d in range(x.rank) if d not in adv]
    adjacent = adv == list(range(adv[0], adv[-1] + 1))
    first = adv[0] if adjacent else 0
    before = [d for d in rest if d < first]
    window = list(range(len(before))) + [len(before) + len(bshape) + j for j in range(len(rest) - len(before))]
    shape = tuple(x.shape[d] for d in before) + bshape + tuple(x.shape[d] for d in rest[len(before):])
    return idx, adv, window, shape


@register("index.Tensor", bounds=_index_bounds, prepare=_prepare_index, prepare_only_for_masks=True)
def index(ctx, x, indices):
    b = ctx.b
    e = _empty_out(ctx)
    if e is not None:
        return e
    idx, adv, window, shape = _advanced(ctx, x, indices)
    sizes = [1 if d in adv else s for d, s in enumerate(x.shape)]
    return b.gather(x, idx, offset_dims=window, collapsed=adv, start_index_map=adv,
                    index_vector_dim=idx.rank - 1, slice_sizes=sizes, out_shape=shape)


def _check_expandable(value_shape: tuple, result_shape: tuple) -> None:
    """CPU's check of index_put's values (TensorAdvancedIndexing.cpp): they must expand to the
    indexing result's shape (`x[i] = v` drops v's leading size-1 dimensions before, in PyTorch's
    Python indexing); else its RuntimeError, raised at the call, before any program is built."""
    v = list(value_shape)
    ok = len(v) <= len(result_shape) and all(a in (1, b) for a, b in zip(reversed(v), reversed(result_shape)))
    if not ok:
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(value_shape)} cannot be broadcast to "
                           f"indexing result of shape {list(result_shape)}")


@register("index_put", "_index_put_impl", bounds=_index_bounds, prepare=_prepare_index_put,
          prepare_only_for_masks=True)
def index_put(ctx, x, indices, values, accumulate=False, unsafe=False):
    """Duplicate indices: accumulate=True sums them; otherwise one of the values wins (unspecified
    which, as on CPU/CUDA)."""
    b = ctx.b
    out = ctx.out[0]
    def written(v):  # what x's elements at the indexed places become
        return points.combine_fn("sum", out.dtype)(b, x, v) if accumulate else v
    masks = [d for d, i in enumerate(indices) if i is not None and i.dtype == torch.bool]

    def check_dtype():  # CPU's, after its shape checks; a single mask with a 0-dim value is masked_fill_'s
        if values.dtype != x.dtype and not (len(masks) == 1 and values.rank == 0):
            raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                               f"{scalar_type_name(x.dtype)} for the destination and "
                               f"{scalar_type_name(values.dtype)} for the source.")
    if masks and values.type.numel == 1:  # one mask, one value (prepare's _one_mask)
        check_dtype()
        d = masks[0]
        mask = b.broadcast_in_dim(indices[d], x.shape, list(range(d, d + indices[d].rank)))
        return b.select(mask, written(b.broadcast_to(b.reshape(b.convert(values, out.dtype), []), x.shape)), x)
    if all(i is None for i in indices):  # no index: the result is all of x
        _check_expandable(tuple(values.shape), x.shape)
        check_dtype()
        return written(b.broadcast_to(b.convert(values, out.dtype), x.shape))
    idx, adv, window, shape = _advanced(ctx, x, indices)
    _check_expandable(tuple(values.shape), shape)
    check_dtype()
    if out.numel == 0 or 0 in shape:
        return x
    dt = out.dtype
    upd = b.broadcast_to(b.convert(values, dt), shape)
    combine = points.combine_fn("sum", dt) if accumulate else None
    return b.scatter(x, idx, upd, update_window_dims=window, inserted_window_dims=adv,
                     scatter_dims_to_operand_dims=adv, index_vector_dim=idx.rank - 1, combine=combine)


# -- index_add / index_copy / index_fill / masked_fill --------------------------------------------------
def _along(ctx, x, dim, index, src, combine):
    """Scatter of src's slices along dim at positions index (1-D)."""
    b = ctx.b
    if x.rank == 0:
        x = b.reshape(x, [1])
        src = b.reshape(src, [1])
    d = _dim(dim, x.rank)
    n = index.type.numel
    if n == 0 or ctx.out[0].numel == 0:
        return x
    idx = b.reshape(points.to_i64(b, index), [n, 1])
    src = b.reshape(src, x.shape[:d] + (n,) + x.shape[d + 1:])
    return b.scatter(x, idx, src, update_window_dims=[i for i in range(x.rank) if i != d], inserted_window_dims=[d],
                     scatter_dims_to_operand_dims=[d], index_vector_dim=1, combine=combine)


def _along_bounds(error, message, negative_ok=False):
    """`bounds` of an op that indexes x along dim (x, dim, index, ...): CPU's `error`, whose
    `message` may name {dim} and {size} (filled in with the size by the host) besides the bad {value}."""
    def bounds(x, dim, index, *rest):
        d = _dim(dim, x.dim())
        n = x.shape[d] if x.dim() else 1
        return [IndexBound(index, n, error, message.replace("{dim}", str(d)),
                           negative_ok=negative_ok)]
    return bounds


@register("index_add", bounds=_along_bounds(RuntimeError, "index {value} is out of bounds for dimension {dim} with "
                                                          "size {size}"))
def index_add(ctx, x, dim, index, source, alpha=None):
    """x + alpha * source's slices at index, added one by one in x's dtype: CPU rounds alpha * source
    and every addition to a half-precision result, so duplicate indices accumulate as there."""
    b = ctx.b
    dt = ctx.out[0].dtype
    cd = compute_dtype(dt)
    src = b.convert(source, cd)
    if alpha is not None:
        src = b.multiply(src, b.broadcast_to(b.convert(alpha, cd), src.shape))
    return _along(ctx, b.convert(x, dt), dim, index, b.convert(src, dt), points.combine_fn("sum", dt))


@register("index_copy", bounds=_along_bounds(IndexError, "index_copy_(): index {value} is out of bounds for "
                                                         "dimension {dim} with size {size}"))
def index_copy(ctx, x, dim, index, source):
    return _along(ctx, x, dim, index, ctx.b.convert(source, x.dtype), None)


def _index_fill_meta(x, dim, index, value):
    """index_fill's result (as its meta kernel), refusing a complex value for a real tensor as CPU
    does (once per key: the value's dtype is in it)."""
    if isinstance(value, complex) and not x.is_complex():
        raise RuntimeError("index_fill_(): Converting complex Scalar to non-complex type is not supported")
    return meta_result(torch.ops.aten.index_fill, x, dim, index, value)


@register("index_fill.int_Scalar", "index_fill.int_Tensor", meta=_index_fill_meta,
          bounds=_along_bounds(IndexError, "index {value} is out of bounds for dimension {dim} with size {size}",
                               negative_ok=True))
def index_fill(ctx, x, dim, index, value):
    """A select with the mask `position along dim is among index` (no scatter needed)."""
    b = ctx.b
    out = ctx.out[0]
    n = index.type.numel
    if n == 0 or out.numel == 0:
        return x
    d = _dim(dim, x.rank)
    size = x.shape[d] if x.rank else 1
    idx = _wrap(b, b.reshape(points.to_i64(b, index), [1, n]), size)
    hit = b.compare(b.iota((size, n), 0), b.broadcast_in_dim(idx, (size, n), [0, 1]), "EQ")
    hit = b.reduce([hit], [b.constant(False, torch.bool)], [1], lambda sb, a, c: sb.or_(a, c))[0]
    mask = b.broadcast_in_dim(hit, x.shape, [d]) if x.rank else b.reshape(hit, [])
    return b.select(mask, b.broadcast_to(b.convert(value, out.dtype), x.shape), x)


@register("masked_fill.Scalar", "masked_fill.Tensor")
def masked_fill(ctx, x, mask, value):
    b = ctx.b
    shape = ctx.out[0].shape
    dt = ctx.out[0].dtype
    return b.select(b.broadcast_to(b.convert(mask, torch.bool), shape),
                    b.broadcast_to(b.convert(value, dt), shape), b.broadcast_to(b.convert(x, dt), shape))


# -- take / put / masked_scatter ----------------------------------------------------------------------
def _flat_bounds(x, index, *rest):
    n = x.numel()
    return [IndexBound(index, n, IndexError, f"out of range: tried to access index {{value}} on a tensor of {n} "
                       "elements.", negative_ok=True)]


def _flat_index(b, index, n):
    return b.reshape(_wrap(b, points.to_i64(b, index), n), index.shape + (1,))


@register("take", bounds=_flat_bounds)
def take(ctx, x, index):
    b = ctx.b
    e = _empty_out(ctx)
    if e is not None:
        return e
    n = x.type.numel
    return b.gather(b.reshape(x, [n]), _flat_index(b, index, n), [], [0], [0], index.rank, [1], index.shape)


@register("put", bounds=_flat_bounds)
def put(ctx, x, index, source, accumulate=False):
    b = ctx.b
    n = x.type.numel
    k = index.type.numel
    if k == 0 or n == 0:
        return x
    idx = b.reshape(_wrap(b, points.to_i64(b, index), n), [k, 1])
    upd = b.reshape(b.convert(source, x.dtype), [k])
    combine = points.combine_fn("sum", x.dtype) if accumulate else None
    r = b.scatter(b.reshape(x, [n]), idx, upd, [], [0], [0], 1, combine)
    return b.reshape(r, x.shape)


@check_reads('mask')
def _check_masked_scatter(x, mask, source):
    if source.numel() < int(mask.expand(torch.broadcast_shapes(x.shape, mask.shape)).cpu().sum()):
        raise RuntimeError("Number of elements of source < number of ones in mask")


@register("masked_scatter", check=_check_masked_scatter)
def masked_scatter(ctx, x, mask, source):
    """The i-th masked position (row-major) takes source.flatten()[i]: a stable sort of
    (not mask, position) lists masked positions in order; scattering back its iota gives each
    position its rank."""
    b = ctx.b
    out = ctx.out[0]
    n, k = out.numel, source.type.numel
    if n == 0 or k == 0:
        return b.broadcast_to(b.convert(x, out.dtype), out.shape)
    m = b.reshape(b.broadcast_to(b.convert(mask, torch.bool), out.shape), [n])
    key = b.convert(b.not_(m), torch.int32)
    pos = b.iota((n,), 0)
    _, spos = b.sort([key, pos], 0, lambda sb, a0, a1, p0, p1: sb.compare(a0, a1, "LT"), stable=True)
    rank = b.scatter(b.zeros_like(pos), b.reshape(spos, [n, 1]), pos, [], [0], [0], 1)
    rank = b.clamp(b.constant(0, torch.int64), rank, b.constant(k - 1, torch.int64))
    src = b.reshape(b.convert(source, out.dtype), [k])
    picked = b.gather(src, b.reshape(rank, [n, 1]), [], [0], [0], 1, [1], (n,))
    flat = b.reshape(b.broadcast_to(b.convert(x, out.dtype), out.shape), [n])
    return b.reshape(b.select(m, picked, flat), out.shape)


@register("index_reduce", bounds=_along_bounds(IndexError, "index out of range in self"))
def index_reduce(ctx, x, dim, index, source, reduce, include_self=True):
    """scatter_reduce's rules (identity reset when not include_self, mean floors for ints) on slices.
    Half precision accumulates in the result's dtype, each step rounded, as CPU's loop does into self
    (and as index_add): a float32 sum rounded once was 1 ulp off CPU's in bfloat16 and float16; the
    mean's counts too, then the division of the two in float32, rounded once (CPU's div_)."""
    b = ctx.b
    dt = ctx.out[0].dtype
    cd = compute_dtype(dt)
    acc = dt if dt in (torch.float16, torch.bfloat16) else cd
    xc, src = b.convert(x, acc), b.convert(source, acc)
    if not include_self:
        xc = _along(ctx, xc, dim, index, b.constant(_identity(reduce, acc), acc, src.shape), None)
    if reduce != "mean":
        return b.convert(_along(ctx, xc, dim, index, src, points.combine_fn(reduce, acc)), dt)
    add = points.combine_fn("sum", acc)
    total = b.convert(_along(ctx, xc, dim, index, src, add), cd)
    count = _along(ctx, b.constant(1 if include_self else 0, acc, xc.shape), dim, index,
                   b.constant(1, acc, src.shape), add)
    count = b.maximum(b.convert(count, cd), b.constant(1, cd, count.shape))
    if cd.is_floating_point:
        r = b.divide(total, count)
    else:
        r = arith.floor_div_int(b, total, count)
    return b.convert(r, dt)
