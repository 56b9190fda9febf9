"""c10d collectives as StableHLO collectives: what each collective of tpu_dist becomes on a plugin with
device collectives (libtpu over ICI and DCN, NCCL inside the CUDA plugin), one program per collective,
shape, dtype, reduce op and group, compiled as one replica on each device of the group.

A program here is "per device": each replica passes its own tensor and gets its own result, as each
rank does with c10d. `groups` are the replica groups, lists of replica indices (positions in the
program's device assignment, pjrt::replica_compile_options): `[[0, ..., n-1]]` for a group of n
ranks compiled over exactly its devices.

Semantics follow c10d's Backend API (Gloo on CPU tensors is the reference; NCCL's where Gloo has
none):
- reduce ops SUM, PRODUCT, MIN, MAX; BAND, BOR, BXOR on integers and bool; AVG (NCCL's: the sum
  divided by the group size, truncating for integers, as tpu_dist's host path does); on bool SUM is
  logical or and PRODUCT logical and (NCCL's mapping: MAX and MIN). PREMUL_SUM is refused, as on the
  host path.
- broadcast: TPU has no collective_broadcast (libtpu: "not implemented on TPU"), so the root's bits
  travel through an all_reduce (max) of the root's bit pattern as an unsigned integer and zeros
  elsewhere: exact for every value (-0.0 and NaN payloads included), one all_reduce of traffic.
- all_gather / reduce_scatter / all_to_all: along dim 0, in group-rank order (all_gather_into_tensor,
  reduce_scatter_tensor, all_to_all_single with equal splits).
- send/recv: collective_permute over (source, target) pairs; a replica that receives nothing gets
  zeros (StableHLO's rule), which the runtime does not write back.

Errors are ValueError / TypeError raised before any program exists, with c10d's words.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .builder import Builder, TensorType, Value
from .registry import NotLowered, register

REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")
_BITWISE = {"band": "and", "bor": "or", "bxor": "xor"}
_BITS = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}


def _groups_attr(groups: Sequence[Sequence[int]]) -> str:
    """replica_groups as StableHLO's dense i64 attribute; every group the same size."""
    n = len(groups[0])
    rows = ", ".join("[" + ", ".join(str(int(r)) for r in g) + "]" for g in groups)
    return f"dense<[{rows}]> : tensor<{len(groups)}x{n}xi64>"


def check_groups(groups: Sequence[Sequence[int]], num_replicas: int) -> list[list[int]]:
    """`groups` validated against the program's `num_replicas`: non-empty, equal sizes, each replica in
    exactly one group (what XLA requires; libtpu aborts the process on some malformed groups instead
    of raising). Returns them as lists of ints."""
    out = [[int(r) for r in g] for g in groups]
    flat = sorted(r for g in out for r in g)
    if not out or not out[0] or len({len(g) for g in out}) != 1:
        raise ValueError(f"replica groups must be non-empty and of one size, got {groups!r}")
    if flat != list(range(num_replicas)):
        raise ValueError(f"replica groups {groups!r} must name each of the program's {num_replicas} replicas "
                         f"(0..{num_replicas - 1}) exactly once")
    return out


def _check_op(op: str, dtype: torch.dtype) -> None:
    if op == "premul_sum":
        raise ValueError("ReduceOp.PREMUL_SUM is not supported; scale the tensor, then use ReduceOp.SUM")
    if op not in REDUCE_OPS:
        raise ValueError(f"unknown reduce op {op!r}; expected one of {', '.join(REDUCE_OPS)}")
    if op in _BITWISE and (dtype.is_floating_point or dtype.is_complex):
        raise TypeError(f"Cannot use ReduceOp.{op.upper()} with {dtype}: bitwise reductions need integer or bool tensors")
    if op == "avg" and dtype == torch.bool:
        raise TypeError("ReduceOp.AVG is not defined for bool tensors")
    if dtype.is_complex and op in ("min", "max"):
        raise TypeError(f"Cannot use ReduceOp.{op.upper()} with {dtype}: complex numbers are not ordered")


