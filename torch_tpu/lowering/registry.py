"""The one lowering registry: ATen op overload -> emitter of StableHLO.

Eager execution (one op per program), and later fused eager and torch.compile, all go through it.
A lowering is registered under the overload whose *value* it computes, normally the functional
one ("add.Tensor"); the eager front-end derives the in-place ("add_.Tensor") and out=
("add.out") variants from it, so each op is written once.

A lowering is called as ``fn(ctx, *args)`` with the overload's arguments in schema order: tensors
and Scalars as `Value`s of the program, everything else (ints, lists, dtypes, bools) as python
values. It returns one Value per tensor output, of the types in ``ctx.out`` (from PyTorch's meta
kernels), as a single Value, a tuple, or a list (for Tensor[] results).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from .. import _C
from .builder import Builder, TensorType, Value


@dataclass
class Lowering:
    name: str                       # overload, e.g. "add.Tensor"
    fn: Callable
    # Runs with the real arguments before the program executes (e.g. index bounds); raises to
    # refuse the call with every tensor unchanged.
    check: Callable | None = None
    # `check` reads only what the call's eager key fixes (dtypes, shapes, non-tensor arguments other
    # than Scalars, whose values the key leaves out): it runs once, when the key's program is built
    # (a call it refuses stores nothing, so each such call raises), and passing calls stay in C++.
    check_per_key: bool = False
    # The overload's `float` arguments (an optimizer's lr, betas, eps, weight decay) are operands, as
    # Scalars are, not keyed by value: one program serves a whole learning-rate schedule.
    float_operands: bool = False
    # False where tpu computes, by decision, dtypes CPU's kernel has none for (histc of integers, as
    # CUDA does): no CPU dtype probe (lowering/signature.py's cpu_dtype_probe) for this op.
    cpu_dtypes: bool = True
    # Random op: its Generator? argument arrives as the (seed, offset) state, a tensor<2xui64> Value;
    # an op with no Generator argument (native_dropout) gets the default one's as a last argument.
    rng: bool = False
    # Random op drawing more generator counters than its outputs have elements (fused attention's
    # dropout mask): (*arguments in schema order, tensors as anything with .shape) -> counters.
    draws: Callable | None = None
    # Rewrites the real arguments (functional overload's, in schema order) before anything else,
    # for arguments no meta kernel can type (bool masks -> long indices, a host sync). Returns the list.
    prepare: Callable | None = None
    # `prepare` is needed only when a tensor-list argument holds a bool/uint8 mask or a CPU tensor
    # (advanced indexing): other calls take the C++ hot path.
    prepare_only_for_masks: bool = False
    # Eager, where the CPU kernel lays its fresh results out otherwise than PyTorch's meta kernel
    # (whose strides are used by default): (meta results, *real arguments) -> per result, the CPU
    # strides, or None to keep the meta's. Helpers: in_format, column_major.
    layout: Callable | None = None
    # Index arguments checked on the device, with no host sync: (*real arguments) -> [IndexBound].
    # Eager programs compute a flag beside their result and write nothing when it is set; the error
    # surfaces at the next synchronisation (debug mode: at the op). May raise for what shapes alone
    # make wrong. Compiled graphs check them on the device too (dynamo/lower_graph.py).
    bounds: Callable | None = None
    # The overload's result on meta (eager) or fake (torch.compile) tensors of tpu arguments, with
    # CPU's errors, where PyTorch's meta kernel is CUDA's and refuses what CPU accepts:
    # (*arguments in schema order) -> result. Tensors of other devices keep PyTorch's meta kernel.
    meta: Callable | None = None
    # Lowered only inside compiled graphs (views, view scatters, factories: functional.py); eager
    # runs these ops as metadata kernels or composites and registers no kernel for them.
    graph_only: bool = False


@dataclass
class IndexBound:
    """One index tensor argument (`index`: the call's own tensor) that must lie in [0, size) (or
    [-size, size) when negative_ok), as CPU checks it; `ignore` is a value exempt from the check
    (nll_loss's ignore_index). `error` and `message` are what CPU raises: the message's {value} is
    the first bad index in flat order, its {size} the size (both filled in by the host from the
    status). `size` is an int, or a SymInt where the bound is a symbolic size (a bucketed graph
    gives its run-time Value)."""
    index: object
    size: object
    error: type
    message: str
    negative_ok: bool = False
    ignore: int | None = None


def bounds_status(b: Builder, bounds: list[IndexBound], value_of: Callable, op: str, status: Value,
                  size_of: Callable | None = None):
    """(failure flag, the device's new status), or (None, None) when no bound applies: the program
    part that checks `bounds` on the device, for eager programs and compiled graphs alike.
    value_of(bound.index) is the index's Value in the program (None: not checked), or (Value, i1
    mask of its shape) where only some elements are the index's (a bucketed graph's padded index:
    the mask marks its true region). size_of(bound.size) is the size's scalar Value where it is not
    an int (a bucketed graph's true size). `status` is the device's status tensor, int64[3] =
    (error id, first bad index, size); the first error since the last synchronisation stays. The
    error ids name `op` ("aten::gather") and CPU's message (csrc/eager/index_errors.h), which the
    host raises at its next synchronisation."""
    i64 = torch.int64
    code, value, size, failed = b.constant(0, i64), b.constant(0, i64), b.constant(0, i64), None
    for bd in reversed(bounds):  # the first bound's error wins, as CPU checks them in order
        got = value_of(bd.index)
        idx, inside = got if isinstance(got, tuple) else (got, None)
        if idx is None or idx.type.numel == 0:
            continue
        n = idx.type.numel
        flat = b.reshape(b.convert(idx, i64), [n])
        limit = b.constant(bd.size, i64) if isinstance(bd.size, int) else b.convert(size_of(bd.size), i64)
        low = b.negate(limit) if bd.negative_ok else b.constant(0, i64)
        bad = b.or_(b.compare(flat, b.broadcast_to(limit, (n,)), "GE"),
                    b.compare(flat, b.broadcast_to(low, (n,)), "LT"))
        if bd.ignore is not None:
            bad = b.and_(bad, b.compare(flat, b.full_like(flat, bd.ignore), "NE"))
        if inside is not None:
            bad = b.and_(bad, b.reshape(inside, [n]))
        pos = b.select(bad, b.iota([n], 0), b.full_like(flat, n))
        first = b.reduce([pos], [b.constant(n, i64)], [0], lambda rb, x, y: [rb.minimum(x, y)])[0]
        hit = b.compare(first, b.constant(n, i64), "LT")
        at = b.reshape(b.dynamic_slice(flat, [b.minimum(first, b.constant(n - 1, i64))], [1]), [])
        ident = _C.eager.register_index_error(op, bd.error is IndexError, bd.message)
        code = b.select(hit, b.constant(ident, i64), code)
        value = b.select(hit, at, value)
        size = b.select(hit, limit, size)
        failed = hit if failed is None else b.or_(hit, failed)
    if failed is None:
        return None, None
    new = b.concatenate([b.reshape(code, [1]), b.reshape(value, [1]), b.reshape(size, [1])], 0)
    earlier = b.compare(b.reshape(b.slice(status, [0], [1]), []), b.constant(0, i64), "NE")
    return failed, b.select(b.broadcast_to(earlier, (3,)), status, new)


REGISTRY: dict[str, Lowering] = {}


def rng_draws(low: Lowering, out_types, args) -> int:
    """Generator counters one call of a random op uses (its offset advances by as many): its
    `draws` rule, else one per output element. `args` in schema order, tensors with .shape."""
    if not low.rng:
        return 0
    if low.draws is not None:
        return int(low.draws(*args))
    return sum(math.prod(t.shape) for t in out_types if t is not None)


def in_format(meta, fmt: torch.memory_format):
    """Strides of a result like `meta` (None stays None) in memory format `fmt`: channels_last(_3d)
    for 4-D (5-D) results, row-major otherwise."""
    if meta is None:
        return None
    ok = {torch.channels_last: 4, torch.channels_last_3d: 5}.get(fmt) == meta.dim()
    return torch.empty(meta.shape, device="meta", memory_format=fmt if ok else torch.contiguous_format).stride()


def column_major(meta):
    """Strides of a batch of column-major matrices of meta's shape (LAPACK's layout on CPU); None
    (the meta's) for fewer than 2 dims."""
    if meta is None or meta.dim() < 2:
        return None
    *batch, m, n = meta.shape
    return torch.empty(*batch, n, m, device="meta").mT.stride()

# Kernels that are not one lowering (host logic for data-dependent result shapes, composite
# wrappers, fallback chains) and meta functions PyTorch lacks: (overload, fn, dispatch key). The
# lowering package only lists them; the ATen layer registers them with the dispatcher
# (eager/register.py), as it does every lowering.
HOST_KERNELS: list[tuple[str, Callable, str]] = []


def host_kernel(name: str, fn: Callable, dispatch_key: str = "PrivateUse1") -> None:
    """Lists `fn` as the `dispatch_key` kernel of aten::`name` ("nonzero"; "PrivateUse1": tpu
    tensors, "Meta": a shape function PyTorch lacks)."""
    HOST_KERNELS.append((name, fn, dispatch_key))


def check_reads(*names: str):
    """Decorator for a `check`: it reads the VALUES of only these arguments (schema names, e.g. the
    index of gather); of the others only shapes and dtypes. A compiled graph then re-runs the check
    (a host sync) only when those arguments' contents may have changed, not when, say, the embedding
    weight an optimizer just updated did."""
    def deco(fn):
        fn.reads = frozenset(names)
        return fn
    return deco


class NotLowered(NotImplementedError):
    """Raised by a lowering for arguments it does not cover (a dtype whose CPU kernel follows a
    different algorithm, e.g. uint8 bilinear resampling): eager runs that call through the counted
    CPU fallback instead, and torch.compile runs the graph eagerly."""


def register(*names: str, check: Callable | None = None, check_per_key: bool = False, rng: bool = False,
             prepare: Callable | None = None, float_operands: bool = False, cpu_dtypes: bool = True,
             layout: Callable | None = None, bounds: Callable | None = None, prepare_only_for_masks: bool = False,
             graph_only: bool = False, meta: Callable | None = None, draws: Callable | None = None):
    """Decorator: registers `fn` as the lowering of each named overload ("aten::" omitted).
    Raises RuntimeError for an overload that already has one (one lowering per op)."""
    def deco(fn):
        for n in names:
            if n in REGISTRY:
                raise RuntimeError(f"two lowerings registered for aten::{n}")
            REGISTRY[n] = Lowering(n, fn, check=check, check_per_key=check_per_key, rng=rng, prepare=prepare,
                                   float_operands=float_operands, cpu_dtypes=cpu_dtypes,
                                   prepare_only_for_masks=prepare_only_for_masks, layout=layout, bounds=bounds,
                                   graph_only=graph_only, meta=meta, draws=draws)
        return fn
    return deco


def lower_arguments(vals, kinds, tensor, scalar, generator, value=None, rng_state=None) -> list:
    """A lowering's arguments from an overload's call (`vals` in schema order), the one conversion
    that eager, fused eager and the graph lowering share. `kinds`: a _C.eager.ArgKind per argument
    (eager/kernel.py's Signature.kinds). Tensors become `tensor(v, i, j)` and Scalars
    `scalar(v, i, j)` (i: the argument's position, j: the element's in a list, else None), a
    Generator `generator(v, i)`, other values `value(v, i)` (default: as they are). A random
    lowering (rng_state given) whose overload has no Generator argument gets the state,
    `rng_state()`, as its last argument."""
    out = []
    for i, (v, kind) in enumerate(zip(vals, kinds)):
        if kind == _C.eager.ArgKind.tensor:
            out.append(tensor(v, i, None))
        elif kind == _C.eager.ArgKind.tensor_list:
            out.append([tensor(t, i, j) for j, t in enumerate(v)])
        elif kind == _C.eager.ArgKind.scalar:
            out.append(scalar(v, i, None))
        elif kind == _C.eager.ArgKind.scalar_list:
            out.append([scalar(s, i, j) for j, s in enumerate(v)])
        elif kind == _C.eager.ArgKind.generator:
            out.append(generator(v, i))
        else:
            out.append(v if value is None else value(v, i))
    if rng_state is not None and _C.eager.ArgKind.generator not in kinds:
        out.append(rng_state())
    return out


class LoweringContext:
    """What a lowering sees besides its arguments: the builder and the result types; in a compiled
    graph with collectives, `span`: the global ranks its program's replicas run (replica k: rank
    span[k]; lowering/collectives.py's replica_span)."""

    def __init__(self, b: Builder, out: list[TensorType], span: list[int] | None = None):
        self.b = b
        self.out = out
        self.span = span

    def promote(self, *args) -> torch.dtype:
        """PyTorch's result dtype of Values / python numbers, with its category rules (a dimensioned
        tensor outranks a 0-dim one, which outranks a python number); torch._prims_common's
        elementwise_dtypes is the reference implementation used here."""
        examples = []
        for a in args:
            if isinstance(a, Value):
                examples.append(a.example if a.example is not None
                                else torch.empty(a.shape, dtype=a.dtype, device="meta"))
            elif a is not None:
                examples.append(a)
        if len(examples) == 2 and (isinstance(examples[0], torch.Tensor) or isinstance(examples[1], torch.Tensor)):
            return torch.result_type(*examples)
        if len(examples) == 1:
            return examples[0].dtype if isinstance(examples[0], torch.Tensor) else torch.tensor(examples[0]).dtype
        return elementwise_dtypes(*examples, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]


def fit(b: Builder, value: Value, type: TensorType) -> Value:
    """A lowering's result made exactly `type` (the meta kernel's): dtype converted, and shape
    reshaped (same element count) or broadcast."""
    if value.dtype != type.dtype:
        value = b.convert(value, type.dtype)
    if value.shape != type.shape:
        value = b.reshape(value, type.shape) if value.type.numel == type.numel else b.broadcast_to(value, type.shape)
    return value
