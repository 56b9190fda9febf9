"""The Dynamo backend "tpu": AOTAutograd + whole-graph lowering to StableHLO.

Dynamo captures a graph; AOTAutograd functionalizes it, applies PyTorch's core-ATen decompositions
(except for ops with a native tpu lowering, which stay whole) and splits training graphs into a
forward and a backward graph; each graph becomes one StableHLO module (lower_graph.py), compiled
through the executable cache that eager uses (memory + disk).

Inference graphs keep input mutations inside the graph (keep_inference_input_mutations), so an
optimizer step writes the parameters' storages in place with donated buffers. In training graphs
AOTAutograd returns mutated buffers (BatchNorm running stats) and copies them back itself.

A graph with collectives (functional collectives: DTensor, FSDP2) is one program over its ranks'
devices where tpu_dist runs collectives on the devices, and is cut at them elsewhere (collectives.py).

A graph with an op the lowering cannot handle runs eagerly on tpu (a warning names the op and the
user code it came from), unless the frame was compiled with fullgraph=True (or
TORCH_TPU_COMPILE_FULLGRAPH=1), which raises instead. Dynamo recompiles under its guards on new
shapes; a graph captured with symbolic shapes (PyTorch's default dynamic=None after a size changed,
dynamic=True, mark_dynamic) compiles one executable per bucket of its sizes (buckets.py), or, where
it cannot read padding, one per concrete input shape, and says which and why in the log
"torch_tpu.dynamo" and torch_tpu.metrics.bucket_refusals().
"""
from __future__ import annotations

import functools
import warnings

import sympy

import torch
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._guards import CompileContext

from .. import _C, settings
from .. import metrics, recompiles
from ..lowering.overloads import resolve
from ..lowering import fast_path
from . import buckets, collectives
from .lower_graph import GraphProgram, Unsupported, log


@functools.lru_cache(maxsize=1)
def decompositions() -> dict:
    """Core-ATen decompositions, minus the ops the tpu lowers natively (one fused lowering beats
    its decomposition: e.g. native_layer_norm, _softmax, convolution_backward)."""
    table = {}
    for op, fn in core_aten_decompositions().items():
        if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten" and resolve(op) is not None:
            continue
        table[op] = fn
    # PyTorch's fused transformer inference kernels (nn.MultiheadAttention / TransformerEncoderLayer in
    # eval without grad) have no decomposition of their own: traced as eager runs them on tpu
    # (lowering/fast_path.py), so a compiled inference graph lowers (and buckets) them
    aten = torch.ops.aten
    table[aten._native_multi_head_attention.default] = fast_path.native_multi_head_attention
    table[aten._transformer_encoder_layer_fwd.default] = fast_path.transformer_encoder_layer_fwd
    return table


def _fullgraph_requested() -> bool:
    if settings.flag("TORCH_TPU_COMPILE_FULLGRAPH"):
        return True
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        tx = InstructionTranslator.current_tx()
    except Exception:  # noqa: BLE001  (not inside a Dynamo trace)
        return False
    return bool(tx is not None and (getattr(tx, "one_graph", False) or getattr(tx, "error_on_graph_break", False)))


def _is_dynamic(gm) -> bool:
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride())):
            return True
    return False


def _eager(gm, error: Exception, fullgraph: bool, name: str):
    if fullgraph:
        raise error
    metrics.count("graph_eager_fallbacks")
    warnings.warn(f"{error}\ntorch.compile(backend='tpu'): this {name} graph runs eagerly on tpu instead "
                  f"(fullgraph=True makes this an error).", stacklevel=2)
    return make_boxed_func(gm.forward)


def metrics_key(name: str) -> str:
    """What torch_tpu.metrics.program_causes() calls a graph of kind `name` being compiled now: Dynamo's
    compile id tells one graph from another of the same kind (generate()'s prefill from its decode step,
    both "inference"), and a static graph from the symbolic one Dynamo recompiles it as."""
    compile_id = CompileContext.current_compile_id()
    return f"{name} graph" + (f" [{compile_id}]" if compile_id is not None else "")


