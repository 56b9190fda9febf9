"""The running PJRT plugin and the compile entry: which plugin runs the tpu device (chosen and
prepared by its kind's entry in torch_tpu/plugins.py, which TORCH_TPU_PJRT_PLUGIN names), facts
about it once started, the platform programs are lowered for, and `compile`, which looks programs
up in the executable cache (torch_tpu/compile_cache.py: its tiers, key and statistics). Choosing
does not start the device: the PJRT client is created on first use.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
from typing import Sequence

from . import _C, compile_cache, plugins, settings


def configure() -> None:
    """Tells the core which plugin to load when the device is first used (does not start it), after
    its kind's preparation (plugins.Plugin.prepare: XLA flags, process environment, create options)."""
    path, error = plugins.resolve()
    options = []
    kind = plugins.kind_of(path)
    if kind is not None:
        try:
            options = kind.prepare()
        except ValueError as e:  # raised on first use, as a missing plugin is: importing still works
            path, error = "", str(e)
    _C.runtime.configure(path, error, options, _torchrun_job_store())
    try:  # before the client starts: a warm start's loads run on the pool (csrc/runtime/warm_start.h)
        _C.runtime.set_compile_threads(_compile_threads())
    except ValueError:
        pass  # raised by the first compile (compile() sets it again), which names the setting


