"""One functionalized ATen FX graph -> one StableHLO module -> one executable, and its runner.

Every call_function node is lowered by the one registry (torch_tpu/lowering; views, factories and
casts by its graph-only entries, lowering/functional.py), into ONE Builder. Result types come from the
nodes' FakeTensors (node.meta["val"]), so no meta kernel runs again.

Inputs: each tpu input is passed as its storage's buffer, whose dims are the tensor's sizes in
memory order (runtime.h's Cell::dims). The program reads it in the layout the graph's metadata
gives: contiguous, or a permuted dense layout (a transposed weight that AOTAutograd saved for the
backward) for inputs the graph does not write. An input that is not its whole storage in that
layout (a slice, a view of another layout, a buffer of other dims) is copied to a fresh tensor of
that layout first. CPU inputs are uploaded.
Outputs: fresh tensors, laid out with the strides the graph's metadata says (a permuted layout is
produced as a permute of a dense buffer), each a buffer of its sizes in memory order. Outputs that ARE inputs, or views of inputs, are returned
as those tensors / real views of them, not copies.
Input mutation (`copy_` into a placeholder at the end of an inference graph, e.g. an optimizer
step): the program writes the new value into the input's storage, donating the old buffer.
Random ops take the default tpu generator's (seed, offset) as one runtime operand; each random node
draws from its own offset, advanced by its output size as in eager.
Index bounds (`bounds=` of a lowering) are checked inside the program, on graph inputs and
intermediate values alike: the device's index-error status tensor is one more input, written in
place, and a bad index keeps every input the graph writes unchanged (the error surfaces at the next
synchronisation, as in eager). Host checks (`check=`) run on the real inputs when the checked
tensors are graph inputs; on intermediate values they cannot run and are skipped.
"""
from __future__ import annotations

import collections
import math
import logging
import operator

import torch
from torch._guards import CompileContext
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .. import _C, metrics, runtime
from ..lowering.signature import Signature, cpu_dtype_probe
from ..lowering.builder import Builder, TensorType, Value
from ..lowering.overloads import overload_name, resolve
from ..lowering.precision import matmul_precision
from ..lowering.helpers import bounded
from ..lowering.registry import LoweringContext, bounds_status, fit, lower_arguments, rng_draws
from ..lowering.results import ProgramResults
from ..lowering.strided import dense_order
from . import buckets, collectives, relayout
from .host_part import HostPart

log = logging.getLogger("torch_tpu.dynamo")
last_text: str | None = None


class Unsupported(NotImplementedError):
    """A node the graph lowering cannot handle; names the op and where it came from."""

    def __init__(self, op: str, node, why: str = "has no tpu lowering"):
        self.op = op
        trace = (node.meta.get("stack_trace") or "").strip() if node is not None else ""
        where = f"\n  from user code:\n{trace}" if trace else ""
        super().__init__(f"torch.compile(backend='tpu'): {op} {why}{where}")


_SIGS: dict = {}


def _sig(target):
    s = _SIGS.get(target)
    if s is None:
        s = _SIGS[target] = Signature(target)
    return s


def _shape(val, bk=None) -> tuple:
    """A traced tensor's sizes as ints: its bounds in a bucketed graph (buckets.Bucketing)."""
    return tuple(val.shape) if bk is None else tuple(bk.bound(s) for s in val.shape)


def _tensor_types(val, bk=None):
    if isinstance(val, torch.Tensor):
        return [TensorType(_shape(val, bk), val.dtype)]
    if isinstance(val, (list, tuple)):
        return [TensorType(_shape(v, bk), v.dtype) if isinstance(v, torch.Tensor) else None for v in val]
    return []


def _meta(val, bk=None):
    if bk is not None and _symbolic(val):  # a bucketed graph: the tensor at its bounds
        return torch.empty(_shape(val, bk), dtype=val.dtype, device="meta")
    return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device="meta")


def _layout_perm(val):
    """A permutation p such that val's strides are those of a dense tensor of shape val.shape[p]
    (channels-last, transposed outputs), or None when val is contiguous or not a permuted dense."""
    if val.dim() < 2 or val.is_contiguous():
        return None
    return dense_order(val.shape, val.stride())


def _meta_val(v):
    """A node argument as its traced value (fake tensors for tensor nodes), for rules that read shapes."""
    if isinstance(v, torch.fx.Node):
        return v.meta.get("val")
    if isinstance(v, (list, tuple)):
        return type(v)(_meta_val(x) for x in v)
    return v


def _symbolic(v) -> bool:
    """Whether a traced value (or a list of them) holds a symbolic size or number."""
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(v, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in v.shape)
    if isinstance(v, (list, tuple)):
        return any(_symbolic(x) for x in v)
    return False


def _has_node(v):
    if isinstance(v, torch.fx.Node):
        return True
    if isinstance(v, (list, tuple)):
        return any(_has_node(x) for x in v)
    return False


def _is_view_of_input(node, placeholders) -> bool:
    """True when node is a chain of view ops over one placeholder (other args constants)."""
    while True:
        if node.op == "placeholder":
            return node in placeholders
        if node.op != "call_function" or not getattr(node.target, "is_view", False):
            return False
        if _has_node(list(node.args[1:])) or _has_node(list(node.kwargs.values())):
            return False
        node = node.args[0]
        if not isinstance(node, torch.fx.Node):
            return False


