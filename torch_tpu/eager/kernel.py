"""The eager front-end's Python half: one kernel object per lowered ATen overload.

The dispatcher enters C++ first (csrc/eager/op_kernel.h): it builds the call's key from the
argument stack (csrc/eager/call.h: for each tensor its dtype, sizes, strides, offset and which
storage it lives in; for each Scalar only its type, its value travelling as a runtime operand, so
changing a learning rate never recompiles; every other argument by value) and looks it up in the
plan cache. In strict eager a hit launches there, with no Python. Everything else comes here
(`Kernel._slow`): a miss runs PyTorch's meta kernel (result types, and every shape/dtype error
before anything runs), emits StableHLO through the lowering registry, compiles it, and hands the
entry back to C++ as the plan; debug and fused eager, per-call checks and the CPU fallback run here.

The program reads each storage it needs as its buffer (an array of the storage's dims, runtime.h's
Cell::dims), reads the argument views from its elements in order (lowering/strided.py), computes the
op, and returns new outputs as buffers of their sizes in memory order and written storages as whole
new buffers of the dims they had, which replace the old ones (donated to the program, so in-place
updates do not double memory). Execution is asynchronous: nothing waits for the device here.
"""
from __future__ import annotations

import math
import re
import warnings

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

from .. import _C
from . import state as _state
from ..lowering.builder import Builder, TensorType, Value
from ..lowering.helpers.checks import broadcast_index_shapes, cpp_type_name, scalar_type_name
from ..lowering.registry import Lowering, LoweringContext, NotLowered, bounds_status, fit, lower_arguments, rng_draws
from ..lowering.results import ProgramResults
from ..lowering.signature import ArgKind, Signature, cpu_dtype_probe, cpu_out_dtype_refusal
from ..lowering.signature import tensors_of as _tensors
from ..lowering.strided import dense_order, is_whole, read_view, write_view
from .. import recompiles
from . import meta_memo, plan_memo
from .executables import compile_entry_text, debug_synchronize, executable

KeyPartKind = _C.eager.KeyPartKind


def _key_parts(key, kinds) -> list[list]:
    """Per argument, its parts of a call key (_C.eager.KeyPart, csrc/eager/call.h): one for a tensor,
    Scalar, Generator or value; one per element for a list (whose own part is its length)."""
    it = iter(key)
    out = []
    for kind in kinds:
        if kind in (ArgKind.tensor_list, ArgKind.scalar_list):
            n = next(it).length
            out.append([next(it) for _ in range(n)])
        else:
            out.append([next(it)])
    return out


class _Entry(_C.eager.PlanSpec):
    """What a miss builds for a call key: the typed part C++ caches and runs (_C.eager.PlanSpec:
    exe, order, fresh, sinks, structure, fixed, rng_draws, name; csrc/eager/plan.h) and what only
    Python reads: `resize` (out= arguments to resize first, then the call runs anew: (arg index,
    shape, strides)), the program's text, and for fused eager the program as a private function
    "@__OP__" (fn_text), the private functions it calls (custom kernels), its argument and result
    types."""

    def __init__(self, exe, order, fresh, sinks, structure, *, rng_draws=0, resize=(), fixed=(), text="",
                 name="", fn_text="", functions=(), arg_types=(), result_types=()):
        super().__init__(exe, list(order), list(fresh), list(sinks), structure, tuple(fixed), rng_draws, name)
        self.resize = list(resize)
        self.text = text
        self.fn_text = fn_text
        self.functions = list(functions)
        self.arg_types = list(arg_types)
        self.result_types = list(result_types)


# Marks a key whose lowering raised NotLowered: C++ runs the op on the counted CPU fallback, this
# call and every later one with the key (csrc/aten/fallback.h's run_on_cpu; no Python per call).
ON_HOST = _C.eager.PlanSpec(host=True)


def _note_program(name: str, vals) -> None:
    """Counts a new program of op `name` by its cause (torch_tpu/recompiles.py), from the call's tensors."""
    ts = list(_tensors(vals))
    recompiles.note(name, tuple(t.dtype for t in ts), tuple(tuple(t.shape) for t in ts),
                    tuple(recompiles.layout_of(t) for t in ts))


class _Call:
    """One call as the C++ front-end (csrc/eager/call.h) describes it: its key parts (_C.eager.KeyPart per
    argument in schema order, a list's length part before its elements'), its operands (tpu tensors
    one per storage, CPU tensors, (number, dtype) scalars, generators) and its device."""
    __slots__ = ("key", "operands", "device", "memo_key")

    def __init__(self, key, operands, device, memo_key=None):
        self.key, self.operands, self.device = key, operands, device
        self.memo_key = memo_key  # the meta memo's key (meta_memo.py), None: not remembered


def _apply_bits(b: Builder, v: Value, bits: int) -> Value:
    """The logical value of a view whose storage holds `v` (the bits are involutions, so the same
    function turns a value to write into what is stored)."""
    if bits & 2:
        v = b.negate(v)
    if bits & 1 and v.dtype.is_complex:
        part = TensorType(v.shape, v.dtype.to_real())
        re, im = b.op("stablehlo.real", [v], [part])[0], b.op("stablehlo.imag", [v], [part])[0]
        v = b.op("stablehlo.complex", [re, b.negate(im)], [v.type])[0]
    return v


def _extent(t):
    """[first, last] element offsets that a non-empty view touches in its storage."""
    lo = hi = t.storage_offset()
    for size, stride in zip(t.shape, t.stride()):
        if size > 1:
            if stride > 0:
                hi += (size - 1) * stride
            else:
                lo += (size - 1) * stride
    return lo, hi


