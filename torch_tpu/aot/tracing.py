"""torch_tpu.aot.compile's trace: a step's graphs as torch.compile(backend="tpu") would build them,
lowered for TPU, with nothing run on any device.

The function is compiled by Dynamo with a backend of our own that takes AOTAutograd's graphs
(forward, backward, inference: the same decompositions and options as the "tpu" backend), lowers each
with the graph lowering that backend uses (dynamo/lower_graph.py, Pallas kernels for Mosaic:
runtime.lowering_for("tpu")) and returns a stand-in for its executable: called, it hands back
tensors of the outputs' shapes, strides and dtypes on the inputs' device, allocating nothing on
tpu until written (and nothing at all on meta), and writes no input. The step then goes on as usual
(autograd calls the backward's stand-in, Dynamo compiles the optimizer's step), so every graph is
reached in order, and at each the stand-in records which other device tensors are alive.

Meta tensors are traced as tpu tensors are (_meta_traced_as_tpu): a model built on the meta device
gives the graphs it would give on tpu; its stand-ins' outputs are meta tensors.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import re
import threading

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import FakeTensor

from .. import runtime
from ..dynamo import backend as tpu_backend
from ..dynamo import buckets, collectives
from ..dynamo.lower_graph import GraphProgram
from ..lowering.strided import contiguous_strides
from .report import ProgramReport

_active: "Session | None" = None  # process-wide: autograd runs backwards on its device threads
_lock = threading.Lock()  # one aot.compile at a time


class Session:
    """The programs one aot.compile call reached, in order: (ProgramReport, its GraphProgram or None)."""

    def __init__(self):
        self.reached: list[tuple[ProgramReport, GraphProgram | None]] = []

    @contextlib.contextmanager
    def active(self):
        global _active
        with _lock:
            _active = self
            try:
                with runtime.lowering_for("tpu"), _meta_traced_as_tpu():
                    yield
            finally:
                _active = None


def _current() -> Session:
    s = _active
    if s is None:
        raise RuntimeError("a function compiled by torch_tpu.aot.compile was called outside it: it only traces "
                           "for a TPU target; use torch.compile(fn, backend='tpu') to run it")
    return s


@contextlib.contextmanager
def _meta_traced_as_tpu():
    """While tracing, the FakeTensors Dynamo makes of meta tensors say tpu:0: the graphs are then the
    ones tpu tensors give (PyTorch picks foreach optimizers for tpu, not meta; and AOTAutograd loses
    nll_loss's gradient on meta FakeTensors: a backward of all None). PyTorch internals:
    torch._subclasses.meta_utils.MetaConverter.__call__ and its callback(make_meta_t, device), through
    which FakeTensorConverter.from_real_tensor sets a fake's device."""
    from torch._subclasses import meta_utils
    original = meta_utils.MetaConverter.__call__
    tpu = torch.device("tpu", 0)

    @functools.wraps(original)
    def call(self, t, *args, callback=None, **kwargs):
        if callback is not None and isinstance(t, torch.Tensor) and t.device.type == "meta":
            inner = callback

            def callback(make_meta_t, device=None):
                return inner(make_meta_t, tpu if device is None or torch.device(device).type == "meta" else device)
        return original(self, t, *args, callback=callback, **kwargs)
    meta_utils.MetaConverter.__call__ = call
    try:
        yield
    finally:
        meta_utils.MetaConverter.__call__ = original


def backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The Dynamo backend of aot.compile (one function for every call, so that Dynamo's cache entries
    for it are reused by later aot.compile calls of the same function: the stand-ins report to the
    session calling them)."""
    compiler = aot_autograd(
        fw_compiler=functools.partial(_graph, name="forward"),
        bw_compiler=functools.partial(_graph, name="backward"),
        inference_compiler=functools.partial(_graph, name=tpu_backend.inference_name(gm)),
        **tpu_backend.aot_autograd_options(),
    )
    return compiler(gm, example_inputs, **kwargs)


def _graph(gm, example_inputs, name):
    # A graph with functional collectives is one program over its ranks' devices (GraphProgram.span;
    # lowering/collectives.py), as on a plugin with device collectives.
    if buckets.shape_env_of(gm) is not None and not collectives.has_collectives(gm):
        return _bucketed(gm, name)
    try:
        prog = GraphProgram.lowered(gm, name)
    except Exception as e:  # noqa: BLE001  (an op without a lowering: a failed program in the report)
        return _boxed(_Unlowered(ProgramReport(f"{name} graph", error=f"{type(e).__name__}: {e}"), gm))
    return _boxed(_StandIn(prog, tuple(prog.span or ())))


def _bucketed(gm, name):
    """A graph with symbolic sizes (torch._dynamo.mark_dynamic(t, dim, min=, max=) on an input): one
    program per bucket of each symbol's range, as the runtime builds them (dynamo/backend.py's
    _PerShape, TORCH_TPU_SHAPE_BUCKETS), so a job whose lengths change starts with all of them."""
    try:
        sources = buckets.symbol_sources(gm)
        env = buckets.shape_env_of(gm)
        ranges = {}
        for sym in sources:
            high = buckets.upper_bound(sym, env)
            if high is None:
                raise buckets.NotBucketable(
                    f"the size {sym} has no largest value: give it one with torch._dynamo.mark_dynamic(tensor, dim, "
                    "min=..., max=...) to compile its buckets ahead of time")
            ranges[sym] = buckets.buckets_between(buckets.lower_bound(sym, env), high)
        programs = {}
        for bounds in itertools.product(*ranges.values()):
            bounds = dict(zip(sources, bounds))
            programs[tuple(bounds.values())] = GraphProgram.lowered(gm, name, bucketing=buckets.Bucketing(sources, bounds))
    except Exception as e:  # noqa: BLE001  (NotBucketable, an op without a lowering: a failed program)
        return _boxed(_Unlowered(ProgramReport(f"{name} graph (buckets)", error=f"{type(e).__name__}: {e}"), gm))
    return _boxed(_BucketedStandIn(sources, {k: _StandIn(p, ()) for k, p in programs.items()}))


def _boxed(runner):
    """A plain function taking the inputs as one list (AOTAutograd's boxed convention; a function, as
    Dynamo's wrappers copy a function's attributes but not a callable object's class attributes)."""
    def run(args):
        return runner(args)
    run._boxed_call = True
    return run


class _StandIn:
    """A lowered graph's place in the step: returns its outputs' shapes without computing them."""

    def __init__(self, prog: GraphProgram, ranks: tuple[int, ...]):
        self.prog, self.ranks = prog, ranks
        # Mosaic kernels: custom calls to tpu_custom_call (JAX's printed form, or generic syntax).
        self.mosaic = len(re.findall(r'@tpu_custom_call\b|call_target_name = "tpu_custom_call"', prog.text))

    def report_only(self, real) -> torch.device:
        """Adds this program to the session's report (the step reached it with inputs `real`)."""
        prog = self.prog
        device = _default_device(real)  # meta or tpu: the graph's fakes say tpu either way
        report = ProgramReport(prog.label, text=prog.text, mosaic_kernels=self.mosaic,
                               live_bytes=_live_bytes(device, real), replicas=max(len(self.ranks), 1),
                               ranks=self.ranks)
        _current().reached.append((report, prog))
        return device

    def __call__(self, args):
        real = list(args)
        args.clear()
        return self.outputs(real, self.report_only(real))

    def outputs(self, real, device):
        """Tensors of the outputs' shapes, strides and dtypes (nothing computed) on `device`."""
        prog = self.prog
        host = prog.host.run(real)  # the CPU part (step counts): PyTorch's CPU kernels, tiny

        def standin(k):
            spec = prog.prog_specs[k]
            stride = spec.strides if spec.strides is not None else contiguous_strides(spec.sizes)
            return torch.empty_strided(spec.sizes, stride, dtype=spec.dtype, device="cpu" if prog.prog_to_cpu[k] else device)
        return prog.outputs(real, host, standin)


class _BucketedStandIn:
    """A bucketed graph's place in the step: reports every bucket's program (named by its bounds) and
    returns the outputs of the call's own bucket."""

    def __init__(self, sources: dict, standins: dict):
        self.sources, self.standins = sources, standins
        for bounds, s in standins.items():
            s.prog.label += " bucket " + ",".join(f"{sym}<={b}" for sym, b in zip(sources, bounds))

    def __call__(self, args):
        values = buckets.values_of(self.sources, list(args))
        high = {sym: max(k[i] for k in self.standins) for i, sym in enumerate(self.sources)}
        own = tuple(buckets.bucket(values[sym], high[sym]) for sym in self.sources)
        real = list(args)
        args.clear()
        device = None
        for bounds in sorted(self.standins):
            device = self.standins[bounds].report_only(real)
        self.standins[own].prog._values = values  # the true sizes its outputs are cut to
        return self.standins[own].outputs(real, device)


class _Unlowered:
    """A graph that cannot be lowered: reported as failed; runs as PyTorch would on its inputs (on
    meta tensors, shapes only) so that the rest of the step is still reached."""

    def __init__(self, report: ProgramReport, gm):
        self.report, self.run = report, make_boxed_func(gm.forward)

    def __call__(self, args):
        session = _current()
        session.reached.append((ProgramReport(self.report.name, error=self.report.error), None))
        return self.run(args)


def _default_device(tensors):
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":
            return t.device
    return torch.device("meta")


def _live_bytes(device: torch.device, args) -> int:
    """Bytes of the storages of every tensor on `device` that Python holds now, except the program's
    arguments (its own peak counts those). Tensors held only by C++ (autograd's saved tensors) are not
    seen: between a forward and its backward, those are the backward's arguments."""
    def same(t):
        return t.device.type == device.type and (device.index is None or t.device.index in (None, device.index))

    mine = {t.untyped_storage()._cdata for t in args if isinstance(t, torch.Tensor) and same(t)}
    # Unreachable tensors that only a reference cycle keeps (an earlier step's model and optimizer)
    # are still among gc's objects: collected first, they are not counted as alive.
    gc.collect()
    seen, total = set(), 0
    for obj in gc.get_objects():
        kind = type(obj)  # not isinstance: a dead weakref.proxy raises on it
        if not issubclass(kind, torch.Tensor) or issubclass(kind, FakeTensor) or not same(obj):
            continue
        try:
            st = obj.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested: not on tpu
            continue
        key = st._cdata
        if key in mine or key in seen:
            continue
        seen.add(key)
        total += st.nbytes()
    return total