def _view_output(node, index):
    """The out_plan entry of an output that is a view of an input: ("strided", input, size, stride,
    offset from the input's) when it keeps the input's dtype (one as_strided call at run time; Dynamo
    guards the input's sizes and strides, so the view's layout is fixed), else ("view", node), its
    view chain replayed."""
    base = node
    while base.op != "placeholder":
        base = base.args[0]
    bv, ov = base.meta.get("val"), node.meta.get("val")
    if isinstance(bv, torch.Tensor) and isinstance(ov, torch.Tensor) and ov.dtype == bv.dtype:
        return ("strided", index[base], tuple(ov.shape), tuple(ov.stride()),
                ov.storage_offset() - bv.storage_offset())
    return ("view", node)


def _replay_view(node, real_inputs, index, values=None):
    """Runs node's view chain on the real input tensor (metadata only: a real view); `values`: a
    bucketed graph's symbol values, for symbolic size arguments."""
    if node.op == "placeholder":
        return real_inputs[index[node]]
    base = _replay_view(node.args[0], real_inputs, index, values)

    def concrete(a):
        if isinstance(a, torch.fx.Node):
            return buckets.evaluate(buckets.expr_of(a.meta["val"]), values)
        if isinstance(a, (list, tuple)):
            return type(a)(concrete(x) for x in a)
        return a
    return node.target(base, *concrete(list(node.args[1:])), **node.kwargs)