# Overloads that may write an expanded view: fill_ and zero_ write one value everywhere (PyTorch's
# fill_ turns TensorIterator's overlap check off: every element at one address gets the same value).
_WRITE_EXPANDED = frozenset({torch.ops.aten.fill_.Scalar, torch.ops.aten.fill_.Tensor, torch.ops.aten.zero_.default,
                             # CPU's threshold kernel builds its TensorIterator without the overlap check
                             # (ReLU's in-place use); applying it twice gives what once does
                             torch.ops.aten.threshold_.default})

# Overloads CPU still runs on an expanded self, with a deprecation warning: an element all of whose
# aliases share one address is written when any alias is selected (the fill value is one value).
_FILL_EXPANDED = frozenset({torch.ops.aten.masked_fill_.Scalar, torch.ops.aten.masked_fill_.Tensor,
                            torch.ops.aten.index_fill_.int_Scalar, torch.ops.aten.index_fill_.int_Tensor})


def _expanded_dims(t) -> list:
    return [d for d, (n, st) in enumerate(zip(t.shape, t.stride())) if st == 0 and n > 1]


def _fill_expanded(overload, vals):
    """masked_fill_ / index_fill_ on an expanded self, as CPU runs them: CPU's deprecation warning,
    then the fill on the compact view (one element per address: the stride-0 dims at size 1), selected
    where any alias is. None where the arguments are left to the op's own errors (an index that is not
    int64)."""
    self_, dims = vals[0], _expanded_dims(vals[0])
    name = overload._schema.name.split("::")[1]
    compact_shape = [1 if d in dims else n for d, n in enumerate(self_.shape)]
    if name == "masked_fill_":
        mask, value = vals[1], vals[2]
        if not isinstance(mask, torch.Tensor):
            return None
        if mask.dtype != torch.bool:  # CPU checks the mask before the overlap
            raise RuntimeError("masked_fill_ only supports boolean masks, but got mask with dtype "
                               f"{cpp_type_name(mask.dtype)}")
        warnings.warn(_EXPANDED_WARNING.format(name), UserWarning, stacklevel=3)
        compact = self_.as_strided(compact_shape, self_.stride(), self_.storage_offset())
        compact.masked_fill_(torch.broadcast_to(mask, self_.shape).any(dim=dims, keepdim=True), value)
        return self_
    dim, index, value = vals[1], vals[2], vals[3]
    if not isinstance(index, torch.Tensor) or index.dtype != torch.int64:
        return None
    warnings.warn(_EXPANDED_WARNING.format(name), UserWarning, stacklevel=3)
    d = dim % max(self_.dim(), 1)
    compact = self_.as_strided(compact_shape, self_.stride(), self_.storage_offset())
    if d in dims:  # every index names the one address: bounds checked against the expanded size
        size = self_.shape[d]
        host = index.reshape(-1).cpu()
        bad = host[(host >= size) | (host < -size)]
        if bad.numel():
            raise IndexError(f"index {int(bad[0])} is out of bounds for dimension {d} with size {size}")
        index = torch.zeros_like(index)
    compact.index_fill_(d, index, value)
    return self_


_EXPANDED_WARNING = ("Use of {} on expanded tensors is deprecated. Please clone() the tensor before performing "
                     "this operation. This also applies to advanced indexing e.g. tensor[mask] = scalar")


# Ops that write through indices: CPU's kernels assert no overlap at all (assert_no_overlap) between
# the written tensor and the index or source, where TensorIterator allows exactly the same view.
_INDEXED_WRITES = frozenset(f"aten::{n}" for n in (
    "index_copy", "index_add", "index_fill", "index_reduce", "scatter", "scatter_add", "scatter_reduce",
    "index_select", "index_put", "_index_put_impl", "put", "take"))


def _check_overlap(vals, sig):
    """PyTorch's memory-overlap rules for written tensors (TensorIterator's check_mem_overlap):
    no written tensor may have several elements at one address (an expanded view; fill_ and zero_
    may), and an input may share memory with a written tensor only as exactly the same view."""
    written = [t for i in sig.written for t in (vals[i] if isinstance(vals[i], list) else [vals[i]])
               if isinstance(t, torch.Tensor) and t.numel() > 0]
    if not written:
        return
    for w in written:
        if sig.overload not in _WRITE_EXPANDED and any(st == 0 and n > 1 for n, st in zip(w.shape, w.stride())):
            raise RuntimeError("unsupported operation: more than one element of the written-to tensor refers to a "
                               "single memory location. Please clone() the tensor before performing the operation.")
    inputs = [t for i, v in enumerate(vals) if i not in sig.written
              for t in (v if isinstance(v, list) else [v]) if isinstance(t, torch.Tensor) and not t.is_cpu]
    for w in written:
        wk, (wlo, whi) = _C.device.storage_key(w), _extent(w)
        for u in inputs:
            if u.numel() == 0 or _C.device.storage_key(u) != wk:
                continue
            if not (is_non_overlapping_and_dense(u) and is_non_overlapping_and_dense(w)):
                continue  # CPU's get_overlap_status calls that "too hard" and lets it run
            same = (u.storage_offset(), u.shape, u.stride()) == (w.storage_offset(), w.shape, w.stride())
            same = same and sig.overload._schema.name.rstrip("_") not in _INDEXED_WRITES
            lo, hi = _extent(u)
            if not same and lo <= whi and wlo <= hi:
                raise RuntimeError("unsupported operation: some elements of the input tensor and the written-to "
                                   "tensor refer to a single memory location. Please clone() the tensor before "
                                   "performing the operation.")


