"""Counters of what the tpu device did: compiles, cache hits, executions, transfers, fallbacks."""
from __future__ import annotations

import collections

from . import _C, recompiles

# Counters Python keeps (torch.compile's graphs: compiled_graphs, graph_executions, ...); the runtime's
# and eager's own counters live in C++ (_C.runtime.counters, _C.eager.plan_cache_stats).
_counts: collections.Counter = collections.Counter()


def count(name: str, n: int = 1) -> None:
    """Adds n to the Python-side counter `name` (reported by counters())."""
    _counts[name] += n


def fallback_counts() -> dict:
    """Per op overload ("aten::name.overload"): how many times it ran through the CPU fallback."""
    return dict(_C.device.fallback_counts())


def counters() -> dict:
    """All counters: compiles, executions, plan_cache_hits / plan_cache_misses (eager's plan cache:
    a miss is a call key's first use in this process, which builds its plan and may still find the
    program in the program cache: program_cache_* count those), host/device transfers and
    bytes (h2d/d2h), host_syncs, busy_inputs_kept (buffers not donated because a running program
    still read them: TORCH_TPU_KEEP_BUSY_BYTES), fallbacks (total), and for torch.compile(backend="tpu"):
    compiled_graphs, graph_executions, graph_eager_fallbacks, graph_input_copies (inputs passed as a
    copy: a view that is not its whole storage, or a storage whose buffer has other dims) and
    bucket_input_uploads / bucket_input_copies (inputs of symbolic size given a bucket-sized buffer that
    did not come from a bucketed graph: uploaded again from the bytes kept from their upload, a
    transfer, or copied on the device by a program compiled per shape)."""
    d = dict(_C.runtime.counters())
    plans = _C.eager.plan_cache_stats()
    d["plan_cache_hits"], d["plan_cache_misses"] = plans["hits"], plans["misses"]
    d["fallbacks"] = sum(fallback_counts().values())
    # the program cache's tiers (shared by all eager modes and torch.compile)
    for k, v in _C.runtime.cache_stats().items():
        d["program_cache_" + k] = v
    d.update(_C.eager.fused_stats())  # fused eager: ops recorded, runs flushed, fused programs built
    for k in ("compiled_graphs", "graph_executions", "graph_eager_fallbacks", "bucket_input_uploads",
              "bucket_input_copies"):  # torch.compile
        d[k] = _counts[k]
    return d


def program_causes() -> dict:
    """Per op overload (eager) or graph (torch.compile, a graph with symbolic shapes, named by its
    kind and Dynamo's compile id: "forward graph [0/1]"): how many programs it made, by cause:
    "first", "new shape", "new bucket" (a bucketed graph's next bucket), "new dtype", "new layout",
    "new arguments" (torch_tpu/recompiles.py). E.g. {"aten::mm": {"first": 1, "new shape": 11}}."""
    with recompiles._lock:
        return {name: dict(c) for name, c in recompiles.causes.items()}


def host_caches() -> dict:
    """Per in-memory cache of this process: entries, capacity, bytes (what its values hold: a
    program's generated code, a buffer's size), max_bytes (0: bounded by entries alone), hits, misses
    and evictions (since the last reset()). Every cache is an LRU bounded by entries and bytes:
    "plans" (eager call signatures), "executables in memory" (the compilation cache's first tier),
    "scalar operand buffers", "fused programs" and "compiled graph shapes" (torch.compile graphs
    with symbolic shapes, all graphs summed); those holding programs keep at most 1 GiB of them
    (compiled graph shapes: 256 MiB per graph)."""
    return dict(_C.runtime.host_caches())


def bucket_refusals() -> dict:
    """Per compiled graph with symbolic sizes that is compiled per concrete shape instead of per shape
    bucket (torch_tpu/dynamo/buckets.py), named as in program_causes: why, e.g. {"forward graph
    [0/1]": "split_with_sizes.default along a symbolic dimension (node split)"}."""
    with recompiles._lock:
        return dict(recompiles.refusals)


def report() -> str:
    """A readable summary of counters(), fallback_counts() and program_causes()."""
    lines = [f"{k}: {v}" for k, v in counters().items()]
    causes = program_causes()
    remade = {n: c for n, c in causes.items() if sum(c.values()) > 1}
    if remade:
        lines.append("programs made more than once, by cause:")
        lines += [f"  {n}: {c}" for n, c in sorted(remade.items(), key=lambda kv: -sum(kv[1].values()))]
    fb = fallback_counts()
    if fb:
        lines.append("CPU fallbacks by op:")
        lines += [f"  {k}: {v}" for k, v in sorted(fb.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)


def reset() -> None:
    """Sets every counter to zero."""
    _C.runtime.reset_counters()
    _C.device.reset_fallback_counts()
    _C.runtime.cache_reset_stats()
    _C.eager.plan_cache_reset_stats()
    _C.runtime.reset_host_cache_stats()
    _C.eager.fused_reset_stats()
    recompiles.reset()
    _counts.clear()
