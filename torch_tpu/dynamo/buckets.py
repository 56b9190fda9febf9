"""Shape buckets for compiled graphs with symbolic sizes: one program per bucket, not per shape.

A graph Dynamo captured with symbolic sizes (PyTorch's default `dynamic=None` after a size changed,
`dynamic=True`, `mark_dynamic`) is lowered once per *bucket* of its free symbols: each symbol s is
given a bound B(s) (the bucket: the next power of two, at least 16, or the next multiple of a step;
TORCH_TPU_SHAPE_BUCKETS), every tensor is laid out at its bounds, and XLA's bounded dynamic shapes
(`stablehlo.set_dimension_size`: "dimension d holds n valid elements") make every op honour the
true sizes, passed at launch as one int32 operand. XLA's dynamic padder masks reductions, dot
contractions and softmax over the padding, so the valid region equals the per-shape program's.

A tensor with symbolic sizes crosses the program's boundary *compact*: a 1-D buffer of the bucket's
element count whose first numel elements are the tensor in its memory order (relayout.py:
a gather at indices computed from the true sizes). So a graph's outputs are ordinary tpu tensors of
their true shapes (views of the front of a larger storage), and one graph's output feeds the next
graph (forward -> backward) without a copy.

Not every op can read padding safely. `refusal(node, ...)` names what keeps a node from a bucketed
program (a slice along a symbolic dimension from a negative start to anywhere but its end, a split
along one, an in-place write into an input of symbolic size, an op with no rule below); such a graph is compiled per concrete
shape instead, and torch_tpu.metrics.bucket_refusals() says why. Indexing ops (index.Tensor,
index_select, gather) check their indices against the true sizes on the device; ops that read a
window past the true end, order, or write at indices run on static operands with a chosen padding
(FILLED). Random ops draw at the bucket's layout (the same distribution, not the per-shape program's
numbers). A concatenation along a symbolic dimension places each part at a runtime offset.
"""
from __future__ import annotations

import operator

import sympy
import torch
import torch.utils._sympy.functions

from .. import settings

aten = torch.ops.aten

# -- the bucket policy --------------------------------------------------------------------------------


def policy() -> tuple[str, int]:
    """TORCH_TPU_SHAPE_BUCKETS parsed: ("pow2", minimum), ("multiple", step) or ("off", 0).

    Forms: "pow2" (powers of two, at least 16), "pow2:N" (at least N), "multiple:N" (multiples of N,
    as TPU users pad to 128), "off" (one program per concrete shape). ValueError for anything else."""
    raw = (settings.get("TORCH_TPU_SHAPE_BUCKETS") or "pow2").strip().lower()
    kind, _, arg = raw.partition(":")
    try:
        if kind == "off":
            return ("off", 0)
        if kind == "pow2":
            n = int(arg) if arg else 16
        elif kind == "multiple":
            n = int(arg)
        else:
            raise ValueError
        if n < 1:
            raise ValueError
    except ValueError:
        raise ValueError(f"TORCH_TPU_SHAPE_BUCKETS={raw!r}: expected pow2, pow2:N, multiple:N or off") from None
    return (kind, n)


