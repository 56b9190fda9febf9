"""Element-wise gathers and scatters (one full coordinate per element) and the combiners of
scatter_reduce / index_reduce / embedding_bag, shared by indexing and bags."""
from __future__ import annotations

import torch


def to_i64(b, x):
    """x converted to int64 (the index type of every gather/scatter here)."""
    return b.convert(x, torch.int64)


def coords(b, idx, dim, rank):
    """Full coordinates (idx.shape + (rank,)) of a gather/scatter along `dim`: iota elsewhere."""
    shape = idx.shape
    cols = [idx if d == dim else b.iota(shape, d) for d in range(rank)]
    return b.concatenate([b.reshape(c, shape + (1,)) for c in cols], len(shape))


def point_gather(b, x, coords):
    """x at each full coordinate of `coords` (shape (*S, x.rank)): a Value of shape S."""
    r = x.rank
    return b.gather(x, coords, offset_dims=[], collapsed=list(range(r)), start_index_map=list(range(r)),
                    index_vector_dim=coords.rank - 1, slice_sizes=[1] * r, out_shape=coords.shape[:-1])


def point_scatter(b, x, coords, upd, combine=None):
    """x with `upd` (shape S) written at each full coordinate of `coords` (shape (*S, x.rank)),
    combined with the old value by `combine(b, old, new)` (last write wins without one)."""
    r = x.rank
    return b.scatter(x, coords, upd, update_window_dims=[], inserted_window_dims=list(range(r)),
                     scatter_dims_to_operand_dims=list(range(r)), index_vector_dim=coords.rank - 1,
                     combine=combine)


def host_indices(idx):
    """An index tensor as a flat int64 CPU tensor (for checks that read index values on the host)."""
    return idx.detach().cpu().long().reshape(-1)


def combine_fn(name, dtype):
    """The combiner of reduction `name` ("sum"/"add", "prod"/"multiply", "amax", "amin"; anything else
    replaces) for scatter on `dtype`: bool sums are or, bool products and; NaN wins amax/amin on floats."""
    def fn(b, old, new):
        if name in ("sum", "add"):
            return b.or_(old, new) if dtype == torch.bool else b.add(old, new)
        if name in ("prod", "multiply"):
            return b.and_(old, new) if dtype == torch.bool else b.multiply(old, new)
        if name == "amax":
            r = b.maximum(old, new)
            return b.select(b.is_nan(new), new, r) if dtype.is_floating_point else r
        if name == "amin":
            r = b.minimum(old, new)
            return b.select(b.is_nan(new), new, r) if dtype.is_floating_point else r
        return new
    return fn