def _check_inplace_result(vals, sig, value_meta):
    """An in-place op computed as its functional form writes that result into self: PyTorch refuses
    a result that would grow self (x.eq_(y) where x and y broadcast to a larger shape) and a result
    type that cannot be cast to self's dtype safely (bool_t.mul_(float_t)), in that order, with
    TensorIterator's messages; meta kernels check neither."""
    written = [t for i in sig.written for t in (vals[i] if isinstance(vals[i], list) else [vals[i]])]
    for w, m in zip(written, value_meta):
        if not (isinstance(w, torch.Tensor) and isinstance(m, torch.Tensor)):
            continue
        if tuple(m.shape) != tuple(w.shape):
            try:
                grown = tuple(torch.broadcast_shapes(w.shape, m.shape)) != tuple(w.shape)
            except RuntimeError:
                grown = True
            if grown:
                raise RuntimeError(f"output with shape {list(w.shape)} doesn't match the broadcast shape "
                                   f"{list(m.shape)}")
        if not torch.can_cast(m.dtype, w.dtype):
            raise RuntimeError(f"result type {scalar_type_name(m.dtype)} can't be cast to the desired output type "
                               f"{scalar_type_name(w.dtype)}")


def _mm_message(meta: str, args=()) -> str:
    """CPU's mm/addmm/linear shape error from meta's "a and b must have same reduction dim, but got
    [N, M1] X [M2, P].": "mat1 and mat2 shapes cannot be multiplied (NxM1 and M2xP)"."""
    shapes = re.findall(r"\[(-?\d+), (-?\d+)\]", meta)
    if len(shapes) != 2:
        return meta
    (n, m1), (m2, p) = shapes
    return f"mat1 and mat2 shapes cannot be multiplied ({n}x{m1} and {m2}x{p})"


def _broadcast_message(meta: str, args=()) -> str:
    """CPU's "output with shape [3] doesn't match the broadcast shape [2, 3]" from the refs' "output
    with shape torch.Size([3]) doesn't match the broadcast shape (2, 3)"."""
    got = re.fullmatch(r"output with shape torch\.Size\(\[([\d, ]*)\]\) doesn't match the broadcast shape \(([\d, ]*?),?\)",
                       meta)
    if not got:
        return meta
    return f"output with shape [{got[1]}] doesn't match the broadcast shape [{got[2]}]"


def _alpha_message(meta: str, args=()) -> str:
    """CPU's alpha_check words from the refs' "alpha argument of type <class 'float'> cannot be safely
    cast to type <class 'int'>!" (add / sub with an alpha of a kind the tensors cannot take)."""
    m = re.search(r"of type <class '(\w+)'> cannot be safely cast to type <class '(\w+)'>", meta)
    if m is None:
        return meta
    if m[2] in ("int", "bool") and m[1] in ("float", "complex"):  # CPU checks integral results first
        return "For integral input tensors, argument alpha must not be a floating point number."
    if m[1] == "complex":
        return "For non-complex input tensors, argument alpha must not be a complex number."
    return meta


def _mv_message(meta: str, args=()) -> str:
    """CPU's mv shape error (its addmv names the result too) from the decomposition's "size mismatch,
    got input (MxN), vec (K)": "size mismatch, got input (M), mat (MxN), vec (K)"."""
    got = re.fullmatch(r"size mismatch, got input \((\d+)x(\d+)\), vec \((\d+)\)", meta)
    if got is None:
        return meta
    m, n, k = got.groups()
    return f"size mismatch, got input ({m}), mat ({m}x{n}), vec ({k})"


def _index_broadcast_message(meta: str, args=()) -> str | None:
    """CPU's IndexError for advanced indexing's index tensors that do not broadcast together, where
    the meta's broadcast names one mismatch only: the call's index list (index, index_put_, ...: a
    tensor, then a list of index tensors or None) gives every shape. None for any other call."""
    if len(args) == 1 and isinstance(args[0], list):  # sig.invoke's one argument: the call's values
        args = args[0]
    if len(args) < 2 or not isinstance(args[0], torch.Tensor) or not isinstance(args[1], (list, tuple)):
        return None
    indices = [i for i in args[1] if i is not None]
    if not indices or not all(isinstance(i, torch.Tensor) and not i.is_floating_point() for i in indices):
        return None
    try:
        broadcast_index_shapes([i.shape for i in indices])
    except IndexError as e:
        return str(e)
    return None


def _size_mismatch_message(meta: str, args=()) -> str | None:
    """CPU's words for operands that do not broadcast (TensorIterator's infer_size: "The size of tensor
    a (2) must match the size of tensor b (3) at non-singleton dimension 0") from the refs' "Attempting
    to broadcast a dimension of length 3 at -1! ... broadcastable to [2]": a is the broadcast of the
    operands before, b the one that does not fit, the dimension counted from the left of the result."""
    m = re.match(r"Attempting to broadcast a dimension of length (\d+) at (-\d+)!.*broadcastable to \[([\d, ]*)\]",
                 meta, re.S)
    if m is None:
        return None
    b, at, common = int(m[1]), int(m[2]), [int(v) for v in m[3].split(",") if v.strip()]
    if -at > len(common):
        return None
    return (f"The size of tensor a ({common[at]}) must match the size of tensor b ({b}) at non-singleton "
            f"dimension {len(common) + at}")