def _torchrun_job_store() -> bool:
    """True in a worker of a multi-process torchrun job, whose elastic agent serves the job's store
    (TORCHELASTIC_USE_AGENT_STORE=True, MASTER_ADDR:MASTER_PORT) before any worker starts: the PJRT
    client is then created with that store behind its key-value callbacks, through which libtpu's
    processes (and the CUDA plugin's) exchange what they need (csrc/distributed/job_store.h; the CPU
    plugin ignores them). Connected when the client starts, not at import."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return False
    return (world > 1 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            and bool(os.environ.get("MASTER_ADDR")) and bool(os.environ.get("MASTER_PORT")))


def start() -> None:
    """Starts the PJRT client if needed (the first start on a machine without a TPU warns once
    that the tpu device runs on the XLA CPU plugin)."""
    _C.runtime.start()


_platform_name: str | None = None


def platform() -> str:
    """The PJRT platform that runs the tpu device: "tpu", "cuda" or "cpu" (starts the device). A
    process has one client, so the name is asked once (eager asks it per new call key)."""
    global _platform_name
    if _platform_name is None:
        start()
        _platform_name = _C.runtime.platform_name()
    return _platform_name


def platform_version() -> str:
    start()
    return _C.runtime.platform_version()


def api_version() -> tuple[int, int]:
    """(major, minor) PJRT C API version the plugin reports."""
    start()
    return tuple(_C.runtime.api_version())


def plugin_path() -> str:
    start()
    return _C.runtime.plugin_path()


# -- the platform programs are lowered for ------------------------------------------------------
_lowering_platform: str | None = None


def lowering_platform() -> str:
    """The platform programs are lowered for: "cpu", "cuda" or "tpu". It is the running plugin's
    (starting it), except while torch_tpu.aot lowers for a compile-only target (lowering_for).
    Lowerings that differ by platform ask it: Pallas kernels (Mosaic on TPU, interpret mode elsewhere)."""
    if _lowering_platform is not None:
        return _lowering_platform
    name = platform().lower()
    kind = plugins.for_platform(name)
    return kind.name if kind is not None else name


@contextlib.contextmanager
def lowering_for(platform_name: str):
    """Lowers for `platform_name` ("tpu") inside the block, whatever plugin runs here. Process-wide,
    not per thread: autograd lowers a backward graph on its own device threads."""
    global _lowering_platform
    prev, _lowering_platform = _lowering_platform, platform_name
    try:
        yield
    finally:
        _lowering_platform = prev


def compile(program: str, name: str = "program", device_ids: Sequence[int] | None = None, one_op: bool = False,
            outputs: Sequence[tuple] | None = None):
    """The executable of a StableHLO program (text with a public @main), through the cache shared
    by eager and torch.compile. Its key (program_key) covers the program text, the plugin's identity
    (target_identity: platform, version, API version, and its path except for libtpu), the compile
    options, XLA_FLAGS / LIBTPU_INIT_ARGS and the torch_tpu version. `name` says what the program is
    (an op overload, a fused run, a compiled graph) in profiler traces and errors: a compile is the span
    "compile <name>", a disk-cache hit "load <name> from the disk cache". On a TPU, a program that
    the running plugin's compiler cannot build (plugins.Plugin.refusal: TPU's, tpu_refusals.py) raises a
    TypeError naming the op and dtype;
    under shadow mode (TORCH_TPU_SHADOW_TOPOLOGY) the program is also compiled for that topology.
    `device_ids`: PJRT device ids (global: a multi-process job's other devices included) to compile one
    replica on each of, in replica order (a collective program, run with _C.runtime.launch_replicas or
    tpu_dist's device path); None: one replica, one partition, runnable on any device.
    `one_op`: an eager op's own program. On the CPU plugin it is compiled at XLA backend optimization
    level TORCH_TPU_OP_OPT_LEVEL (default 1, XLA's default is 3): measured on 116 eager programs of a
    transformer-like step, level 1 compiles in 46-57 ms against 64-72 ms at 3, and runs as fast
    (elementwise, reductions, softmax, layer norm, conv, matmul within noise); level 0 compiles in
    ~33 ms but runs elementwise ops 3-20x slower. Other plugins keep their compilers' defaults.
    `outputs`: (torch dtype, shape) of each @main result. Given, a program not in memory is compiled
    by the compile pool (TORCH_TPU_COMPILE_THREADS threads; csrc/runtime/compile_pool.h) and a
    *pending* executable is returned at once: its launches queue now and wait for it on the launcher
    thread, and a compile error fails them (raised at the next sync, naming `name`). Programs that
    inline a custom kernel compile here (their error needs the message below)."""
    global _identity, _refusal, _op_level
    if _identity is None:
        start()
        kind = plugins.for_platform(_C.runtime.platform_name().lower())
        _refusal = kind.refusal if kind is not None else None
        rt = _C.runtime
        _identity = compile_cache.target_identity(rt.platform_name(), rt.platform_version(), tuple(rt.api_version()), rt.plugin_path())
        _op_level = _one_op_level(rt.platform_name())
        _C.runtime.set_compile_threads(_compile_threads())
    options, key = b"", program
    if device_ids is not None:  # the options name the devices: the key covers them
        options = _C.runtime.replica_compile_options([int(d) for d in device_ids])
    elif one_op and _op_level is not None:
        options = _C.runtime.compile_options_at_level(_op_level)
    if options:
        key = program + "\0" + options.hex()
    if _refusal is not None:
        why = _refusal(program, 1 if device_ids is None else len(device_ids))
        if why:
            raise TypeError(f"tpu: {name}: {why}")
    if _SHADOW is not None and device_ids is None:  # shadow mode compiles for one device
        _SHADOW(program, name)
    if outputs is not None and device_ids is None and not _KERNEL_FUNCTION.search(program):
        return _C.runtime.compile_async(compile_cache.program_key(_identity, key), program, name, options, list(outputs))
    try:
        return _C.runtime.compile_cached(compile_cache.program_key(_identity, key), program, name, options)
    except RuntimeError as e:
        if "Failed to parse" in str(e) and _KERNEL_FUNCTION.search(program):
            jax = sys.modules.get("jax")
            raise RuntimeError(f"{e}\nThe program inlines a custom kernel's StableHLO (torch_tpu.pallas), written by "
                               f"JAX {getattr(jax, '__version__', '?')}: this plugin's XLA may not read that StableHLO "
                               "version. Install the JAX that torch_tpu's kernels extra pins "
                               "(pip install 'torch_tpu[kernels]').") from None
        raise


_identity: str | None = None  # compile_cache.target_identity of the running plugin (set on first compile)
_refusal = None  # what the running plugin's compiler refuses (plugins.Plugin.refusal; set with _identity)
_op_level: int | None = None  # one-op programs' optimization level (set with _identity; None: the default)


def _one_op_level(platform: str) -> int | None:
    """TORCH_TPU_OP_OPT_LEVEL on the CPU plugin unless XLA_FLAGS sets the level itself; else None."""
    if platform != "cpu" or "xla_backend_optimization_level" in settings.get("XLA_FLAGS"):
        return None
    raw = settings.get("TORCH_TPU_OP_OPT_LEVEL")
    if raw not in ("0", "1", "2", "3"):
        raise ValueError(f"TORCH_TPU_OP_OPT_LEVEL={raw!r}: expected 0, 1, 2 or 3 (XLA's backend optimization level)")
    return int(raw)


def _compile_threads() -> int:
    """TORCH_TPU_COMPILE_THREADS: the compile pool's threads; unset: one per core this process may use
    (XLA's compile of one program is single-threaded: measured here, 12 one-op programs compiled in
    0.62 s one after another and in 0.29 s on two threads on a 2-core machine)."""
    raw = settings.get("TORCH_TPU_COMPILE_THREADS")
    if raw is None:
        return max(1, len(os.sched_getaffinity(0)))
    if not raw.isdigit():
        raise ValueError(f"TORCH_TPU_COMPILE_THREADS={raw!r}: expected a number of threads (0: compile on the "
                         "calling thread)")
    return int(raw)


# Shadow mode's hook (torch_tpu/aot/shadow.py sets it): called with each program compiled here.
_SHADOW = None


# The functions of custom kernels (torch_tpu/pallas/program.py names them k<16 hex digits>_<name>).
_KERNEL_FUNCTION = re.compile(r"func\.func private @k[0-9a-f]{16}_")