class GraphProgram:
    """The compiled form of one FX graph; called with the graph's inputs (boxed: one list)."""
    _boxed_call = True

    def __init__(self, gm: torch.fx.GraphModule, name: str = "graph", replicas=None, bucketing=None):
        """`replicas`: for a graph with collectives, the devices its program runs on
        (torch_tpu.distributed.device_collectives.GraphReplicas, for the ranks `graph_span(gm)`).
        `bucketing`: a graph with symbolic sizes lowered for one bucket (buckets.Bucketing; raises
        buckets.NotBucketable when a node cannot read padding); called with `bucket_call`."""
        self.replicas = replicas
        self.bucketing = bucketing
        self._prepare(gm, name)
        try:
            self.exe = runtime.compile(self.text, self.label,
                                       device_ids=list(replicas.device_ids) if replicas else None)
        except RuntimeError as e:
            raise RuntimeError(f"torch.compile(backend='tpu'): compiling the {name} graph failed: {e}\n"
                               f"--- program ---\n{self.text}") from None
        meet = None if replicas is None else (replicas.place(self.text), list(replicas.local),
                                              int(replicas.timeout.total_seconds() * 1000))
        self.runner = _C.graph.GraphRunner(self.exe, self.run_plan, sorted(self.donated), self.sink_plan,
                                           self.prog_specs, f"compiled {self.label}", self.rng_draws, meet)
        metrics.count("compiled_graphs")
        log.info("compiled %s graph: %d nodes, %d program inputs, %d outputs", name, self.num_nodes,
                 len(self.arg_plan), len(self.prog_specs))

    @classmethod
    def lowered(cls, gm: torch.fx.GraphModule, name: str = "graph", bucketing=None) -> "GraphProgram":
        """The graph lowered to StableHLO (`.text`, `.label`, the plans), not compiled and not
        callable: torch_tpu.aot compiles the text for a TPU topology instead."""
        self = cls.__new__(cls)
        self.bucketing = bucketing
        self.replicas = None
        self._prepare(gm, name)
        return self

    def _prepare(self, gm, name):
        global last_text
        self.name = name
        self.gm = gm
        self.span = collectives.graph_span(gm)  # the ranks its replicas run; None: one device's program
        self.precision = matmul_precision()  # float32 dots/convolutions carry it: lowered again on a change
        self._lower(gm)
        last_text = self.text
        # Dynamo's compile id ("0/0": frame 0, its first compile; the "Torch-Compiled Region: 0/0" of
        # profiler traces) tells one function's graphs from another's in profiles and errors.
        compile_id = CompileContext.current_compile_id()
        self.label = f"{name} graph" + (f" [{compile_id}]" if compile_id is not None else "")

    # -- lowering ----------------------------------------------------------------------------------
    def _lower(self, gm):
        b = Builder()
        self.b = b
        nodes = list(gm.graph.nodes)
        self.num_nodes = len(nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        self.ph_index = {n: i for i, n in enumerate(placeholders)}
        self.num_inputs = len(placeholders)
        self.ph_devices = [n.meta["val"].device.type if isinstance(n.meta.get("val"), torch.Tensor) else None
                           for n in placeholders]
        self.arg_plan = []      # per program argument: ("in", i), ("const", tensor) or ("rng",)
        self.ph_arg = {}        # placeholder index -> program argument position
        self.rng_draws = 0
        self.checks = []        # (check fn, args with ("in", i) markers, what its key covers)
        # Device-side index checks (lowerings' `bounds`): the device's status tensor is one more
        # input, written in place; `failed` (any bad index) keeps every written input unchanged.
        self.status_ph = None   # its input index (after the graph's own), when some node checks
        self.status_device = None
        self.status = None      # its Value after the nodes lowered so far
        self.failed = None
        # A bucketed graph (buckets.py): the true values of its symbols are one more (CPU, int32)
        # input, after the graph's own; its tpu inputs of symbolic size are 1-D compact buffers of
        # their bucket's element count (ph_flat: placeholder index -> (that count, memory order)).
        bk = self.bucketing
        self.sizes_ph = None
        self.ph_flat = {}
        if bk is not None:
            bk.reset()
            self.sizes_ph = len(self.ph_devices)
            self.ph_devices.append("cpu")
            self.ph_arg[self.sizes_ph] = len(self.arg_plan)
            self.arg_plan.append(("in", self.sizes_ph))
            bk.operand = b.arg(TensorType((len(bk.symbols),), torch.int32))
        # Content keys of argument sets that passed their checks: a training loop feeding the same
        # index tensor again skips the host sync. Storage addresses are never reused and every write
        # bumps a tensor's version counter, so an unchanged key means unchanged data.
        self.passed_checks = collections.deque(maxlen=16)
        self.wide = False
        # tpu inputs read in a permuted dense layout (a transposed weight saved for the backward):
        # the program reads their storage's buffer in that layout instead of a dense copy of it.
        # Dynamo guards the layout (strides); the runner copies an input that does not have it.
        # Inputs the graph writes stay dense: their result replaces the storage's buffer.
        written = {self.ph_index[n.args[0]] for n in nodes if n.op == "call_function"
                   and n.target is torch.ops.aten.copy_.default and n.args[0].op == "placeholder"}
        self.ph_strides = {}    # placeholder index -> the strides its program argument assumes
        self.ph_dims = {}       # tpu placeholder index -> the dims of its program argument
        env = {}
        state = [None]

        def placeholder_value(node):
            i = self.ph_index[node]
            val = node.meta["val"]
            if not isinstance(val, torch.Tensor):
                raise Unsupported("a symbolic (SymInt) input", node, "is not supported")
            if bk is not None and _symbolic(val):
                return self._compact_input(i, val)
            if val.numel() == 0:
                c = b.constant(0, val.dtype, tuple(val.shape))
                return Value(c.name, c.type, _meta(val))
            perm = _layout_perm(val) if val.device.type != "cpu" and i not in written else None
            # The storage's buffer as it is: the tensor's sizes in memory order (the runner passes a
            # storage whose buffer has other dims as a copy).
            dims = tuple(val.shape) if perm is None else tuple(val.shape[d] for d in perm)
            a = b.arg(TensorType(dims, val.dtype))
            self.ph_arg[i] = len(self.arg_plan)
            self.arg_plan.append(("in", i))
            if val.device.type != "cpu":
                self.ph_dims[i] = dims
            v = a
            if perm is not None:
                self.ph_strides[i] = tuple(val.stride())
                v = b.transpose(v, [perm.index(d) for d in range(len(perm))])
            return Value(v.name, v.type, _meta(val))

        def value_of(node):
            v = env.get(node)
            if v is None and node.op == "placeholder":
                v = env[node] = placeholder_value(node)
            if v is None:
                raise Unsupported(f"value of node {node.name}", node, "is missing")
            return v

        def scalar(v, node):
            if isinstance(v, torch.fx.Node) and bk is not None and isinstance(v.meta.get("val"), (torch.SymInt, int)):
                c = b.convert(bk.size_value(b, v.meta["val"]), _C.eager.scalar_operand_dtype(1, self.wide))
                return Value(c.name, c.type, bk.bound(v.meta["val"]))  # a python int, for type promotion
            if isinstance(v, torch.fx.Node) and bk is not None and isinstance(v.meta.get("val"), torch.SymFloat):
                c = bk.float_value(b, v.meta["val"], _C.eager.scalar_operand_dtype(1.0, self.wide))
                return Value(c.name, c.type, bk.example(v.meta["val"]))  # a python float
            if isinstance(v, torch.fx.Node):
                raise Unsupported(f"a symbolic scalar argument ({v.name})", node, "is not supported")
            if v is None:
                return None
            if isinstance(v, torch.Tensor):
                v = v.item()
            c = b.constant(v, _C.eager.scalar_operand_dtype(v, self.wide))
            return Value(c.name, c.type, v)

        def rng_state(draws):
            if state[0] is None:
                state[0] = b.arg(TensorType((2,), torch.uint64))
                self.arg_plan.append(("rng",))
            off = self.rng_draws
            self.rng_draws += draws
            if off == 0:
                return state[0]
            inc = b.concatenate([b.constant(0, torch.uint64, (1,)), b.constant(off, torch.uint64, (1,))], 0)
            return b.add(state[0], inc)

        self.host = HostPart(placeholders, nodes)
        self.host_nodes = self.host.nodes
        if bk is not None and any(_symbolic(n.meta.get("val")) for n in self.host_nodes):
            raise buckets.NotBucketable("CPU tensors of symbolic size (the graph's host part)")
        self._pack_host_reads(nodes, b, env)
        self.host_mutations = []  # (placeholder index, host node): CPU inputs updated on the host
        mutations = []          # (placeholder index, Value)
        for node in nodes:
            if node.op == "placeholder" or node in self.host_nodes:
                continue
            if node.op == "get_attr":
                t = getattr(gm, node.target)
                if not isinstance(t, torch.Tensor):
                    continue
                a = b.arg(TensorType(tuple(t.shape), t.dtype))
                # AOTAutograd may call the compiler inside its FakeTensorMode: the constant is a
                # real tensor, copied for real (a tpu one by a clone program: its buffer has t's shape).
                with unset_fake_temporarily():
                    row_major = t.contiguous() if t.device.type == "cpu" else t.clone(memory_format=torch.contiguous_format)
                self.arg_plan.append(("const", row_major))
                env[node] = Value(a.name, a.type, _meta(t))
                continue
            if node.op == "output":
                out_node = node
                continue
            if node.op != "call_function":
                raise Unsupported(f"FX {node.op} node {node.target}", node, "is not supported")
            if bk is not None:
                why = buckets.refusal(node)
                if why:
                    raise buckets.NotBucketable(f"{why} (node {node.name})")
                if isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool, int)):
                    continue  # size arithmetic: read from its expression where used (Bucketing.size_value)
                if node.target in _RESHAPES and not buckets.keeps_symbolic_dims(
                        node.args[0].meta["val"].shape, node.meta["val"].shape):
                    env[node] = self._reshaped(value_of(node.args[0]), node.args[0].meta["val"], node.meta["val"])
                    continue
            if node.target is operator.getitem:
                env[node] = value_of(node.args[0])[node.args[1]]
                continue
            if not isinstance(node.target, torch._ops.OpOverload):
                raise Unsupported(str(node.target), node)
            if self._host_mutation(node):
                self.host_mutations.append((self.ph_index[node.args[0]], node.args[1]))
                continue
            if node.target is torch.ops.aten.copy_.default and node.args[0].op == "placeholder":
                dst = node.args[0]
                dv = dst.meta["val"]
                src = value_of(node.args[1])
                v = b.broadcast_to(b.convert(src, dv.dtype), tuple(dv.shape))
                mutations.append((self.ph_index[dst], v))
                env[node] = Value(v.name, v.type, _meta(dv))
                continue
            env[node] = self._lower_node(node, value_of, scalar, rng_state)

        # Outputs.
        outs = out_node.args[0]
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        placeholders_set = set(placeholders)
        res = self.results = ProgramResults(b)
        self.prog_to_cpu = []    # whether the result is a CPU tensor of the graph (copied to host)
        self.out_plan = []
        seen = {}
        for o in outs:
            if o is None or not isinstance(o, torch.fx.Node):
                self.out_plan.append(("const", o))
            elif o.op == "placeholder":
                self.out_plan.append(("in", self.ph_index[o]))
            elif bk is not None and isinstance(o.meta.get("val"), torch.SymInt):  # a size saved for backward
                self.out_plan.append(("size", buckets.expr_of(o.meta["val"])))
            elif o in self.host_nodes:
                self.out_plan.append(("host", self.host.slot(o)))
            elif _is_view_of_input(o, placeholders_set):
                self.out_plan.append(("view", o) if bk is not None else _view_output(o, self.ph_index))
            elif o in seen:
                self.out_plan.append(next(e for e in self.out_plan if e[0] in ("prog", "compact") and e[1] == seen[o]))
            else:
                val = o.meta["val"]
                v = value_of(o)
                if not isinstance(v, Value):
                    raise Unsupported(f"output {o.name}", o, "is not a tensor")
                if bk is not None and _symbolic(val):
                    self.out_plan.append(self._compact_output(o, val, v))
                    seen[o] = self.out_plan[-1][1]
                    continue
                # A permuted dense output (channels-last, transposed) is written in memory order into
                # a new tensor with its strides: a tensor of its own, as CPU's, not a view.
                res.fresh(v, tuple(val.stride()))
                self.prog_to_cpu.append(val.device.type == "cpu")
                seen[o] = len(res.values) - 1
                self.out_plan.append(("prog", seen[o]))
        self.mutations = []      # (placeholder index, program result index)
        self.donated = set()     # placeholder indices whose buffer the program consumes
        if self.status is not None:
            mutations.append((self.status_ph, self.status))
        for i, v in mutations:
            # written inputs are read row-major: the result has their argument's type
            pos = self.ph_arg.get(i)
            arg = b._args[pos][0] if pos is not None and self.ph_devices[i] != "cpu" else None
            # a bad index (failed): every written input keeps its value
            keep = value_of(placeholders[i]) if self.failed is not None and i != self.status_ph else None
            if res.replace(arg, v, None if keep is None else self.failed, keep):
                self.donated.add(i)
            self.prog_to_cpu.append(False)
            self.mutations.append((i, len(res.values) - 1))
        self.prog_specs = res.specs  # _C.eager.FreshSpec of each program result's tensor
        self.host.finish(self.host_mutations)
        self.text = res.module()
        # The builder and the Values made while lowering hold the example tensors they stood for
        # (the user's own tensors where aot traces on the meta device): not kept past lowering.
        self.b = self.results = self.status = self.failed = None
        self._plan_run()

    def _plan_run(self):
        """The per-call work, for _C.graph.GraphRunner: a _C.graph.GraphArg per program argument (a tpu
        input with the strides it is read in, None for contiguous, and the dims of its buffer; a CPU
        input; the rng state; a host pack; a constant) and the tpu inputs that receive a result in
        place (result index, placeholder index)."""
        G, K = _C.graph.GraphArg, _C.graph.ArgKind
        self.run_plan = []
        for entry in self.arg_plan:
            if entry[0] == "in" and self.ph_devices[entry[1]] == "cpu":
                self.run_plan.append(G(K.cpu_input, entry[1]))
            elif entry[0] == "in":
                self.run_plan.append(G(K.tpu_input, entry[1], strides=self.ph_strides.get(entry[1]),
                                       dims=self.ph_dims[entry[1]]))
            elif entry[0] == "rng":
                self.run_plan.append(G(K.rng_state))
            elif entry[0] == "pack":
                self.run_plan.append(G(K.host_pack, entry[1]))
            else:
                self.run_plan.append(G(K.constant, constant=entry[1]))
        self.sink_plan = sorted((k, i) for i, k in self.mutations if self.ph_devices[i] != "cpu")
        self.host_side_mutations = [(i, k) for i, k in self.mutations if self.ph_devices[i] == "cpu"]

    def _host_mutation(self, node) -> bool:
        """copy_ of a host value into a CPU input: done on the host, after the launch."""
        return node.target is torch.ops.aten.copy_.default and node.args[0].op == "placeholder" and \
            node.args[1] in self.host_nodes and self.ph_devices[self.ph_index[node.args[0]]] == "cpu"

    def _pack_host_reads(self, nodes, b, env):
        """The host values the program reads (CPU inputs, results of host nodes) travel as one
        operand per dtype, uploaded once per call: an optimizer's step counts are many tiny tensors."""
        groups, seen = {}, set()
        for node in nodes:
            if node.op != "call_function" or node in self.host_nodes:
                continue
            if self._host_mutation(node):
                continue
            for d in node.all_input_nodes:
                val = d.meta.get("val")
                if d in seen or not isinstance(val, torch.Tensor) or val.numel() == 0:
                    continue
                if d in self.host_nodes or (d.op == "placeholder" and self.ph_devices[self.ph_index[d]] == "cpu"):
                    seen.add(d)
                    groups.setdefault(val.dtype, []).append(d)
        self.host_packs = []
        for dtype, members in groups.items():
            members = self.host.order(members)
            a = b.arg(TensorType((sum(d.meta["val"].numel() for d in members),), dtype))
            self.arg_plan.append(("pack", len(self.host_packs)))
            off = 0
            for d in members:
                val = d.meta["val"]
                v = b.reshape(b.slice(a, [off], [off + val.numel()]), tuple(val.shape))
                env[d] = Value(v.name, v.type, _meta(val))
                off += val.numel()
            self.host_packs.append(self.host.pack_slot(members))

    def _lower_node(self, node, value_of, scalar, rng_state):
        found = resolve(node.target)
        if found is None:
            raise Unsupported(f"{node.target.namespace}::{overload_name(node.target)}", node)
        low, out_arg = found
        sig = _sig(node.target)
        vals = sig.bind(node.args, node.kwargs)
        self.wide = any(isinstance(v, torch.fx.Node) and isinstance(v.meta.get("val"), torch.Tensor)
                        and v.meta["val"].dtype in (torch.float64, torch.complex128) for v in vals)
        val = node.meta.get("val")
        bk = self.bucketing
        ctx = LoweringContext(self.b, _tensor_types(val, bk), self.span)

        def tensor(v):
            if v is None:
                return None
            if isinstance(v, torch.fx.Node) and not isinstance(v.meta.get("val"), (torch.SymInt, torch.SymFloat)):
                return value_of(v)
            return scalar(v, node)  # a python number (a size in a bucketed graph) for a Tensor argument

        def value(v, i):
            if _has_node(v) and bk is not None:  # sizes (buckets.refusal let only size arguments through)
                return self._bounds_of(v, node)
            if _has_node(v):
                raise Unsupported(f"aten::{overload_name(node.target)}", node,
                                  "with a symbolic (data-dependent or dynamic) argument is not supported")
            return v

        l_vals, l_kinds = vals, sig.kinds
        if out_arg is not None:  # lowered through its out= overload: arguments by name, no out tensor
            k_sig = _sig(out_arg[0])
            by_name = dict(zip(sig.names, vals))
            l_vals, l_kinds = [by_name.get(n) for n in k_sig.names], k_sig.kinds
        types = ctx.out
        draws = rng_draws(low, types, [_meta_val(v) for v in vals]) if low.rng else 0
        state = (lambda: rng_state(draws)) if low.rng else None
        args = lower_arguments(l_vals, l_kinds, tensor=lambda v, i, j: tensor(v),
                               scalar=lambda v, i, j: scalar(v, node),
                               generator=lambda g, i: state() if state is not None else None,
                               value=value, rng_state=state)
        if low.prepare is not None and any(  # a mask among the indices (a list argument), not a bool operand
                isinstance(v, torch.fx.Node) and isinstance(v.meta.get("val"), torch.Tensor)
                and v.meta["val"].dtype in (torch.bool, torch.uint8) for vs in vals if isinstance(vs, list) for v in vs):
            raise Unsupported(f"aten::{overload_name(node.target)}", node, "with a boolean mask (data-dependent "
                              "shape) is not supported inside a graph")
        examples = [_meta_val(v) for v in vals]
        if not _symbolic(examples):  # CPU's refusal of the dtypes, as eager raises it (before XLA sees them)
            with unset_fake_temporarily():
                cpu_dtype_probe(low, sig, examples)
        if low.check is not None and low.check_per_key:  # dtypes and shapes: checked once, here
            low.check(*[_meta_val(v) for v in vals])
        elif low.check is not None:
            self._record_check(low.check, vals, sig, node)
        if low.bounds is not None:  # on the indices as given
            self._device_bounds(low, node, l_vals, args)
        if bk is not None and node.target in _ADVANCED_INDEXING:
            args = self._wrap_negative(node, args)
        if bk is not None and node.target in buckets.FILLED:
            fills = buckets.fills(node)

            def fill(a, i):
                if isinstance(a, list):
                    return [fill(t, i) for t in a]
                if not isinstance(a, Value):
                    return a
                return bounded.filled(self.b, a, bounded.fill_value(fills.get(i, 0), a.dtype))
            args = [fill(a, i) for i, a in enumerate(args)]
        result = low.fn(ctx, *args)
        if result is None:
            result = []
        results = [result] if isinstance(result, Value) else list(result)
        if bk is not None and results:
            results[0] = self._mask_padding(node, results[0], args)
        if len(results) != len(types):
            raise RuntimeError(f"lowering of aten::{overload_name(node.target)} returned {len(results)} values, "
                               f"expected {len(types)}")
        b = self.b
        fixed = []
        metas = [val] if isinstance(val, torch.Tensor) else list(val or [])
        for r, t, m in zip(results, types, metas):
            if t is None or r is None:
                fixed.append(None)
                continue
            # no elements: a constant (as eager's kernels do; XLA's CPU compiler dies of SIGFPE folding
            # integer division over empty arrays)
            r = b.constant(0, t.dtype, t.shape) if t.numel == 0 else fit(b, r, t)
            sizes = None
            if bk is not None and _symbolic(m):  # XLA's dynamic padder: these dimensions hold fewer
                sizes = self._sizes(m)
                r = relayout.mark(b, r, sizes)
            fixed.append(Value(r.name, r.type, _meta(m, bk), sizes))
        if isinstance(val, torch.Tensor):
            return fixed[0]
        return fixed

    # -- bucketed graphs (buckets.py) ----------------------------------------------------------------
    def _sizes(self, val) -> tuple:
        """Per dimension of a traced tensor: the int32 Value of its true size where symbolic, else None."""
        bk = self.bucketing
        return tuple(bk.size_value(self.b, s) if buckets.is_symbolic(s) else None for s in val.shape)

    def _bounds_of(self, v, node):
        """A node's non-tensor argument with its symbolic sizes replaced by their bounds."""
        if isinstance(v, (list, tuple)):
            return type(v)(self._bounds_of(x, node) for x in v)
        if isinstance(v, torch.fx.Node):
            val = v.meta.get("val")
            if not isinstance(val, (torch.SymInt, int)):
                raise Unsupported(f"aten::{overload_name(node.target)}", node, "with a data-dependent argument")
            return self.bucketing.bound(val)
        return v

    def _compact_input(self, i, val):
        """Placeholder i (a tpu tensor of symbolic size) read from its 1-D compact buffer: the first
        numel elements are the tensor in memory order (row-major, or the permutation its strides give:
        a transposed activation saved for backward), unflattened to its true sizes at the bounds."""
        b, bk = self.b, self.bucketing
        if val.device.type == "cpu":
            raise buckets.NotBucketable("a CPU input of symbolic size")
        shape = _shape(val, bk)
        cap = math.prod(shape)
        a = b.arg(TensorType((cap,), val.dtype))
        self.ph_arg[i] = len(self.arg_plan)
        self.arg_plan.append(("in", i))
        self.ph_dims[i] = (cap,)
        perm = buckets.memory_order(val, bk)
        self.ph_flat[i] = (cap, perm)
        sizes = self._sizes(val)
        v = b.transpose(relayout.to_padded(b, a, [sizes[p] for p in perm], tuple(shape[p] for p in perm)),
                        _inverse(perm))
        v = relayout.mark(b, v, sizes)
        return Value(v.name, v.type, _meta(val, bk), sizes)

    def _compact_output(self, o, val, v):
        """An output of symbolic size as a 1-D buffer of its bucket's element count holding it compact,
        in the memory order its strides give (buckets.memory_order); the out_plan entry
        ("compact", k, size expressions, that order)."""
        b, bk = self.b, self.bucketing
        if val.device.type == "cpu":
            raise buckets.NotBucketable("a CPU output of symbolic size")
        cap = v.type.numel
        perm = buckets.memory_order(val, bk)
        sizes = self._sizes(val)
        flat = relayout.to_compact(b, b.transpose(v, perm), [sizes[p] for p in perm], cap)
        self.results.fresh(flat)
        self.prog_to_cpu.append(False)
        return ("compact", len(self.results.values) - 1, tuple(buckets.expr_of(s) for s in val.shape), perm)

    def _reshaped(self, x, src, dst):
        """A view or reshape node that splits or merges a symbolic dimension (buckets.keeps_symbolic_dims):
        through the compact layout (relayout.py; XLA's own reshape of a dynamic dimension keeps the
        padded layout, so splitting one scrambles rows)."""
        b, bk = self.b, self.bucketing
        shape, sizes = _shape(dst, bk), self._sizes(dst)
        cap = max(x.type.numel, math.prod(shape))
        v = relayout.to_padded(b, relayout.to_compact(b, x, list(x.sizes or self._sizes(src)), cap), sizes, shape)
        v = relayout.mark(b, v, sizes)
        return Value(v.name, v.type, _meta(dst, bk), sizes)

    def _mask_padding(self, node, r, args):
        """Ops whose lowering would write the padding of a symbolic dimension where PyTorch's result has
        values: constant_pad_nd's high padding starts at the true size, slice_scatter writes only
        as many rows as its source truly has; and a slice of static size along a symbolic dimension
        says so to XLA."""
        b, bk = self.b, self.bucketing
        aten = torch.ops.aten
        if node.target is aten.constant_pad_nd.default:
            x, pads = node.args[0].meta["val"], node.args[1]
            fill = node.args[2] if len(node.args) > 2 else 0
            for k in range(len(pads) // 2):
                d = x.dim() - 1 - k
                if buckets.is_symbolic(x.shape[d]):
                    edge = b.add(bk.size_value(b, x.shape[d]), b.constant(pads[2 * k], torch.int32))
                    keep = b.compare(b.iota(r.shape, d, torch.int32), b.broadcast_to(edge, r.shape), "LT")
                    r = b.select(keep, r, b.constant(fill, r.dtype, r.shape))
        elif node.target is aten.slice.Tensor:
            # A slice of fixed size along a symbolic dimension (x[:, :2] of a changing length): XLA
            # keeps the dimension dynamic and gives it the operand's true size (the length, past the
            # slice's bound), and a program result of that shape wrote past its buffer (heap
            # corruption; a new user's trial). The slice holds its static size: said with a size
            # Value XLA cannot fold to a constant (a constant one it drops). A slice of one element
            # XLA makes static itself; marking it would leave a dynamic degenerate dimension, which
            # XLA cannot reshape (generate()'s hidden_states[:, -1:]).
            x, out = node.args[0].meta["val"], node.meta["val"]
            dim = (node.args[1] if len(node.args) > 1 else 0) % x.dim()
            k = out.shape[dim]
            if buckets.is_symbolic(x.shape[dim]) and not buckets.is_symbolic(k) and k > 1:
                n = bk.size_value(b, x.shape[dim])
                size = b.minimum(b.add(n, b.constant(k, torch.int32)), b.constant(k, torch.int32))
                r = b.set_dimension_size(r, size, dim)
        elif node.target is aten.slice_scatter.default:
            src = node.args[1].meta["val"]
            dim = (node.args[2] if len(node.args) > 2 else 0) % src.dim()
            start = (node.args[3] if len(node.args) > 3 else None) or 0
            step = node.args[5] if len(node.args) > 5 else 1
            if buckets.is_symbolic(src.shape[dim]):
                edge = b.add(b.multiply(bk.size_value(b, src.shape[dim]), b.constant(step, torch.int32)),
                             b.constant(start, torch.int32))
                keep = b.compare(b.iota(r.shape, dim, torch.int32), b.broadcast_to(edge, r.shape), "LT")
                r = b.select(keep, r, args[0])
        return r

    def _wrap_negative(self, node, args):
        """index.Tensor's (or index_put's) arguments with its negative indices along symbolic dimensions counted from
        the true size (the lowering would count them from the bound). After the device check, which
        sees them as given."""
        b, bk = self.b, self.bucketing
        x, indices = node.args[0].meta["val"], list(args[1])
        for d, i in enumerate(indices):
            if i is None or not buckets.is_symbolic(x.shape[d]):
                continue
            n = b.broadcast_to(b.convert(bk.size_value(b, x.shape[d]), i.dtype), tuple(i.shape))
            w = b.select(b.compare(i, b.constant(0, i.dtype, tuple(i.shape)), "LT"), b.add(i, n), i)
            indices[d] = Value(w.name, w.type, i.example, i.sizes)
        return [args[0], indices, *args[2:]]

    def _device_bounds(self, low, node, vals, args):
        """Adds the node's index checks to the program (registry.bounds_status), on the FakeTensors'
        shapes: a bad index sets the device's status and keeps the graph's writes from landing."""
        metas, by_id = [], {}
        for v, a in zip(vals, args):
            items = v if isinstance(v, list) else [v]
            lows = a if isinstance(v, list) else [a]
            got = []
            for t, lv in zip(items, lows):
                m = t.meta.get("val") if isinstance(t, torch.fx.Node) else t
                if isinstance(m, torch.Tensor):
                    by_id[id(m)] = lv
                got.append(m)
            metas.append(got if isinstance(v, list) else got[0])
        bounds = low.bounds(*metas)
        idx = next((bd.index for bd in bounds if isinstance(bd.index, torch.Tensor)), None)
        bk = self.bucketing
        if idx is None or (bk is None and any(not isinstance(bd.size, int) for bd in bounds)):
            return
        if idx.device.type != "tpu":
            return
        b = self.b
        if self.status is None:
            self.status_ph = len(self.ph_devices)  # after the graph's inputs (and a bucketed graph's sizes)
            self.status_device = idx.device.index or 0
            self.ph_devices.append("tpu")
            a = b.arg(TensorType((3,), torch.int64))
            self.ph_arg[self.status_ph] = len(self.arg_plan)
            self.ph_dims[self.status_ph] = (3,)
            self.arg_plan.append(("in", self.status_ph))
            self.status = a

        def index_value(t):
            v = by_id.get(id(t))
            if v is None or bk is None or not v.sizes or all(n is None for n in v.sizes):
                return v
            # A padded index of a bucketed graph is checked on its true region only (its padding holds
            # anything): the index and a mask of that region (True marked with its sizes, False past
            # them), both static.
            ones = relayout.mark(b, b.constant(True, torch.bool, tuple(v.shape)), v.sizes)
            return bounded.filled(b, v, 0), bounded.filled(b, Value(ones.name, ones.type, None, v.sizes), False)

        failed, status = bounds_status(b, bounds, index_value, f"aten::{overload_name(node.target)}", self.status,
                                       size_of=lambda s: bk.size_value(b, s))
        if failed is not None:
            self.status = status
            self.failed = failed if self.failed is None else self.b.or_(self.failed, failed)

    def _record_check(self, check, vals, sig, node):
        """Runs `check` at call time when every tensor it reads is a graph input."""
        template, ok = [], True
        for v, kind in zip(vals, sig.kinds):
            if kind in (_C.eager.ArgKind.tensor, _C.eager.ArgKind.tensor_list):
                items = v if kind == _C.eager.ArgKind.tensor_list else [v]
                conv = []
                for t in items:
                    if isinstance(t, torch.fx.Node):
                        if t.op != "placeholder":
                            ok = False
                            break
                        conv.append(("in", self.ph_index[t]))
                    else:
                        conv.append(t)
                template.append(conv if kind == _C.eager.ArgKind.tensor_list else (conv[0] if conv else None))
            else:
                template.append(v)
            if not ok:
                break
        if ok:
            reads = getattr(check, "reads", None)
            keyed = [i for i, n in enumerate(sig.names[:len(template)]) if reads is None or n in reads]
            # The key covers the tensors the check reads (graph inputs by index, constant tensors);
            # the other arguments are fixed with the check.
            keyed_tensors = []
            for i in keyed:
                for t in template[i] if isinstance(template[i], list) else [template[i]]:
                    if _is_ref(t):
                        keyed_tensors.append(t[1])
                    elif isinstance(t, torch.Tensor):
                        keyed_tensors.append(t)
            self.checks.append((check, template, keyed_tensors))
        else:
            log.debug("index check of %s skipped: it reads values computed inside the graph", node.name)

    # -- running -----------------------------------------------------------------------------------
    def __call__(self, args):
        if matmul_precision() != self.precision:  # torch.set_float32_matmul_precision since
            self.__init__(self.gm, self.name, self.replicas, self.bucketing)  # the same devices (issue 54)
        real = list(args)
        args.clear()  # boxed calling convention: inputs may be freed as soon as they are used
        launch = real
        if self.bucketing is not None:  # the true sizes, and inputs of symbolic size as compact buffers
            values = self._values = self.bucketing.values_of(real)
            launch = list(real)
            for i, (cap, perm) in self.ph_flat.items():
                launch[i] = _compact(real[i], cap, perm)
            launch.append(torch.tensor([values[s] for s in self.bucketing.symbols], dtype=torch.int32))
        if self.status_ph is not None:
            launch.append(_C.eager.index_status(self.status_device))
        for n, (check, template, keyed) in enumerate(self.checks):
            key = _C.device.content_key([real[x] if isinstance(x, int) else x for x in keyed])
            key = None if key is None else (n, key)
            if key is None or key not in self.passed_checks:
                check(*[_fill(t, real) for t in template])  # downloads the indices: a host sync
                if key is not None:
                    self.passed_checks.append(key)
        # CPU tensors of the graph: PyTorch's CPU kernels, before the launch.
        host = self.host.run(real)
        packs = [host[k] for k in self.host_packs]
        mode = _C.eager.mode()
        if mode == _C.eager.Mode.fused:  # ops it recorded run first: they may produce this graph's inputs
            _C.eager.fused_flush()
        produced, copied = self.runner(launch, packs)
        if mode == _C.eager.Mode.debug:
            try:
                _C.runtime.synchronize(-1, index_errors=False)
            except RuntimeError as e:
                raise RuntimeError(f"tpu: compiled {self.name} graph failed: {e}") from None
            _C.eager.raise_index_errors(-1)  # CPU's own error type and message, naming the op
        metrics.count("graph_executions")
        for i, k in self.mutations if copied else self.host_side_mutations:
            if produced[k] is not launch[i]:  # a copied input, or one on the host: write back
                launch[i].copy_(produced[k].view(launch[i].shape))
        self.host.write_back(real, host)
        return self.outputs(real, host, lambda k: produced[k].cpu() if self.prog_to_cpu[k] else produced[k])

    def outputs(self, real: list, host: list, program_output) -> list:
        """The graph's outputs by out_plan: program_output(k) for the program's k-th output, the real
        inputs (or views of them) for outputs that are inputs, the host part's results, constants."""
        outs = []
        for entry in self.out_plan:
            kind = entry[0]
            if kind == "prog":
                outs.append(program_output(entry[1]))
            elif kind == "compact":  # the front of a bucket-sized buffer, at the true sizes
                sizes, perm = [buckets.evaluate(e, self._values) for e in entry[2]], entry[3]
                t = program_output(entry[1])[:math.prod(sizes)].view([sizes[p] for p in perm])
                outs.append(t.permute(_inverse(perm)))
            elif kind == "size":
                outs.append(buckets.evaluate(entry[1], self._values))
            elif kind == "in":
                outs.append(real[entry[1]])
            elif kind == "strided":
                _, i, size, stride, delta = entry
                outs.append(real[i].as_strided(size, stride, real[i].storage_offset() + delta))
            elif kind == "view":
                outs.append(_replay_view(entry[1], real, self.ph_index, getattr(self, "_values", None)))
            elif kind == "host":
                outs.append(host[entry[1]])
            else:
                outs.append(entry[1])
        return outs


_RESHAPES = {torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.reshape.default}
# Ops whose index tensors may be negative, counted from x's sizes (x, indices, ...)
_ADVANCED_INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default,
                      torch.ops.aten._index_put_impl.default}