_UNSAFE_OUT = re.compile(r"Attempting to cast from torch\.(\w+) to out tensor with dtype torch\.(\w+), but this can't be "
                         r"cast because it is not safe!")


def _cat_out_message(meta: str, args=()) -> str | None:
    """torch.cat's own TypeError for an out= dtype its inputs cannot be cast to safely ("torch.cat():
    input types can't be cast to the desired output type Byte"), from the refs' "Attempting to cast
    from torch.float32 to out tensor with dtype torch.uint8 ..." (cat takes a list of tensors first).
    None for other ops: cpu_out_dtype_refusal gives each its CPU words from that RuntimeError."""
    m = _UNSAFE_OUT.fullmatch(meta)
    if len(args) == 1 and isinstance(args[0], list):  # sig.invoke's one argument: the call's values
        args = args[0]
    if m is None or not args or not isinstance(args[0], (list, tuple)) or \
            not all(isinstance(t, torch.Tensor) for t in args[0]):
        return None
    return f"torch.cat(): input types can't be cast to the desired output type {scalar_type_name(getattr(torch, m[2]))}"


def _inplace_promotion_message(meta: str, args=()) -> str | None:
    """CPU's "result type Float can't be cast to the desired output type Int" for an in-place add_ /
    sub_ whose result type self cannot hold, where the refs say "Promotion of int.add/sub_(float) in
    in-place ops are not possible due to element size change."."""
    if len(args) == 1 and isinstance(args[0], list):  # sig.invoke's one argument: the call's values
        args = args[0]
    if len(args) < 2 or not isinstance(args[0], torch.Tensor):
        return None
    try:
        result = torch.result_type(args[0], args[1])
    except (TypeError, RuntimeError):
        return None
    return f"result type {scalar_type_name(result)} can't be cast to the desired output type {scalar_type_name(args[0].dtype)}"


# Errors PyTorch's meta kernels, refs and decompositions raise with another type or message than its
# device kernels (CPU's, the reference): (meta's type, the message's start) -> (CPU's type, CPU's
# message: None for meta's, a string, or a function of meta's message and the meta call's arguments
# that returns None where its entry does not apply). The first entry that applies wins.
_META_ERRORS = (
    (RuntimeError, "tensors used as indices must be", IndexError, None),  # TORCH_CHECK_INDEX on CPU
    (ValueError, "clamp called but both min and max are none", RuntimeError,
     "torch.clamp: At least one of 'min' or 'max' must not be None"),
    (RuntimeError, "a and b must have same reduction dim", RuntimeError, _mm_message),
    (RuntimeError, "size mismatch, got input (", RuntimeError, _mv_message),
    # nll_loss's decompositions assert where CPU's TORCH_CHECKs (and add ", got 2D").
    (AssertionError, "0D or 1D target tensor expected, multi-target not supported", RuntimeError,
     "0D or 1D target tensor expected, multi-target not supported"),
    (AssertionError, "input tensor should be 1D or 2D", RuntimeError, "input tensor should be 1D or 2D"),
    (AssertionError, "weight tensor should be defined either for all", RuntimeError,
     lambda meta, args: re.sub(r"torch\.Size\((\[[\d, ]*\])\)", r"\1", meta)),
    (RuntimeError, "inconsistent tensor size, expected tensor [", RuntimeError,
     lambda meta, args: meta.replace("to have thesame number", "to have the same number")),  # dot's meta
    # an in-place op that would grow self: PyTorch's refs print torch.Size and a tuple
    (RuntimeError, "output with shape torch.Size(", RuntimeError, _broadcast_message),
    (ValueError, "alpha argument of type", RuntimeError, _alpha_message),
    (RuntimeError, "shifts and dimensions must align", RuntimeError, lambda meta, args: meta.replace("dims: ", "dims:")),
    # addcdiv's meta raises its message as a tuple of the pieces (CPU's text, one string)
    (RuntimeError, "('Integer division with addcdiv", RuntimeError,
     "Integer division with addcdiv is no longer supported, and in a future  release addcdiv will perform a "
     "true division of tensor1 and tensor2. The historic addcdiv behavior can be implemented as (input + "
     "value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as (input + value * "
     "tensor1 / tensor2) for float inputs. The future addcdiv behavior is just the latter implementation: "
     "(input + value * tensor1 / tensor2), for all dtypes."),
    (RuntimeError, "Attempting to cast from torch.", TypeError, _cat_out_message),
    (RuntimeError, "Promotion of ", RuntimeError, _inplace_promotion_message),
    # the refs' words with Python dtype names ("result type torch.float32 can't be cast ..."): c10's
    (RuntimeError, "result type torch.", RuntimeError,
     lambda meta, args: re.sub(r"torch\.(\w+)", lambda m: scalar_type_name(getattr(torch, m[1], None)) if
                               isinstance(getattr(torch, m[1], None), torch.dtype) else m[0], meta)),
    (RuntimeError, "Attempting to broadcast a dimension of length", IndexError, _index_broadcast_message),
    (RuntimeError, "Attempting to broadcast a dimension of length", RuntimeError, _size_mismatch_message),
)


def _meta_call(fn, *args):
    """(fn(*args), whether it warned): a meta computation as _as_cpu_raises runs it, its warnings
    shown as they were issued (after the filters chose them) and noted, since the meta memo keeps
    only calls that warn nothing (a warm process would not show them)."""
    caught = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            result = _as_cpu_raises(fn, *args)
    finally:
        for w in caught:
            warnings._showwarnmsg(w)  # the filters already passed it: shown as warn() would show it
    return result, bool(caught)