def compile_graph(gm: torch.fx.GraphModule, example_inputs, name: str, fullgraph: bool, counted: bool = False):
    """The boxed callable that runs `gm` on tpu: one executable, or the eager fallback. Its program
    counts in program_causes() unless `counted` (a per-shape program _PerShape has counted)."""
    if _is_dynamic(gm):
        log.info("%s graph has symbolic shapes: compiled per bucket of its sizes (TORCH_TPU_SHAPE_BUCKETS), "
                 "or per concrete input shape where it cannot be bucketed", name)
        return _boxed(_PerShape(gm, name, fullgraph))
    if not counted and example_inputs is not None:
        ts = [a for a in example_inputs if isinstance(a, torch.Tensor)]
        recompiles.note(metrics_key(name), tuple(t.dtype for t in ts), tuple(tuple(t.shape) for t in ts),
                        tuple(recompiles.layout_of(t) for t in ts), what="compiled graph")
    if collectives.has_collectives(gm):
        whole = _with_device_collectives(gm, name)
        if whole is not None:
            return whole
        return collectives.split_at_collectives(
            gm, lambda sub, sub_name: compile_graph(sub, None, sub_name, fullgraph, counted=True), name)
    try:
        return _boxed(GraphProgram(gm, name))
    except Unsupported as e:
        return _eager(gm, e, fullgraph, name)
    except Exception as e:  # noqa: BLE001  (a lowering or XLA error: still run the user's code)
        if fullgraph:
            raise
        return _eager(gm, RuntimeError(f"torch.compile(backend='tpu'): lowering the {name} graph failed: "
                                       f"{type(e).__name__}: {e}"), False, name)


def _with_device_collectives(gm, name: str):
    """A graph with collectives as one program over its ranks' devices, where tpu_dist runs the
    world's collectives on the devices; None where it does not, or where the graph's collectives
    cannot be one program (a group that does not tile the world as a mesh dimension does, a
    collective without a lowering): then the caller cuts the graph at its collectives."""
    from ..distributed.device_collectives import graph_replicas
    try:
        span = collectives.graph_span(gm)
    except ValueError as e:
        log.info("%s graph: cut at its collectives (%s)", name, e)
        return None
    replicas = graph_replicas(span)
    if replicas is None:
        return None
    try:
        return _boxed(GraphProgram(gm, name, replicas))
    except NotImplementedError as e:  # Unsupported, NotLowered
        log.info("%s graph: cut at its collectives (%s)", name, e)
        return None


def _boxed(prog):
    """A plain function taking the inputs as one list (AOTAutograd's boxed convention)."""
    def run(args):
        return prog(args)
    run._boxed_call = True
    run.program = prog
    return run


# Programs kept per graph with symbolic shapes (the least recently used shapes go past it or past
# PER_SHAPE_BYTES of programs, and are re-traced if they come back; their executables reload from
# the compilation cache).
PER_SHAPE_PROGRAMS = 256
PER_SHAPE_BYTES = 256 << 20


def _held_bytes(prog) -> int:
    """What one shape's compiled program holds (its executable's code), 0 where it has no single
    executable (a graph cut at collectives, or run eagerly): those count by entries alone."""
    exe = getattr(getattr(prog, "program", None), "exe", None)
    return exe.held_bytes if exe is not None else 0