def _combiner(op: str, dtype: torch.dtype) -> str:
    """The StableHLO op that combines two elements under `op` (avg: add, divided afterwards)."""
    if dtype == torch.bool:
        return {"sum": "or", "max": "or", "product": "and", "min": "and"}.get(op) or _BITWISE[op]
    return _BITWISE.get(op) or {"sum": "add", "avg": "add", "product": "multiply", "min": "minimum",
                                "max": "maximum"}[op]


def _region(b: Builder, combiner: str, dtype: torch.dtype) -> str:
    scalar = TensorType((), dtype)
    return b.region([scalar, scalar], lambda r, x, y: r.binary(combiner, x, y))


def _average(b: Builder, x: Value, n: int) -> Value:
    """x / n for AVG: float division, or truncating integer division (NCCL's, and the host path's)."""
    return b.divide(x, b.constant(n, x.dtype, x.shape))


def _gathered_reduce(b: Builder, x: Value, groups, combiner: str) -> Value:
    """The group's reduction of `x` as an all_gather and a local reduce: for combiners that XLA's
    collectives do not all run (and, or, xor: the CPU plugin refuses them as reduction computations),
    exact, at n times an all_reduce's traffic."""
    n = len(groups[0])
    rows = b.reshape(x, (1, *x.shape))
    every = b.op("stablehlo.all_gather", [rows], [TensorType((n, *x.shape), x.dtype)],
                 {"all_gather_dim": "0 : i64", "replica_groups": _groups_attr(groups)})[0]
    init = b.constant({"and": -1 if x.dtype != torch.bool else True, "or": 0, "xor": 0}[combiner], x.dtype)
    return b.reduce([every], [init], [0], lambda r, acc, v: [r.binary(combiner, acc, v)])[0]


def all_reduce(b: Builder, x: Value, groups, op: str = "sum") -> Value:
    """The reduction of `x` within each group under c10d reduce op `op` (stablehlo.all_reduce; the
    bitwise ops through _gathered_reduce)."""
    _check_op(op, x.dtype)
    combiner = _combiner(op, x.dtype)
    if combiner in ("and", "or", "xor"):
        return _gathered_reduce(b, x, groups, combiner)
    r = b.op("stablehlo.all_reduce", [x], [x.type], {"replica_groups": _groups_attr(groups)},
             regions=[_region(b, combiner, x.dtype)])[0]
    return _average(b, r, len(groups[0])) if op == "avg" else r


def _group_rank(b: Builder, groups) -> Value:
    """This replica's rank within its group, as a ui32 scalar (a table lookup on stablehlo.replica_id)."""
    rid = b.op("stablehlo.replica_id", [], [TensorType((), torch.uint32)])[0]
    n = sum(len(g) for g in groups)
    table = [0] * n
    for g in groups:
        for rank, r in enumerate(g):
            table[r] = rank
    if table == list(range(n)):
        return rid
    consts = b.op("stablehlo.constant", [], [TensorType((n,), torch.uint32)],
                  {"value": f"dense<[{', '.join(map(str, table))}]> : tensor<{n}xui32>"})[0]
    return b.reshape(b.dynamic_slice(consts, [rid], [1]), ())