def _cpu_scalars_as_meta(args):
    """args with each CPU 0-dim tensor (in lists too) as a meta one of its dtype; None if there is none."""
    found = []

    def conv(v):
        if isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dim() == 0:
            found.append(v)
            return torch.empty((), dtype=v.dtype, device="meta")
        if isinstance(v, list):
            return [conv(x) for x in v]
        return v
    out = [conv(a) for a in args]
    return out if found else None


def _as_cpu_raises(fn, *args):
    """fn(*args) (a meta computation), with its errors of _META_ERRORS raised as CPU raises them
    (a message function is given the meta's text and fn's arguments, and returns None where its entry
    does not apply: the next one is tried)."""
    try:
        try:
            return fn(*args)
        except RuntimeError as e:
            # A CPU 0-dim tensor beside tpu ones is a scalar (PyTorch lets it cross devices), but
            # some meta kernels refuse it beside meta tensors ("Expected divisor (b) to be on the same
            # device (cpu) as dividend (a), but it is found on meta!": copysign, floor division).
            scalars = _cpu_scalars_as_meta(args)
            if "to be on the same device (cpu)" not in str(e) or scalars is None:
                raise
            return fn(*scalars)
    except (RuntimeError, ValueError, AssertionError) as e:
        for meta_type, start, cpu_type, message in _META_ERRORS:
            if type(e) is meta_type and str(e).startswith(start):
                text = str(e) if message is None else message if isinstance(message, str) else message(str(e), args)
                if text is not None:
                    raise cpu_type(text) from None
        raise


# The range factories whose out= C++ sizes (csrc/eager/range_out.cc's range_out_of).
_RANGE_OUTS = frozenset({"aten::arange.start_out", "aten::linspace.out"})