class _PerShape:
    """A graph with symbolic shapes: one program per bucket of its symbols' values (buckets.py), or,
    where the graph cannot read padding (or TORCH_TPU_SHAPE_BUCKETS=off), re-traced with each call's
    concrete shapes, one program each."""
    _boxed_call = True

    def __init__(self, gm, name, fullgraph):
        self.gm, self.name, self.fullgraph = gm, name, fullgraph
        self.key = metrics_key(name)
        self.programs = _C.runtime.LruCache("compiled graph shapes", PER_SHAPE_PROGRAMS, PER_SHAPE_BYTES)
        self.sources = None
        self.refused = buckets.policy()[0] == "off" and "TORCH_TPU_SHAPE_BUCKETS=off"
        if not self.refused:
            try:
                if collectives.has_collectives(gm):
                    raise buckets.NotBucketable("collectives")
                self.sources = buckets.symbol_sources(gm)
                env = buckets.shape_env_of(gm)
                self.upper = {s: buckets.upper_bound(s, env) for s in self.sources}
            except buckets.NotBucketable as e:
                self._refuse(str(e))

    def _refuse(self, why: str) -> None:
        self.refused = why
        recompiles.refused_bucketing(self.key, why)
        log.info("%s graph: compiled per shape, not per bucket: %s", self.name, why)

    def _bucketed(self, args):
        """This call's program for its bucket, None where the graph cannot be bucketed."""
        values = buckets.values_of(self.sources, args)
        bounds = {s: buckets.bucket(v, self.upper[s]) for s, v in values.items()}
        key = ("bucket", tuple(bounds.values()),
               tuple((a.dtype, a.device) if isinstance(a, torch.Tensor) else None for a in args))
        prog = self.programs.get(key)
        if prog is None:
            bucketing = buckets.Bucketing(self.sources, bounds)
            log.info("%s graph: compiling for the bucket %s", self.name, {str(k): v for k, v in bounds.items()})
            try:
                prog = _boxed(GraphProgram(self.gm, self.name, bucketing=bucketing))
            except buckets.NotBucketable as e:
                self._refuse(str(e))
                return None
            except Exception as e:  # noqa: BLE001  (a lowering or XLA error on padded operands)
                log.debug("%s graph: bucketed lowering failed", self.name, exc_info=True)
                self._refuse(f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
                return None
            ts = [a for a in args if isinstance(a, torch.Tensor)]
            recompiles.note(self.key, tuple(t.dtype for t in ts), (tuple(bounds.values()),),
                            tuple(recompiles.layout_of(t) for t in ts), what="compiled graph bucket")
            self.programs.put(key, prog, _held_bytes(prog))
        return prog

    def __call__(self, args):
        if not self.refused:
            prog = self._bucketed(args)
            if prog is not None:
                return prog(args)
        key = tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args)
        entry = self.programs.get(key)
        if entry is None:
            from torch.fx.experimental.proxy_tensor import make_fx
            log.info("%s graph: compiling for input shapes %s", self.name,
                     [k[0] if isinstance(k, tuple) else k for k in key])
            ts = [a for a in args if isinstance(a, torch.Tensor)]
            recompiles.note(self.key, tuple(t.dtype for t in ts), tuple(tuple(t.shape) for t in ts),
                            tuple(recompiles.layout_of(t) for t in ts), what="compiled graph")
            strides = self._traced_strides(args)
            static = make_fx(self.gm, tracing_mode="fake")(*_restrided(args, strides))
            entry = (compile_graph(static, args, self.name, self.fullgraph, counted=True), strides)
            self.programs.put(key, entry, _held_bytes(entry[0]))
        prog, strides = entry
        return prog(_restrided(args, strides))

    def _traced_strides(self, args: list) -> dict:
        """{input index: strides} of the tensor inputs the graph reads (does not write) as the symbolic
        graph was traced, at this call's sizes (the per-shape key's). A backward's saved activation can
        arrive in another layout than its trace (a forward run per shape returns it dense where the
        trace had a transposed view), and the graph's views of it would then fail ("Cannot view a
        tensor with shape ... and strides ..."); _restrided copies such inputs into these strides."""
        phs = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        values = {}
        for ph, a in zip(phs, args):
            v = ph.meta.get("val")
            if isinstance(v, torch.SymInt) and isinstance(buckets.expr_of(v), sympy.Symbol):
                values[buckets.expr_of(v)] = int(a)
            elif isinstance(v, torch.Tensor) and isinstance(a, torch.Tensor):
                for s, n in zip(v.shape, a.shape):
                    if isinstance(buckets.expr_of(s), sympy.Symbol):
                        values[buckets.expr_of(s)] = n
        out = {}
        for i, (ph, a) in enumerate(zip(phs, args)):
            v = ph.meta.get("val")
            if not isinstance(v, torch.Tensor) or not isinstance(a, torch.Tensor) or a.dim() < 2 or a.numel() <= 1 or \
                    any(isinstance(u.target, torch._ops.OpOverload) and u.target._schema.is_mutable for u in ph.users):
                continue
            try:
                out[i] = tuple(buckets.evaluate(buckets.expr_of(st), values) for st in v.stride())
            except (KeyError, TypeError, ValueError):
                continue
        return out