def bucket(value: int, upper: int | None) -> int:
    """The bound a symbol of this value gets under the policy, never above `upper` (the symbol's
    largest value Dynamo allows, e.g. a model's maximum length) nor below the value."""
    kind, n = policy()
    if kind == "pow2":
        b = max(n, 1 << max(0, (value - 1).bit_length()))
    elif kind == "multiple":
        b = -(-value // n) * n
    else:
        b = value
    if upper is not None:
        b = min(b, upper)
    return max(b, value)


def buckets_between(low: int, high: int) -> list[int]:
    """Every bucket a value in [low, high] can fall in, smallest first (torch_tpu.aot compiles one
    program for each): bucket(v, high) for each such v."""
    if low > high:
        raise ValueError(f"an empty range of sizes: [{low}, {high}]")
    out, v = [], max(low, 0)
    while v <= high:
        b = bucket(v, high)
        out.append(b)
        v = b + 1
    return out


def lower_bound(sym, shape_env) -> int:
    """The symbol's smallest value allowed by Dynamo's guards (0 when unknown)."""
    r = shape_env.var_to_range.get(sym) if shape_env is not None else None
    try:
        return max(int(r.lower), 0) if r is not None else 0
    except (TypeError, ValueError, OverflowError, AttributeError):
        return 0


# -- symbols and their expressions ------------------------------------------------------------------


def expr_of(s):
    """The sympy expression of a size or number: an int for a static one."""
    if isinstance(s, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        e = s.node.expr
        return int(e) if e.is_number and e.is_integer else e
    return s


def is_symbolic(s) -> bool:
    return isinstance(expr_of(s), sympy.Basic)


def upper_bound(sym, shape_env) -> int | None:
    """The symbol's largest value allowed by Dynamo's guards, None when unbounded."""
    r = shape_env.var_to_range.get(sym) if shape_env is not None else None
    if r is None:
        return None
    if not getattr(r.upper, "is_finite", False):
        return None
    try:
        up = int(r.upper)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None
    return up if up < (1 << 62) else None


# Max and Min as sympy spells them and as PyTorch's shape expressions do (torch.utils._sympy's own
# classes, not sympy's: x[:, 1:] of a length s has size Max(1, s - 1)).
_MAX = (sympy.Max, torch.utils._sympy.functions.Max)
_MIN = (sympy.Min, torch.utils._sympy.functions.Min)


def _monotone(e) -> bool:
    """True when expression e does not decrease as any symbol grows (so evaluating it at the bounds
    gives a bound of its value): sums and products of such terms with non-negative factors, floor
    division by a positive number, Max/Min of such terms."""
    from torch.utils._sympy.functions import CeilDiv, FloorDiv
    if e.is_number or e.is_Symbol:
        return True
    if e.is_Add:
        return all(_monotone(a) for a in e.args)
    if e.is_Mul:
        consts = [a for a in e.args if a.is_number]
        return all(c >= 0 for c in consts) and all(_monotone(a) for a in e.args if not a.is_number)
    if e.is_Pow:
        return _monotone(e.base) and e.exp.is_Integer and e.exp > 0
    if isinstance(e, (FloorDiv, CeilDiv)):
        return _monotone(e.args[0]) and e.args[1].is_number and e.args[1] > 0
    if isinstance(e, _MAX + _MIN):
        return all(_monotone(a) for a in e.args)
    return False


class Bucketing:
    """One bucket of a graph: each free symbol's bound and its position in the sizes operand.

    `bound(s)`: a size (int or SymInt) evaluated at the bounds (an int); `size_value(b, s)`: the
    program's int32 scalar Value of its true value, built from the sizes operand `operand` (set by the
    lowering) and cached per expression."""

    def __init__(self, sources: dict, bounds: dict):
        """sources: each symbol's place among the graph's inputs (symbol_sources); bounds: its bound."""
        self.sources = dict(sources)
        self.symbols = list(sources)
        self.bounds = {k: sympy.Integer(v) for k, v in bounds.items()}
        self.position = {s: i for i, s in enumerate(self.symbols)}
        self.operand = None
        self._values: dict = {}

    def reset(self) -> None:
        """Forgets the Values of an earlier lowering (a graph lowered again)."""
        self.operand = None
        self._values.clear()

    def values_of(self, args: list) -> dict:
        """Each symbol's value in this call's inputs."""
        return values_of(self.sources, args)

    def bound(self, s) -> int:
        e = expr_of(s)
        if not isinstance(e, sympy.Basic):
            return int(e)
        if not _monotone(e):
            raise NotBucketable(f"the size {e} is not known to grow with its symbols "
                                "(its value at the bounds is not its bound)")
        v = e.xreplace(self.bounds)
        if not v.is_number:
            raise NotBucketable(f"the size {e} has a symbol the graph's inputs do not give")
        return int(v)

    def size_value(self, b, s):
        """The int32 scalar Value of size (or SymInt) s at run time."""
        from torch.utils._sympy.functions import FloorDiv
        e = expr_of(s)
        if not isinstance(e, sympy.Basic):
            return b.constant(int(e), torch.int32)
        got = self._values.get(e)
        if got is not None:
            return got
        if e.is_Symbol:
            if e not in self.position:
                raise NotBucketable(f"the symbol {e} is not a size of the graph's inputs")
            k = self.position[e]
            v = b.reshape(b.slice(self.operand, [k], [k + 1]), ())
        elif e.is_number:
            v = b.constant(int(e), torch.int32)
        elif e.is_Add or e.is_Mul:
            parts = [self.size_value(b, a) for a in e.args]
            v = parts[0]
            for p in parts[1:]:
                v = b.add(v, p) if e.is_Add else b.multiply(v, p)
        elif e.is_Pow and e.exp.is_Integer and e.exp > 0:
            base = self.size_value(b, e.base)
            v = base
            for _ in range(int(e.exp) - 1):
                v = b.multiply(v, base)
        elif isinstance(e, FloorDiv):
            v = b.divide(self.size_value(b, e.args[0]), self.size_value(b, e.args[1]))  # sizes are >= 0
        elif isinstance(e, _MAX + _MIN):
            parts = [self.size_value(b, a) for a in e.args]
            v = parts[0]
            for p in parts[1:]:
                v = b.maximum(v, p) if isinstance(e, _MAX) else b.minimum(v, p)
        else:
            raise NotBucketable(f"the size {e} is not a sum, product, power, floor division, max or min of sizes")
        self._values[e] = v
        return v


    def float_value(self, b, s, dtype):
        """The `dtype` scalar Value of a SymFloat built from sizes at run time (a backward's
        2.0 / ToFloat(n), ToFloat(n) - 1.0: var's divisor), computed in `dtype` (the Scalar operand
        dtype a float gets: float32, float64 in a float64 graph)."""
        from torch.utils._sympy.functions import FloatTrueDiv, IntTrueDiv, ToFloat
        e = expr_of(s)
        if not isinstance(e, sympy.Basic) or e.is_number:
            return b.constant(float(e), dtype)
        if isinstance(e, ToFloat) or e.is_Symbol:
            return b.convert(self.size_value(b, e.args[0] if isinstance(e, ToFloat) else e), dtype)
        if isinstance(e, (FloatTrueDiv, IntTrueDiv)):
            return b.divide(self.float_value(b, e.args[0], dtype), self.float_value(b, e.args[1], dtype))
        if e.is_Add or e.is_Mul:
            parts = [self.float_value(b, a, dtype) for a in e.args]
            v = parts[0]
            for p in parts[1:]:
                v = b.add(v, p) if e.is_Add else b.multiply(v, p)
            return v
        if e.is_Pow and e.exp.is_Integer and e.exp != 0:
            base = self.float_value(b, e.base, dtype)
            v = base
            for _ in range(abs(int(e.exp)) - 1):
                v = b.multiply(v, base)
            return b.divide(b.constant(1.0, dtype), v) if e.exp < 0 else v
        raise NotBucketable(f"the number {e} is not a sum, product, power or quotient of sizes")

    def example(self, s) -> float:
        """A SymFloat's value at the bounds: the example a Scalar operand carries (its type, for
        PyTorch's type promotion)."""
        return float(expr_of(s).xreplace(self.bounds).evalf())


def evaluate(e, values: dict) -> int:
    """A size expression's value for these symbol values."""
    return int(e.xreplace({k: sympy.Integer(v) for k, v in values.items()})) if isinstance(e, sympy.Basic) else int(e)


def symbol_sources(gm) -> dict:
    """Where each free symbol of a graph's inputs is read from at call time: ("size", input, dim) or
    ("int", input). NotBucketable when a symbol has no such place (it appears only in expressions)."""
    sources, needed = {}, set()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, ph in enumerate(placeholders):
        v = ph.meta.get("val")
        if isinstance(v, torch.SymInt):
            e = expr_of(v)
            if isinstance(e, sympy.Symbol):
                sources.setdefault(e, ("int", i))
            elif isinstance(e, sympy.Basic):
                needed |= e.free_symbols
        elif isinstance(v, torch.Tensor):
            for d, s in enumerate(v.shape):
                e = expr_of(s)
                if isinstance(e, sympy.Symbol):
                    sources.setdefault(e, ("size", i, d))
                elif isinstance(e, sympy.Basic):
                    needed |= e.free_symbols
        elif isinstance(v, (torch.SymFloat, torch.SymBool)):
            raise NotBucketable("a symbolic float or bool input")
    missing = needed - set(sources)
    if missing:
        raise NotBucketable(f"the symbols {sorted(map(str, missing))} are not sizes of the graph's inputs")
    return dict(sorted(sources.items(), key=lambda kv: str(kv[0])))


def values_of(sources: dict, args: list) -> dict:
    out = {}
    for sym, src in sources.items():
        out[sym] = int(args[src[1]]) if src[0] == "int" else int(args[src[1]].shape[src[2]])
    return out


def shape_env_of(gm):
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        for s in (v.shape if isinstance(v, torch.Tensor) else [v]):
            if isinstance(s, torch.SymInt):
                return s.node.shape_env
    return None


def memory_order(val, bk: "Bucketing") -> list[int]:
    """The dims of a traced tensor from outermost to innermost in memory (row-major: 0, 1, ...; a
    transposed or channels-last tensor: its permutation), read from its strides at the bounds (a
    comparison of symbolic strides would add guards). Not a permuted dense tensor: row-major."""
    from ..lowering.strided import dense_order
    rank = val.dim()
    order = None
    if rank >= 2:
        order = dense_order([bk.bound(s) for s in val.shape], [bk.bound(s) for s in val.stride()])
    return list(order) if order is not None else list(range(rank))


def keeps_symbolic_dims(src, dst) -> bool:
    """Whether a reshape from sizes `src` to `dst` keeps each symbolic dimension whole and in place
    (the same expression, after dimensions of the same total size): then XLA's own reshape of the
    padded layout is right; splitting or merging one needs a relayout (relayout.py)."""
    def marks(shape):
        out, before = [], sympy.Integer(1)
        for s in shape:
            e = expr_of(s)
            if isinstance(e, sympy.Basic) and not e.is_number:
                out.append((before, e))
            before = sympy.expand(before * e)
        return out
    return marks(src) == marks(dst)


class NotBucketable(NotImplementedError):
    """Why a graph cannot be one program per bucket; it is compiled per shape instead."""


# -- which nodes may read padding ---------------------------------------------------------------------

_SHAPE_OPS = {  # views and copies: symbolic arguments are sizes; results re-marked with their sizes
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
    aten.permute.default, aten.transpose.int, aten.t.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.alias.default, aten.detach.default,
    aten.clone.default, aten._to_copy.default, aten.lift_fresh_copy.default, aten.contiguous.default,
    torch.ops.prims.convert_element_type.default,
}
_FACTORIES = {
    aten.arange.default, aten.arange.start, aten.arange.start_step, aten.ones.default, aten.zeros.default,
    aten.full.default, aten.empty.memory_format, aten.new_zeros.default, aten.new_ones.default,
    aten.new_full.default, aten.new_empty.default, aten.zeros_like.default, aten.ones_like.default,
    aten.full_like.default, aten.empty_like.default, aten.scalar_tensor.default, aten.new_empty_strided.default,
    aten.empty_strided.default,
}
_CONTRACTIONS = {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.matmul.default,
                 aten.baddbmm.default, aten.dot.default}
# Reductions with an identity XLA pads with (the padder masks the padding), and scans and reversals
# along a dimension XLA's padder rewrites for its true size (cumsum, flip). mean's and var's counts are
# the true sizes' product (reduction.py: count_value).
_REDUCTIONS = {aten.sum.dim_IntList, aten.sum.default, aten.amax.default, aten.amin.default,
               aten.any.dim, aten.any.dims, aten.any.default, aten.all.dim, aten.all.dims, aten.all.default,
               aten.mean.dim, aten.mean.default, aten.max.dim, aten.min.dim, aten.max.default, aten.min.default,
               aten.argmax.default, aten.argmin.default, aten.prod.dim_int, aten.prod.default,
               aten.linalg_vector_norm.default, aten.logsumexp.default, aten.var.correction,
               aten.std.correction, aten.var_mean.correction, aten.std_mean.correction,
               aten.cumsum.default, aten.cumprod.default, aten.flip.default}
_ROW_OPS = {  # work along one dimension with reductions (softmax) or per row (losses, norms)
    aten._softmax.default, aten._log_softmax.default, aten._softmax_backward_data.default,
    aten._log_softmax_backward_data.default, aten.nll_loss_forward.default, aten.nll_loss_backward.default,
    aten.tril.default, aten.triu.default, aten.embedding.default, aten.embedding_dense_backward.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    aten._scaled_dot_product_fused_attention_overrideable.default,
    aten._scaled_dot_product_fused_attention_overrideable_backward.default,
}
# (input, normalized_shape) argument positions
_NORMS = {aten.native_layer_norm.default: (0, 1), aten.native_layer_norm_backward.default: (1, 2)}
def _arg(node, i: int, name: str, default):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _ordering_fills(node) -> dict:
    """sort / topk along a symbolic dimension: padding that sorts after every true element (a stable
    sort keeps a true element before padding equal to it): "highest" ascending (NaN, which CPU sorts
    last), "lowest" descending. Along a static dimension padded rows sort on their own: no fill."""
    x = _val(node.args[0])
    if node.target is aten.topk.default:
        dim, descending = _arg(node, 2, "dim", -1), _arg(node, 3, "largest", True)
    elif node.target is aten.sort.default:
        dim, descending = _arg(node, 1, "dim", -1), _arg(node, 2, "descending", False)
    else:  # sort.stable's are keyword-only
        dim, descending = node.kwargs.get("dim", -1), node.kwargs.get("descending", False)
    if dim % max(x.dim(), 1) not in _dynamic_dims(x):
        return {}
    return {0: "lowest" if descending else "highest"}


# Ops that read a window of positions along a symbolic dimension, with PyTorch's implicit padding past
# its end, or order along it: lowered on static operands whose padding holds what PyTorch's does
# (dynamo/lower_graph.py; zeros, "lowest" for a max pool: -inf) or what sorts last, so a window at the
# true end reads what PyTorch's padding gives, a backward sums no padding, and a sort's true elements
# come first. op -> {tensor (or tensor list) argument position: fill}, 0 elsewhere, or a function of
# the node giving that (fills).
FILLED = {aten.convolution.default: {}, aten.convolution_backward.default: {},
          aten.max_pool2d_with_indices.default: {0: "lowest"},
          aten.max_pool2d_with_indices_backward.default: {1: "lowest"},
          aten.avg_pool2d.default: {}, aten.avg_pool2d_backward.default: {},
          aten.sort.default: _ordering_fills, aten.sort.stable: _ordering_fills, aten.topk.default: _ordering_fills,
          # a view write flattens its base and writes at the padded layout's offsets (functional.py),
          # where XLA's reshape of a dynamic dimension would have moved the elements
          aten.slice_scatter.default: {},
          # writes at indices (XLA's dynamic padder misplaced updates into a dynamic operand): a padded
          # index's padding "highest", past every size, so XLA's scatter skips its updates (index_put's
          # negative indices count from the true size first: lower_graph's _wrap_negative)
          **{op: {2: "highest"} for op in (aten.scatter.src, aten.scatter.value, aten.scatter_add.default,
                                           aten.scatter_reduce.two, aten.index_copy.default, aten.index_add.default)},
          aten.index_put.default: {1: "highest"}, aten._index_put_impl.default: {1: "highest"},
          # counted elements: the padding falls outside every bin (its range given: refusal)
          aten.histc.default: {0: "highest"},
          # an MoE's expert products: rows past the last group's offset belong to no group
          aten._grouped_mm.default: {}}


def fills(node) -> dict:
    """{tensor argument position: fill} of a FILLED node: 0, "lowest" or "highest" (bounded.fill_value)."""
    spec = FILLED[node.target]
    return spec(node) if callable(spec) else spec


# A pool's window count or divisor that depends on where the true end is: ceil_mode's last window,
# avg_pool's count_include_pad=False. op -> (ceil_mode position, count_include_pad position)
_POOL_FLAGS = {aten.max_pool2d_with_indices.default: (5, None),
               aten.max_pool2d_with_indices_backward.default: (6, None),
               aten.avg_pool2d.default: (4, 5), aten.avg_pool2d_backward.default: (5, 6)}
_SYM_VALUES = {aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int, aten.sym_storage_offset.default,
               operator.mul, operator.add, operator.sub, operator.floordiv, operator.neg, operator.mod,
               torch.sym_max, torch.sym_min, torch.sym_float, operator.truediv}


def _val(v):
    return v.meta.get("val") if isinstance(v, torch.fx.Node) else v


def _dynamic_dims(t) -> list[int]:
    return [d for d, s in enumerate(t.shape) if is_symbolic(s)] if isinstance(t, torch.Tensor) else []


def _tensors(v):
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors(x)]
    return []


def _static_int(v) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool)) and not isinstance(v, torch.fx.Node)


