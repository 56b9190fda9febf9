"""aot.compile: a step's programs compiled for a TPU topology, and the report on them."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
import time

import torch

from .. import _C
from . import tracing
from .report import ProgramReport, Report
from .target import Topology, topology as get_topology


def compile(fn, *args, topology: str | Topology = "v5e:1x1", cache=None, **kwargs) -> Report:
    """Compiles the step `fn(*args, **kwargs)` for one device of a TPU `topology` and reports on it;
    runs nothing on any device.

    `fn` is traced as torch.compile(fn, backend="tpu") would trace it: every graph it gives (forward,
    backward, optimizer step; a graph break splits it as it would there) is lowered once, as on a TPU
    (Pallas kernels for Mosaic), and compiled by libtpu for the topology. Arguments (and the tensors
    `fn` uses) may be on the meta device: a model too big for this machine can be checked, as nothing
    is allocated at full size; or on tpu, where graph outputs are never computed (tpu memory is only
    taken when written). Either way the step writes no input: parameters and optimizer state keep
    their values (eager code between graphs, such as autograd accumulating gradients, still runs).

    topology: a name ("v5e:1x1", "v5e:2x2", "v4:2x2x1", "v5p:2x2x1", "v6e:4x4", ...) or a Topology.
    cache: None (write nothing); True (write the TPU executables into this process's executable
        cache tiers: disk, tier 2, tier 3 as configured); or a directory, or a list of them (e.g. the
        TPU job's TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT or TORCH_TPU_CACHE_DIR). Each is written under
        the key the runtime on a TPU with the same libtpu computes (compile_cache.program_key), so the job's
        first step compiles nothing.

    Changing sizes: a size marked with torch._dynamo.mark_dynamic(tensor, dim, min=..., max=...) (a
    sequence length, say 1..2048) is symbolic in the graphs, and each graph is compiled once per bucket
    of that range (TORCH_TPU_SHAPE_BUCKETS, as the runtime buckets it: 16, 32, ..., 2048 by default);
    the report names each program's bucket ("forward graph bucket s0<=64"), and `cache` holds them
    all. The TPU job marks the same size with the same max (its runtime then computes the same buckets
    and keys) and compiles none of them. A size marked without a max, or a graph that cannot be
    bucketed (dynamo/buckets.py says why), is a failed program in the report.

    Collectives: a graph with functional collectives (DTensor, tensor parallelism, funcol calls) is
    lowered with them inside, as one program over the devices of the ranks that run it (the world
    for a mesh's collectives): the process group (e.g. dist.init_process_group("fake", ...) with the
    job's world size) gives the ranks, and rank k runs on the topology's k-th device
    (ProgramReport.ranks). Such programs are not written to `cache`.

    Returns a Report (print it for a table). Raises what `fn` raises while tracing, ValueError for an
    unknown topology, RuntimeError when libtpu is not installed. A graph that cannot be lowered or
    compiled is not raised: its ProgramReport carries the error (Report.ok is False)."""
    t0 = time.perf_counter()
    topo = topology if isinstance(topology, Topology) else get_topology(topology)
    dirs = _cache_dirs(cache)
    session = tracing.Session()
    compiled = torch.compile(fn, backend=tracing.backend)
    # Symbolic only where the user marked a size dynamic (its buckets are compiled): a later call with
    # other shapes is traced for them, not made symbolic by Dynamo's automatic dynamic shapes.
    with session.active(), torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        compiled(*args, **kwargs)
    report = Report(topology=topo.name, device_kind=topo.kind, device_memory_bytes=topo.device_memory_bytes,
                    programs=[r for r, _ in session.reached])
    first: dict[str, ProgramReport] = {}  # a graph the step ran twice is compiled once
    for r in report.programs:
        if r.error is None:
            first.setdefault(r.text, r)
    todo = list(first.values())
    # libtpu compiles independent programs in parallel; each compile is mostly one thread.
    workers = max(1, min(len(todo), os.cpu_count() or 1, 4))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda r: _compile_one(topo, r), todo))
    for i, r in enumerate(report.programs):
        done = first.get(r.text) if r.error is None else None
        if done is not None and done is not r:
            report.programs[i] = dataclasses.replace(done, name=r.name, live_bytes=r.live_bytes)
    if cache is not None and cache is not False:
        written = set()
        for r in report.programs:
            if r.ok and r.serialized and r.replicas == 1:  # the runtime has no key for replicated programs yet
                written.update(_C.runtime.cache_store(r.key, r.serialized, r.compile_seconds, dirs))
        report.cached = sorted(written)
    report.seconds = time.perf_counter() - t0
    return report


def _cache_dirs(cache) -> list[str]:
    if cache is None or cache is False or cache is True:
        return []
    items = [cache] if isinstance(cache, (str, os.PathLike)) else cache
    if not isinstance(items, (list, tuple)) or not items or not all(isinstance(d, (str, os.PathLike)) for d in items):
        raise TypeError(f"cache must be None, True, a directory or a list of directories, got {cache!r}")
    return [os.path.expanduser(os.fspath(d)) for d in items]


def _compile_one(topo: Topology, r: ProgramReport) -> None:
    r.key = topo.key(r.text)
    t0 = time.perf_counter()
    try:
        if r.ranks and max(r.ranks) >= len(topo.devices):
            raise ValueError(f"{r.name} runs collectives across {len(r.ranks)} ranks {list(r.ranks)}, but {topo.name} (x{topo.num_slices}) "
                             f"has {len(topo.devices)} devices: compile for a topology with one device per rank")
        devices = [topo.devices[k].id for k in r.ranks] if r.ranks else None
        c = topo.compile(r.text, devices=devices)
    except (TypeError, ValueError, RuntimeError) as e:
        r.error = str(e)
        # What it would hold at least (its arguments and new outputs), so that the step's peak and
        # fit still count it: a program too big for the device fails here with CompileTimeHbmOom.
        r.argument_bytes, r.output_bytes, r.alias_bytes = _signature_bytes(r.text)
        r.peak_bytes = r.argument_bytes + r.output_bytes - r.alias_bytes
        return
    finally:
        r.compile_seconds = time.perf_counter() - t0
    cost = c["cost"]
    r.flops = cost.get("flops", 0.0)
    r.bytes_accessed = cost.get("bytes accessed", 0.0)
    r.transcendentals = cost.get("transcendentals", 0.0)
    seconds = cost.get("optimal_seconds", -1.0)
    r.estimated_seconds = seconds if seconds >= 0 else None  # negative: the cost model cannot time it
    r.argument_bytes = max(c["argument_bytes"], 0)
    r.output_bytes = max(c["output_bytes"], 0)
    r.alias_bytes = max(c["alias_bytes"], 0)
    r.temp_bytes = max(c["temp_bytes"], 0)
    r.code_bytes = max(c["code_bytes"], 0)
    own = r.argument_bytes + r.output_bytes - r.alias_bytes + r.temp_bytes
    r.peak_bytes = max(c["peak_bytes"], own)
    r.serialized = c["serialized"]


# Bytes per element of the StableHLO element types a program's signature can carry.
_ELEMENT_BYTES = {"i1": 1, "i8": 1, "ui8": 1, "f8E4M3FN": 1, "f8E5M2": 1, "f8E4M3FNUZ": 1, "f8E5M2FNUZ": 1,
                  "i16": 2, "ui16": 2, "f16": 2, "bf16": 2, "i32": 4, "ui32": 4, "f32": 4, "i64": 8, "ui64": 8,
                  "f64": 8, "complex<f32>": 8, "complex<f64>": 16}
_TENSOR = re.compile(r"tensor<((?:\d+x)*)(complex<\w+>|\w+)>")


def _signature_bytes(text: str) -> tuple[int, int, int]:
    """(argument, output, aliased output) bytes of a program's @main by its types, as dense arrays
    (without the padding of TPU tiled layouts)."""
    m = re.search(r"func\.func public @main\((.*?)\)\s*->\s*(\(.*?\)|tensor<[^{]*?>)\s*(?:attributes\b[^{]*)?\{",
                  text, re.S)
    if m is None:
        return 0, 0, 0

    def size(t):
        dims, elem = t
        n = 1
        for d in dims.split("x")[:-1]:
            n *= int(d)
        return n * _ELEMENT_BYTES.get(elem, 4)
    args = [(a, _TENSOR.search(a)) for a in re.split(r",\s*(?=%)", m.group(1))]
    arg_bytes = sum(size(t.groups()) for _, t in args if t)
    outs = [size(t) for t in _TENSOR.findall(m.group(2))]
    aliased = [int(k) for a, t in args if t for k in re.findall(r"tf\.aliasing_output = (\d+)", a)]
    alias = sum(outs[k] for k in aliased if k < len(outs))
    return arg_bytes, sum(outs), alias