def broadcast(b: Builder, x: Value, groups, root: int) -> Value:
    """The value of group rank `root`'s `x` on every replica of its group, bit for bit: an all_reduce
    (max) of the root's bit pattern, as an unsigned integer, and zeros elsewhere."""
    if x.dtype.is_complex:  # no bitcast of complex types: the real and imaginary parts travel apart
        part = torch.float32 if x.dtype == torch.complex64 else torch.float64
        re = broadcast(b, b.unary("real", x, part), groups, root)
        im = broadcast(b, b.unary("imag", x, part), groups, root)
        return b.op("stablehlo.complex", [re, im], [x.type])[0]
    if x.dtype == torch.bool:
        bits = b.convert(x, torch.uint8)
    else:
        bits = b.bitcast_convert(x, _BITS[x.dtype.itemsize]) if x.dtype != _BITS[x.dtype.itemsize] else x
    is_root = b.compare(_group_rank(b, groups), b.constant(root, torch.uint32), "EQ")
    mine = b.select(b.broadcast_to(is_root, bits.shape), bits, b.zeros_like(bits))
    got = b.op("stablehlo.all_reduce", [mine], [mine.type], {"replica_groups": _groups_attr(groups)},
               regions=[_region(b, "maximum", bits.dtype)])[0]
    if x.dtype == torch.bool:
        return b.convert(got, torch.bool)
    return got if got.dtype == x.dtype else b.bitcast_convert(got, x.dtype)


def reduce(b: Builder, x: Value, groups, root: int, op: str = "sum") -> Value:
    """c10d reduce: group rank `root` gets the reduction; the others keep `x`."""
    r = all_reduce(b, x, groups, op)
    is_root = b.compare(_group_rank(b, groups), b.constant(root, torch.uint32), "EQ")
    return b.select(b.broadcast_to(is_root, x.shape), r, x)


def _rows(b: Builder, x: Value) -> Value:
    return b.reshape(x, (1,)) if x.rank == 0 else x


def all_gather(b: Builder, x: Value, groups) -> Value:
    """The group's `x` concatenated along dim 0 in group-rank order (a 0-d x gives a vector)."""
    x = _rows(b, x)
    n = len(groups[0])
    out = TensorType((x.shape[0] * n, *x.shape[1:]), x.dtype)
    return b.op("stablehlo.all_gather", [x], [out], {"all_gather_dim": "0 : i64",
                                                     "replica_groups": _groups_attr(groups)})[0]