def refusal(node) -> str | None:
    """Why this FX node cannot run on padded (bucketed) operands, None when it can."""
    target = node.target
    if target in _SYM_VALUES or target is operator.getitem:
        return None
    ins = [t for a in _flat(list(node.args) + list(node.kwargs.values())) for t in _tensors(a)]
    outs = _tensors(node.meta.get("val"))
    dynamic = any(_dynamic_dims(t) for t in ins + outs)
    symbolic_args = any(is_symbolic(_val(a)) for a in _flat(node.args) + _flat(list(node.kwargs.values())))
    name = getattr(target, "__name__", str(target))
    if not dynamic and not symbolic_args:
        return None
    if not isinstance(target, torch._ops.OpOverload):
        return f"{name} has no rule for padded operands"
    if target in _SHAPE_OPS or target in _CONTRACTIONS:
        return None
    if target in _FACTORIES:  # a symbolic start or step is a run-time Scalar operand (lower_graph's scalar)
        return None
    if target is aten.histc.default and _arg(node, 2, "min", 0) == _arg(node, 3, "max", 0):
        return f"{name} with its range from the data"
    if target in _POOL_FLAGS:
        ceil_at, include_at = _POOL_FLAGS[target]
        if len(node.args) > ceil_at and node.args[ceil_at]:
            return f"{name} with ceil_mode=True"
        if include_at is not None and len(node.args) > include_at and not node.args[include_at]:
            return f"{name} with count_include_pad=False"
    if target in _REDUCTIONS or target in _ROW_OPS or target in FILLED:
        return None
    if target in _NORMS:
        xi, ni = _NORMS[target]
        x, normalized = _val(node.args[xi]), node.args[ni]
        first = x.dim() - len(normalized)
        if any(d >= first for d in _dynamic_dims(x)):
            return f"{name} normalizes over a symbolic dimension"
        return None
    if torch.Tag.pointwise in target.tags or target in (
            aten.native_dropout.default, aten.native_dropout_backward.default, aten.floor_divide.default,
            aten.copy.default):
        # (floor_divide and copy, src broadcast to self: elementwise without PyTorch's pointwise tag)
        # Random ops (dropout in training) draw at the bucket's layout: the valid region's numbers are
        # not the per-shape program's, but come from the same distribution, one seed giving the same
        # ones for the same length and bucket (as Inductor's differ from eager's, PyTorch's
        # fallback_random=False).
        return None
    if target in (aten.slice.Tensor, aten.slice_scatter.default):
        x = _val(node.args[0])
        dim = node.args[1 if target is aten.slice.Tensor else 2] if len(node.args) > (1 if target is aten.slice.Tensor else 2) else 0
        dim = dim % max(x.dim(), 1)
        start_i = 2 if target is aten.slice.Tensor else 3
        start = node.args[start_i] if len(node.args) > start_i else None
        step_i = start_i + 2
        step = node.args[step_i] if len(node.args) > step_i else 1
        if dim in _dynamic_dims(x) and not (_static_int(start) and (start or 0) >= 0 and _static_int(step)):
            end_i = start_i + 1
            end = node.args[end_i] if len(node.args) > end_i else None
            out = _tensors(node.meta.get("val"))
            if target is aten.slice.Tensor and _static_int(start) and start < 0 and step == 1 and \
                    (end is None or (_static_int(end) and end >= 2 ** 62)) and dim not in _dynamic_dims(out[0]):
                return None  # the last -start rows (logits[:, -1:]): a window at the true size minus -start
            return f"{name} along a symbolic dimension from a start that is negative or symbolic"
        return None
    if target in (aten.select.int, aten.select_scatter.default):  # select_scatter: select's backward
        at = 1 if target is aten.select.int else 2
        x, dim, index = _val(node.args[0]), node.args[at], node.args[at + 1]
        if dim % x.dim() in _dynamic_dims(x) and not _static_int(index):  # a negative one counts from the true size
            return f"{name} along a symbolic dimension at a symbolic index"
        return None
    if target is aten.cat.default:  # along a symbolic dimension: each part at a runtime offset
        return None
    if target in (aten.split.Tensor, aten.split_with_sizes.default):
        dim = node.args[2] if len(node.args) > 2 else 0
        if dim % max(ins[0].dim(), 1) in {d for t in ins for d in _dynamic_dims(t)}:
            return f"{name} along a symbolic dimension"
        return None
    if target is aten.topk.default and not _static_int(node.args[1]):
        return f"{name} with a symbolic k"
    if target is aten.constant_pad_nd.default:
        if any(not _static_int(p) or p < 0 for p in node.args[1]):
            return f"{name} with a negative or symbolic pad"
        return None
    if target in (aten.index.Tensor, aten.index_select.default, aten.gather.default):
        # Reads and writes at indices checked on the device against the true sizes (their lowerings'
        # `bounds`, dynamo/lower_graph.py): an index into the padding raises CPU's error at the next
        # synchronisation, a negative one (index.Tensor) is wrapped by the true size first, and a
        # padded index of scatter points past every size (its updates are skipped).
        return None
    return f"{name} has no rule for padded operands"


def _flat(args) -> list:
    out = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(_flat(a))
        else:
            out.append(_val(a))
    return out