def _inverse(perm) -> list:
    inv = [0] * len(perm)
    for k, p in enumerate(perm):
        inv[p] = k
    return inv


def _compact(t: torch.Tensor, cap: int, perm) -> torch.Tensor:
    """A tpu tensor as the 1-D buffer of `cap` elements a bucketed program reads, holding t's elements
    in the memory order `perm`: its own storage when it already lies so at the front of a storage of
    that size (a bucketed graph's output); else, for a tensor uploaded from the host and not written
    since (a batch: the runtime keeps the bytes of small whole uploads, _C.device.host_copy), the
    value padded on the host and uploaded again (counted as bucket_input_uploads: a transfer, no
    program); else a copy into a new buffer on the device (bucket_input_copies: the copy's program
    is compiled per shape)."""
    m = t.permute(perm)
    if m.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == cap * t.element_size():
        return t.as_strided((cap,), (1,), 0)
    host = None if t.is_conj() or t.is_neg() else _C.device.host_copy(t)
    if host is not None and host.dtype == t.dtype:
        padded = torch.zeros(cap, dtype=t.dtype)
        padded[:t.numel()] = host.as_strided(t.shape, t.stride(), t.storage_offset()).permute(perm).reshape(-1)
        metrics.count("bucket_input_uploads")
        return padded.to(t.device)
    buf = torch.empty(cap, dtype=t.dtype, device=t.device)
    buf[:t.numel()].copy_(m.reshape(-1))
    metrics.count("bucket_input_copies")
    return buf


def _is_ref(t) -> bool:
    return isinstance(t, tuple) and len(t) == 2 and t[0] == "in"


def _fill(t, real):
    if _is_ref(t):
        return real[t[1]]
    if isinstance(t, list):
        return [_fill(x, real) for x in t]
    return t