def reduce_scatter(b: Builder, x: Value, groups, op: str = "sum") -> Value:
    """Group rank i gets block i (along dim 0, of size x.shape[0] / n) of the group's reduction."""
    _check_op(op, x.dtype)
    n = len(groups[0])
    if x.rank == 0 or x.shape[0] % n:
        raise ValueError(f"reduce_scatter: dim 0 of the input ({tuple(x.shape)}) must divide into {n} equal blocks")
    out = TensorType((x.shape[0] // n, *x.shape[1:]), x.dtype)
    r = b.op("stablehlo.reduce_scatter", [x], [out], {"scatter_dimension": "0 : i64",
                                                      "replica_groups": _groups_attr(groups)},
             regions=[_region(b, _combiner(op, x.dtype), x.dtype)])[0]
    return _average(b, r, n) if op == "avg" else r


def all_to_all(b: Builder, x: Value, groups) -> Value:
    """all_to_all_single with equal splits: block j (dim 0) of group rank i's x becomes block i of
    group rank j's result."""
    n = len(groups[0])
    if x.rank == 0 or x.shape[0] % n:
        raise ValueError(f"all_to_all: dim 0 of the input ({tuple(x.shape)}) must divide into {n} equal blocks")
    return b.op("stablehlo.all_to_all", [x], [x.type], {
        "split_dimension": "0 : i64", "concat_dimension": "0 : i64", "split_count": f"{n} : i64",
        "replica_groups": _groups_attr(groups)})[0]


def permute(b: Builder, x: Value, pairs: Sequence[tuple[int, int]]) -> Value:
    """send/recv: replica `target` gets replica `source`'s x for each (source, target) pair; no replica
    is a source or a target twice."""
    pairs = [(int(s), int(t)) for s, t in pairs]
    if not pairs or len({s for s, _ in pairs}) != len(pairs) or len({t for _, t in pairs}) != len(pairs):
        raise ValueError(f"send/recv pairs {pairs!r}: each replica may send once and receive once")
    rows = ", ".join(f"[{s}, {t}]" for s, t in pairs)
    return b.op("stablehlo.collective_permute", [x], [x.type], {
        "source_target_pairs": f"dense<[{rows}]> : tensor<{len(pairs)}x2xi64>"})[0]


KINDS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "permute")


def program(kind: str, shape: Sequence[int], dtype: torch.dtype, num_replicas: int, *, groups=None,
            op: str = "sum", root: int = 0, pairs=None, buffer_shape: Sequence[int] | None = None) -> str:
    """The StableHLO module of one collective: @main takes one replica's tensor of `shape` and `dtype`
    and returns its result. `num_replicas`: the devices it is compiled for; `groups`: replica groups
    (default: one group of all of them); `op`: a c10d reduce op name in lower case (REDUCE_OPS);
    `root`: the group rank of broadcast/reduce; `pairs`: (source, target) replicas of permute;
    `buffer_shape`: the dims @main takes the tensor in (its storage's buffer; same element count),
    reshaped to `shape` first.
    Raises ValueError/TypeError for what c10d refuses (see the module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r}; expected one of {', '.join(KINDS)}")
    groups = check_groups(groups if groups is not None else [range(num_replicas)], num_replicas)
    if kind in ("broadcast", "reduce") and not 0 <= int(root) < len(groups[0]):
        raise ValueError(f"{kind}: root {root} is not a rank of a group of {len(groups[0])}")
    b = Builder()
    shape = tuple(int(d) for d in shape)
    x = b.arg(TensorType(shape if buffer_shape is None else tuple(int(d) for d in buffer_shape), dtype))
    if x.shape != shape:
        x = b.reshape(x, shape)
    if kind == "all_reduce":
        r = all_reduce(b, x, groups, op)
    elif kind == "reduce":
        r = reduce(b, x, groups, int(root), op)
    elif kind == "broadcast":
        r = broadcast(b, x, groups, int(root))
    elif kind == "all_gather":
        r = all_gather(b, x, groups)
    elif kind == "reduce_scatter":
        r = reduce_scatter(b, x, groups, op)
    elif kind == "all_to_all":
        r = all_to_all(b, x, groups)
    else:
        r = permute(b, x, pairs or [])
    return b.module([r], name=kind)


# -- functional collectives inside compiled graphs -----------------------------------------------------
# PyTorch's functional collectives (`_c10d_functional`, what DTensor, tensor parallelism and user code
# emit under torch.compile) lowered into the graph's own module, for a TPU target (torch_tpu.aot) and at
# run time where tpu_dist has its device path: the graph becomes one program over the devices of the
# ranks that run it (replica_span), and XLA schedules its collectives with its compute. Graph-only:
# eager calls go through tpu_dist. Elsewhere the graph is cut at them instead (dynamo/collectives.py).

def _tiles(group_name: str) -> tuple[list[list[int]], int]:
    """The process group `group_name` (c10d's registry) and the groups that tile the world as it does
    (a DeviceMesh dimension's groups are translations of one another), as global ranks; and the world
    size. Raises ValueError for a group that tiles the world otherwise, or when no process group is
    initialized."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group
    if not dist.is_initialized():
        raise ValueError("a graph with collectives needs an initialized process group (for a TPU target on one "
                         "machine: dist.init_process_group('fake', ...) with the job's world size)")
    ranks = sorted(dist.get_process_group_ranks(_resolve_process_group(group_name)))
    world = dist.get_world_size()
    left, tiles = set(range(world)), []
    while left:
        first = min(left)
        g = [first - ranks[0] + r for r in ranks]
        if not set(g) <= left:
            raise ValueError(f"process group {group_name} (ranks {ranks} of {world}) does not tile the world as a "
                             "DeviceMesh dimension does: its collectives cannot be compiled into one program")
        tiles.append(g)
        left -= set(g)
    return tiles, world


def replica_span(group_names: Sequence[str], rank: int | None = None) -> list[int]:
    """The global ranks that run a graph whose collectives use the groups `group_names`, as this
    rank (default: dist.get_rank()) calls it: the smallest set holding this rank's groups that is
    a union of whole groups of each (a mesh's dimensions give the world; a pipeline stage's group
    alone gives that stage, so other stages, running other programs, are not waited for). Replica
    k of the graph's program runs rank span[k]. Raises ValueError as _tiles does."""
    import torch.distributed as dist
    rank = dist.get_rank() if rank is None else rank
    tilings = [_tiles(name)[0] for name in dict.fromkeys(group_names)]
    span, grown = {rank}, True
    while grown:
        grown = False
        for tiles in tilings:
            for t in tiles:
                if span & set(t) and not set(t) <= span:
                    span |= set(t)
                    grown = True
    return sorted(span)


def group_replicas(group_name: str, span: Sequence[int] | None = None) -> tuple[list[list[int]], int]:
    """(replica groups, replica count) of the process group `group_name` in a program over the global
    ranks `span` (default: the whole world, replica k running rank k): the group and its translates
    inside the span, as replica indices. Raises ValueError as _tiles does."""
    tiles, world = _tiles(group_name)
    span = list(range(world)) if span is None else list(span)
    where = {r: k for k, r in enumerate(span)}
    return [[where[r] for r in t] for t in tiles if t[0] in where], len(span)


def _split_even(sizes, n: int, length: int) -> bool:
    return not sizes or (len(sizes) == n and all(int(s) == length // n for s in sizes))


@register("_c10d_functional::all_reduce", graph_only=True)
def _all_reduce(ctx, x, reduce_op, group_name):
    return all_reduce(ctx.b, x, group_replicas(group_name, ctx.span)[0], reduce_op)


@register("_c10d_functional::all_reduce_coalesced", graph_only=True)
def _all_reduce_coalesced(ctx, xs, reduce_op, group_name):
    groups = group_replicas(group_name, ctx.span)[0]
    return [all_reduce(ctx.b, x, groups, reduce_op) for x in xs]


@register("_c10d_functional::all_gather_into_tensor", "_c10d_functional_autograd::all_gather_into_tensor",
          graph_only=True)
def _all_gather(ctx, x, group_size, group_name):
    return all_gather(ctx.b, x, group_replicas(group_name, ctx.span)[0])


@register("_c10d_functional::all_gather_into_tensor_coalesced", graph_only=True)
def _all_gather_coalesced(ctx, xs, group_size, group_name):
    groups = group_replicas(group_name, ctx.span)[0]
    return [all_gather(ctx.b, x, groups) for x in xs]


@register("_c10d_functional::reduce_scatter_tensor", "_c10d_functional_autograd::reduce_scatter_tensor",
          graph_only=True)
def _reduce_scatter(ctx, x, reduce_op, group_size, group_name):
    return reduce_scatter(ctx.b, x, group_replicas(group_name, ctx.span)[0], reduce_op)


@register("_c10d_functional::reduce_scatter_tensor_coalesced", graph_only=True)
def _reduce_scatter_coalesced(ctx, xs, reduce_op, group_size, group_name):
    groups = group_replicas(group_name, ctx.span)[0]
    return [reduce_scatter(ctx.b, x, groups, reduce_op) for x in xs]


@register("_c10d_functional::all_to_all_single", "_c10d_functional_autograd::all_to_all_single",
          graph_only=True)
def _all_to_all(ctx, x, output_split_sizes, input_split_sizes, group_name):
    groups = group_replicas(group_name, ctx.span)[0]
    n, length = len(groups[0]), (x.shape[0] if x.rank else 0)
    if not (_split_even(output_split_sizes, n, length) and _split_even(input_split_sizes, n, length)):
        raise NotLowered("all_to_all_single with uneven splits inside a graph is not lowered for TPU yet")
    return all_to_all(ctx.b, x, groups)


@register("_c10d_functional::broadcast", graph_only=True)
def _broadcast(ctx, x, src, group_name):
    return broadcast(ctx.b, x, group_replicas(group_name, ctx.span)[0], int(src))


@register("_c10d_functional::wait_tensor", graph_only=True)
def _wait(ctx, x):  # the program orders its collectives itself
    return x