class Kernel:
    """The PrivateUse1 kernel of one overload `K`, computing its value with the lowering of `F`
    (F is K itself, or the functional overload whose value K writes in place / into out=)."""

    def __init__(self, overload, lowering: Lowering, value_overload, host_inputs=False):
        self.sig = Signature(overload, lowering.float_operands)
        self.fsig = Signature(value_overload, lowering.float_operands) if value_overload is not overload else self.sig
        self.lowering = lowering
        self.host_inputs = host_inputs
        # The ATen overload name ("aten::add.Tensor"), as the C++ kernel, errors and profiler traces name it.
        self.name = overload._schema.name + ("" if overload._overloadname == "default" else "." + overload._overloadname)
        # Where F's arguments are among K's (by name).
        self.f_index = [self.sig.names.index(n) for n in self.fsig.names]
        # A range factory's out=: C++ gives it CPU's size before the call is keyed (csrc/eager/range_out.h).
        self.range_out = self.name in _RANGE_OUTS

    def register(self, dispatch: bool = True) -> None:
        """Creates this kernel's C++ front-end and registers it with the dispatcher for tpu tensors
        (dispatch=False: callable from Python only, e.g. copy_'s device-side copy)."""
        ov = self.sig.overload
        low = self.lowering
        self.id = _C.eager.register_op_kernel(
            ov._schema.name, ov._overloadname, self.sig.kinds, self.host_inputs,
            low.rng and ArgKind.generator not in self.sig.kinds, low.check is not None and not low.check_per_key,
            low.prepare is not None, low.prepare_only_for_masks, low.bounds is not None, dispatch, self)

    # ------------------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        """The Python entry (the dispatcher enters C++ first): arguments rewritten by the lowering's
        `prepare`, then keyed and run by the C++ front-end like any call."""
        vals = self.sig.bind(args, kwargs)
        if self.lowering.prepare is not None:
            for i, v in zip(self.f_index, self.lowering.prepare(*[vals[i] for i in self.f_index])):
                vals[i] = v
        return _C.eager.run_op_kernel(self.id, vals)

    def _slow(self, args, kwargs, key, operands, device, entry, key_words=None):
        """A call the C++ fast path does not take: a cache miss (entry None: meta, lowering, compile),
        debug eager, a per-call check, the CPU fallback. Returns (result, the new entry for the plan
        cache or None, the entry C++ runs or None). C++ runs every op program (strict, debug and
        fused alike, csrc/eager/op_kernel.cc's OpKernel::slow, and the CPU fallback for a key the
        lowering refuses: ON_HOST); Python returns a result itself only for an expanded fill and an
        out= resize. key_words: the key after the op's id, as bytes (None for a call the plan cache
        does not keep), which keys the meta memo."""
        vals = self.sig.bind(args, kwargs)
        if self.sig.overload in _FILL_EXPANDED and _expanded_dims(vals[0]):
            done = _fill_expanded(self.sig.overload, vals)
            if done is not None:
                return done, None, None
        call = _Call(key, operands, device, meta_memo.MetaMemo.key(self.name, key_words))
        store = None
        if entry is None:
            try:
                entry = self._recall(call) or self._build_and_keep(vals, call)
                if not entry.resize:
                    _note_program(self.name, vals)
            except NotLowered:
                entry = ON_HOST
            except RuntimeError as e:
                # PyTorch's Python meta / reference kernels refuse some dtypes with a RuntimeError
                # ("torch.bool not supported for floor_divide") where CPU's kernel raises
                # NotImplementedError: CPU's answer wins.
                cpu_dtype_probe(self.lowering, self.sig, vals, self.host_inputs)
                if self.sig.is_out and self.lowering.cpu_dtypes and not self.host_inputs:
                    cpu_out_dtype_refusal(self.sig, vals, meta_error=e)
                unsafe = _UNSAFE_OUT.fullmatch(str(e))
                if unsafe and self.sig.written and not self.sig.is_out:  # an in-place op (sin_ of ints)
                    src, dst = (scalar_type_name(getattr(torch, n)) for n in unsafe.groups())
                    raise RuntimeError(f"result type {src} can't be cast to the desired output type {dst}") from None
                raise
            if entry is ON_HOST or not entry.resize:
                store = entry
        if entry is ON_HOST:
            return None, store, ON_HOST
        if entry.resize:  # out= tensors of the wrong shape: resize (as PyTorch does), then run anew
            for i, shape, strides in entry.resize:
                vals[i].resize_(shape)
                if strides is not None:
                    vals[i].as_strided_(shape, strides)
            return _C.eager.run_op_kernel(self.id, vals), None, None
        if self.lowering.check is not None and not self.lowering.check_per_key:
            self.lowering.check(*[vals[i] for i in self.f_index])
        if _state.eager_mode() != "fused":
            executable(entry)  # strict and debug run the op's own program (fused eager builds its own)
        return None, store, entry

    def _recall(self, call: _Call):
        """The entry an earlier process built for this call's key (plan_memo), ready to run, or None."""
        entry = plan_memo.recall(call.memo_key, self.name, _Entry)
        if entry is not None:
            _state.last_program_text = entry.text
            if _state.eager_mode() != "fused":
                entry.exe = compile_entry_text(self.name, entry.text, entry.result_types)
        return entry

    def _build_and_keep(self, vals, call: _Call) -> _Entry:
        """_build, keeping the entry for later processes (plan_memo) when the build warned nothing
        (as the meta memo's rule, _meta_call): a warning must be shown again where the build runs."""
        caught = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                entry = self._build(vals, call)
        finally:
            for w in caught:
                warnings._showwarnmsg(w)  # the filters already passed it: shown as warn() would show it
        if not caught:
            plan_memo.keep(call.memo_key, self.sig.overload, entry)
        return entry

    def _debug_synchronize(self, operands, device):
        """Debug eager, after C++ queued this op's program: waits for it (operands: the call's, for the
        error message)."""
        debug_synchronize(self.name, operands, device)

    def _bounds_status(self, b, f_vals, lowered, status):
        """(this op's failure flag, the device's new status) for the lowering's index bounds."""
        by_id = {}
        for real, low in zip(f_vals, lowered):
            if isinstance(real, list):
                for r, v in zip(real, low):
                    by_id[id(r)] = v
            else:
                by_id[id(real)] = low
        return bounds_status(b, self.lowering.bounds(*f_vals), lambda t: by_id.get(id(t)), self.name, status)

    def _cpu_strides(self, value_meta, f_vals):
        """Per functional result: the strides CPU gives it (the meta kernel's, or the lowering's
        layout hook where the CPU kernel differs); None for an undefined result."""
        strides = [m.stride() if isinstance(m, torch.Tensor) else None for m in value_meta]
        if self.lowering.layout is not None:
            cpu = self.lowering.layout(value_meta, *f_vals)
            strides = [m if c is None else c for m, c in zip(strides, cpu)]
        return strides

    def _resized_layouts(self, resize, vals, meta_vals):
        """(arg index, shape, strides or None) for out= tensors PyTorch resizes: a structured
        kernel restrides a resized out= tensor to the layout its functional result would have."""
        sig = self.sig
        if self.fsig is sig or any(sig.kinds[i] != ArgKind.tensor for i in sig.written):
            return [(i, shape, None) for i, shape in resize]
        f_vals = [vals[i] for i in self.f_index]
        value_meta = self.fsig.invoke(meta_vals(f_vals, [sig.kinds[i] for i in self.f_index]))
        value_meta = [value_meta] if isinstance(value_meta, torch.Tensor) else list(value_meta)
        if len(value_meta) != len(sig.written):
            return [(i, shape, None) for i, shape in resize]
        by_arg = dict(zip(sig.written, self._cpu_strides(value_meta, f_vals)))
        out = []
        for i, shape in resize:
            st = by_arg.get(i)
            dense = st is not None and math.prod(shape) > 0 and dense_order(shape, st) is not None
            out.append((i, shape, tuple(st) if dense else None))
        return out

    # ------------------------------------------------------------------------------------------
    def _build(self, vals, call: _Call) -> _Entry:
        sig, fsig = self.sig, self.fsig
        # 1. Meta: result types and every error, before anything runs.
        metas = {}

        def meta(t):
            if t is None or not isinstance(t, torch.Tensor):
                return t
            if t.device.type == "cpu":
                return t
            m = metas.get(id(t))
            if m is None:
                m = metas[id(t)] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
            return m

        def meta_vals(vs, kinds):
            out = []
            for v, kind in zip(vs, kinds):
                if kind == ArgKind.tensor:
                    out.append(meta(v))
                elif kind == ArgKind.tensor_list:
                    out.append([meta(t) for t in v])
                elif kind == ArgKind.generator:
                    out.append(None)
                else:
                    out.append(v)
            return out

        # A key an earlier call (of this process or one before) ran meta for: its result types
        # ("written": an in-place op's meta accepted it; else (structure, meta tensors)).
        known = meta_memo.recall(call.memo_key, written=fsig is sig and bool(sig.written))
        warned = False
        k_meta = meta_vals(vals, sig.kinds)
        resize = []
        if sig.written:
            _check_overlap(vals, sig)
            if known is not None:
                pass
            elif self.lowering.meta is not None and fsig is sig:  # an in-place op lowered as itself
                warned = _meta_call(self.lowering.meta, *k_meta)[1]
            elif not self.range_out:  # (sized and checked in C++ as CPU does; meta's ref differs)
                # raises what CPU would (broadcast into self, unsafe casts...)
                warned = _meta_call(sig.invoke, k_meta)[1]
            if sig.is_out:
                for i in sig.written:
                    if sig.kinds[i] == ArgKind.tensor and tuple(k_meta[i].shape) != tuple(vals[i].shape):
                        resize.append((i, tuple(k_meta[i].shape)))
                if resize:
                    if self.lowering.check is not None and self.lowering.check_per_key:
                        self.lowering.check(*[vals[i] for i in self.f_index])  # refused: out keeps its shape, as on CPU
                    return _Entry(None, [], [], [], _C.eager.ResultStructure.written,
                                  resize=self._resized_layouts(resize, vals, meta_vals))
        f_vals = [vals[i] for i in self.f_index]
        f_kinds = [sig.kinds[i] for i in self.f_index]
        if fsig is sig and sig.written:
            value_meta = [k_meta[i] for i in sig.written]
            value_meta = [x for v in value_meta for x in (v if isinstance(v, list) else [v])]
            structure = _C.eager.ResultStructure.written
            written = [x for i in sig.written for x in (vals[i] if isinstance(vals[i], list) else [vals[i]])]
            if known is None and not warned and \
                    [meta_memo.tensor_record(m) for m in value_meta] == [meta_memo.tensor_record(t) for t in written]:
                meta_memo.MEMO.put(call.memo_key, "written")  # (meta restrided nothing)
        elif known is not None:
            structure, value_meta = _C.eager.ResultStructure(known[0]), known[1]
        else:
            f_meta = meta_vals(f_vals, f_kinds)
            value_meta, warned_f = _meta_call(self.lowering.meta, *f_meta) if self.lowering.meta else \
                _meta_call(fsig.invoke, f_meta)
            if isinstance(value_meta, torch.Tensor):
                structure, value_meta = _C.eager.ResultStructure.one, [value_meta]
            elif isinstance(value_meta, list):
                structure = _C.eager.ResultStructure.list
            else:
                structure, value_meta = _C.eager.ResultStructure.tuple, list(value_meta)
            if not (warned or warned_f) and all(m is None or isinstance(m, torch.Tensor) for m in value_meta):
                meta_memo.MEMO.put(call.memo_key, [int(structure), [meta_memo.tensor_record(m) for m in value_meta]])
        if sig.written and not sig.is_out and structure != _C.eager.ResultStructure.written:
            _check_inplace_result(vals, sig, value_meta)
        out_types = [TensorType(tuple(m.shape), m.dtype) if isinstance(m, torch.Tensor) else None for m in value_meta]
        cpu_dtype_probe(self.lowering, self.sig, vals, self.host_inputs)
        if sig.is_out and not self.lowering.rng and self.lowering.cpu_dtypes and not self.host_inputs:
            cpu_out_dtype_refusal(sig, vals, [m.dtype if isinstance(m, torch.Tensor) else None for m in value_meta])
        if self.lowering.check is not None and self.lowering.check_per_key:
            self.lowering.check(*f_vals)

        # 2. Program arguments, created on first use so that unread storages are not passed.
        b = Builder()
        plan = []
        arg_of = {}

        flat_of = {}  # storage operand position -> its buffer as a 1-D value

        def operand_arg(pos):
            """The program argument of operand `pos`; for a tpu storage, its elements as a 1-D value
            (what views are read from and written into)."""
            o = call.operands[pos]
            if isinstance(o, torch.Tensor) and o.device.type != "cpu":
                if pos not in flat_of:
                    v = storage_arg(pos)
                    flat_of[pos] = v if len(v.shape) == 1 else b.reshape(v, [math.prod(v.shape)])
                return flat_of[pos]
            v = arg_of.get(pos)
            if v is None:
                if isinstance(o, torch.Tensor):
                    v = b.arg(TensorType(tuple(o.shape), o.dtype))
                elif isinstance(o, tuple):
                    v = b.arg(TensorType((), o[1]))
                else:
                    v = b.arg(TensorType((2,), torch.uint64))
                arg_of[pos] = v
                plan.append(pos)
            return v

        def storage_arg(pos):
            """The argument of a tpu storage as its buffer is: an array of the storage's dims."""
            v = arg_of.get(pos)
            if v is None:
                sdt, dims = _C.device.storage_spec(call.operands[pos])
                v = arg_of[pos] = b.arg(TensorType(dims, sdt))
                plan.append(pos)
            return v

        views = {}  # id(tensor) -> Value of its view

        def view_offset(t, kpart):
            """t's storage offset as the program sees it: baked (an int), or the int64 operand the
            call passes (call.h: a storage's first view at a nonzero offset), plus the key's part."""
            if kpart.offset_position < 0:
                return t.storage_offset()
            off = operand_arg(kpart.offset_position)
            return off if kpart.offset == 0 else b.add(off, b.constant(kpart.offset, torch.int64))

        def lower_tensor(t, kpart):
            if t is None:
                return None
            if kpart.kind in (KeyPartKind.scalar, KeyPartKind.baked):
                return lower_scalar(t, kpart)
            if t.device.type == "cpu":
                v = operand_arg(kpart.position)
                return Value(v.name, v.type, t if t.dim() == 0 else meta(t))
            slot = kpart.slot
            got = views.get(id(t))
            if got is None:
                raw = storage_arg(slot)
                if raw.dtype == t.dtype and raw.shape == tuple(t.shape) and \
                        is_whole(raw.type.numel, t.storage_offset(), t.shape, t.stride()):
                    got = raw  # the whole storage in its own shape
                else:
                    got = read_view(b, operand_arg(slot), view_offset(t, kpart), t.shape, t.stride(), t.dtype)
                if kpart.bits:
                    got = _apply_bits(b, got, kpart.bits)
                got = Value(got.name, got.type, meta(t))
                views[id(t)] = got
            return got

        def lower_scalar(v, kpart):
            if v is None:
                return None
            py = v.item() if isinstance(v, torch.Tensor) else v
            if kpart.kind == KeyPartKind.baked:
                c = b.constant(kpart.baked, kpart.dtype)
                return Value(c.name, c.type, py)
            a = operand_arg(kpart.position)
            return Value(a.name, a.type, py)

        parts = _key_parts(call.key, sig.kinds)
        f_parts = [parts[i] for i in self.f_index]
        # Out tensors of out= variants are written, never read: F's arguments are what is lowered.
        lowered = lower_arguments(
            f_vals, f_kinds,
            tensor=lambda t, i, j: lower_tensor(t, f_parts[i][j or 0]),
            scalar=lambda v, i, j: lower_scalar(v, f_parts[i][j or 0]),
            generator=lambda g, i: operand_arg(f_parts[i][0].position),
            rng_state=(lambda: operand_arg(call.key[-1].position)) if self.lowering.rng else None)

        # 3. The op itself.
        ctx = LoweringContext(b, out_types)
        result = self.lowering.fn(ctx, *lowered)
        results = [result] if isinstance(result, Value) else list(result)
        if len(results) != len(out_types):
            raise RuntimeError(f"lowering of {fsig.overload} returned {len(results)} values, expected {len(out_types)}")
        fitted = []
        for r, t in zip(results, out_types):
            # an undefined result (the lowering returns None for it) stays None; one with no elements
            # is a constant (the lowering still ran, for its checks): XLA's CPU compiler dies of
            # SIGFPE on an integer remainder of empty arrays
            fitted.append(None if t is None else b.constant(0, t.dtype, t.shape) if t.numel == 0 else fit(b, r, t))

        # 3b. Index bounds checked on the device: a flag (and the first bad index) beside the result.
        failed, status = None, None
        if self.lowering.bounds is not None:
            failed, status = self._bounds_status(b, f_vals, lowered, operand_arg(call.key[-1].slot))

        # 4. Where results go: fresh tensors, or the storages of written arguments.
        res, sinks = ProgramResults(b), []
        if not sig.written:
            for r, t, st in zip(fitted, out_types, self._cpu_strides(value_meta, f_vals)):
                if t is not None:
                    sinks.append(_C.eager.PlanSink(True, res.fresh(r, st)))
        else:
            targets = []
            for i in sig.written:
                ts = vals[i] if isinstance(vals[i], list) else [vals[i]]
                for t, kp in zip(ts, parts[i]):
                    targets.append((t, kp))
            if len(targets) != len(fitted):
                raise RuntimeError(f"{self.name}: {len(fitted)} values for {len(targets)} written tensors")
            new_base = {}
            for (t, kp), r in zip(targets, fitted):
                slot, bits = kp.slot, kp.bits
                r = b.convert(r, t.dtype)
                if bits:
                    r = _apply_bits(b, r, bits)
                r = b.broadcast_to(r, tuple(t.shape)) if r.shape != tuple(t.shape) else r
                sdt, dims = _C.device.storage_spec(t)
                n = math.prod(dims)
                # new_base: each written storage's new buffer, in its dims (the storage keeps them)
                if slot not in new_base and sdt == t.dtype and is_whole(n, t.storage_offset(), t.shape, t.stride()):
                    new_base[slot] = b.reshape(r, dims)
                else:
                    base = b.reshape(new_base[slot], [n]) if slot in new_base else operand_arg(slot)
                    new_base[slot] = b.reshape(write_view(b, base, view_offset(t, kp), t.shape, t.stride(), r), dims)
            for slot, v in new_base.items():
                # bad indices (failed): the storage keeps its value
                res.replace(storage_arg(slot) if failed is not None else arg_of.get(slot), v, failed)
                sinks.append(_C.eager.PlanSink(False, slot))
        if status is not None:  # the device's index-error status, updated in place
            slot = call.key[-1].slot
            res.replace(arg_of[slot], b.reshape(status, list(arg_of[slot].shape)))
            sinks.append(_C.eager.PlanSink(False, slot))
        outputs = res.values
        text = res.module()
        _state.last_program_text = text
        # Fused eager inlines the op into a bigger program: its own executable is built only if needed.
        exe = None if _state.eager_mode() == "fused" else compile_entry_text(self.name, text, [v.type for v in outputs])
        draws = rng_draws(self.lowering, out_types, f_vals)
        fixed = tuple((i, value_meta[i]) for i, t in enumerate(out_types) if t is None)
        return _Entry(exe, plan, res.fresh_specs, sinks, structure, rng_draws=draws, fixed=fixed, text=text,
                      name=self.name,
                      fn_text=b.function("__OP__", outputs, public=False), functions=b.functions,
                      arg_types=b.arg_types(),
                      result_types=[v.type for v in outputs])


# The dispatcher enters Kernel.__call__; the C++ front-end calls _slow on a plan miss and, in debug
# eager, _debug_synchronize after each launch: none of them is traced by Dynamo (run_as_is).
_state.run_as_is(Kernel.__call__, Kernel._slow, Kernel._debug_synchronize)