def _restrided(args: list, strides: dict) -> list:
    """args with each input named in `strides` ({index: strides}) in those strides (a copy where its
    own differ)."""
    out = list(args)
    for i, want in strides.items():
        a = out[i]
        if a.stride() != want:
            out[i] = torch.empty_strided(a.shape, want, dtype=a.dtype, device=a.device).copy_(a)
    return out


# torch.compile's modes (Inductor's names). Each graph is one XLA executable launched once per call,
# its device inputs (weights, a static KV cache) used where they live and the ones it updates
# donated and written in place: what "reduce-overhead" buys Inductor through CUDA graphs (one launch
# instead of one per kernel) is how every tpu graph runs, and XLA tunes its own kernels; so every
# mode compiles the same way.
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """torch.compile(backend="tpu"); `mode` (torch.compile's) is one of MODES, else ValueError."""
    mode = kwargs.pop("mode", None)
    if mode is not None and mode not in MODES:
        raise ValueError(f"torch.compile(backend='tpu'): unrecognized mode={mode!r}; the modes are {', '.join(MODES)}")
    fullgraph = _fullgraph_requested()
    metrics.count("dynamo_graphs")
    compiler = aot_autograd(
        fw_compiler=functools.partial(_fw, fullgraph=fullgraph),
        bw_compiler=functools.partial(_bw, fullgraph=fullgraph),
        inference_compiler=functools.partial(_inference, fullgraph=fullgraph, name=inference_name(gm)),
        **aot_autograd_options(),
    )
    return compiler(gm, example_inputs, **kwargs)


def inference_name(gm) -> str:
    """What a graph AOTAutograd hands to its inference compiler (no output needs grad) is called in aot
    reports, profiler spans and logs: with torch._dynamo.config.trace_autograd_ops a training step's
    forward and backward are such a graph, whose Dynamo graph calls torch.autograd.grad."""
    backward = any(n.op == "call_function" and n.target in (torch.autograd.grad, torch.autograd.backward)
                   for n in gm.graph.nodes)
    return "forward+backward" if backward else "inference"


def aot_autograd_options() -> dict:
    """How AOTAutograd splits and decomposes a step for the tpu (this backend's and torch_tpu.aot's):
    core-ATen decompositions less our native lowerings; a min-cut partition, which recomputes cheap
    elementwise values (activations' intermediates, masks) in the backward instead of keeping them
    alive between the two programs (Inductor's choice; the default partition saves every intermediate
    the backward uses: GPT-2 small's step needed 30 GiB on one v5e chip); input mutations kept in
    inference graphs (an optimizer step writes its parameters in place)."""
    return dict(decompositions=decompositions(), partition_fn=min_cut_rematerialization_partition,
                keep_inference_input_mutations=True)


def _fw(gm, example_inputs, fullgraph=False):
    return compile_graph(gm, example_inputs, "forward", fullgraph)


def _bw(gm, example_inputs, fullgraph=False):
    return compile_graph(gm, example_inputs, "backward", fullgraph)


def _inference(gm, example_inputs, fullgraph=False, name="inference"):
    return compile_graph(gm, example_inputs, name, fullgraph)
