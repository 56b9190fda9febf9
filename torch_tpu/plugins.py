"""The PJRT plugins the tpu device runs on: one description per kind (as PyTorch/XLA's PjRtPlugin
registry keeps one per device type), holding everything torch_tpu does differently for it:

- how its .so is found (an installed package) and whether its hardware is here (the automatic choice);
- what is set up before its client starts: process environment, the XLA flags torch_tpu adds, the
  client's create options (`prepare`; a ValueError makes the device unusable with that message,
  raised at first use, so importing torch_tpu still works);
- the platform programs are lowered for, from the PJRT platform name the client reports;
- whether its executables are named by the plugin's file in the cache key (compile_cache.target_identity);
- what its compiler refuses before it sees a program (`refusal`; TPU's: tpu_refusals.py).

`TORCH_TPU_PJRT_PLUGIN` names one (`cpu`, `cuda`, `tpu`) or the path of any plugin .so (a path that is
none of these kinds gets no setup). Unset: the first kind of KINDS whose hardware is present and whose
plugin is installed.
Adding a plugin is one Plugin in KINDS and its tests.
"""
from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Callable

from . import settings, tpu_refusals

ENV = "TORCH_TPU_PJRT_PLUGIN"


def _package_file(package: str, *names: str) -> str | None:
    """The first of `names` inside the installed package `package` (a namespace package's folders
    included), or None."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        for n in names:
            p = os.path.join(d, n)
            if os.path.exists(p):
                return p
    return None


# -- XLA flags torch_tpu adds ------------------------------------------------------------------
# Left out of executable keys (compile_cache.target_identity): a TPU key that torch_tpu.aot writes on a
# CPU host, or in a process started by one (which inherits them), equals the key the TPU VM computes.
# What they change in CPU and CUDA executables is covered by compile_cache.FORMAT instead. Why each:
# - fast_min_max=false: XLA's maximum / minimum propagate NaN (as torch.maximum, amax and max_pool do,
#   and as on TPU), but XLA:CPU's and XLA:GPU's default debug options make them return the other
#   operand (TensorFlow's old Eigen behaviour). JAX turns it off in its compile options; we do here,
#   so that lowerings emit the bare StableHLO op on every target.
# - xla_cpu_use_xnnpack=false: XLA:CPU's XNNPACK dot (xla-cpu-pjrt 0.0.1) captures a dot's right-hand
#   operand by value when it is a parameter of the program: it packs the weights once and reuses the
#   packing while the parameter's buffer has the same address. torch_tpu updates buffers in place (a
#   donated input's result is written where the input was: optimizer steps, add_, copy_) and the
#   allocator reuses freed addresses, so `g @ w` after `w.add_(1)` returned the old product (issue 50).
#   XLA's own comment on that capture says the address is not a sound identity. Eigen's dot is as fast
#   here (benchmarks/bench_cpu_dot.py).
CPU_NAN_MIN_MAX = "--xla_cpu_enable_fast_min_max=false"
GPU_NAN_MIN_MAX = "--xla_gpu_enable_fast_min_max=false"
NO_XNNPACK = "--xla_cpu_use_xnnpack=false"


def own_xla_flag(flag: str) -> None:
    """Adds `flag` ("--name=value", one of some Plugin's xla_flags) to XLA_FLAGS, which the plugin reads
    at its first compile, unless the user set that flag's name themselves (their setting is kept)."""
    name = flag.split("=", 1)[0]
    flags = settings.get("XLA_FLAGS")
    if name not in flags:
        os.environ["XLA_FLAGS"] = (flags + " " + flag).strip()


def keyed_xla_flags() -> str:
    """XLA_FLAGS without the flags torch_tpu adds (what an executable's key includes)."""
    own = {f for k in KINDS for f in k.xla_flags}
    return " ".join(f for f in settings.get("XLA_FLAGS").split() if f not in own)


# -- the CPU plugin: how many devices, on which cores -------------------------------------------
def local_world() -> tuple[int, int] | None:
    """(LOCAL_RANK, LOCAL_WORLD_SIZE) when torchrun (or a launcher that sets the same variables)
    runs several processes on this host, else None."""
    try:
        size, rank = int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    except (KeyError, ValueError):
        return None
    return (rank, size) if size > 1 and 0 <= rank < size else None


def _take_local_share_of_cores() -> None:
    """With the CPU plugin and several processes per host, each process runs on its share of the
    cores (LOCAL_RANK's slice of the affinity mask): the plugin sizes its compute thread pool from
    the cores a process may use, and N processes each starting a pool of all the cores time-slice
    N times as many threads as there are cores. Skipped when there are fewer cores than processes,
    or when TORCH_TPU_CPU_PIN=0."""
    local = local_world()
    if local is None or settings.get("TORCH_TPU_CPU_PIN") == "0" or not hasattr(os, "sched_setaffinity"):
        return
    rank, size = local
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < size:
        return
    share = len(cores) // size
    os.sched_setaffinity(0, cores[rank * share:(rank + 1) * share])


def cpu_device_count() -> int:
    """Devices the CPU plugin exposes: `TORCH_TPU_CPU_DEVICE_COUNT`, else 1 in each process of a
    multi-process job on this host (torchrun's LOCAL_WORLD_SIZE > 1: one process per device, each
    seeing its own as tpu:0), else the cores this process may run on, clamped to [2, 4] (4 is the
    plugin's own default).

    Why not always 4: the plugin's compute thread pool has one thread per device at least, so 4
    devices on a 2-core machine time-slice 4 compute threads on 2 cores (measured on 2 cores: the
    compiled GPT training step at width 64 was 1.13-1.16x of jax.jit with 4 devices, 1.01-1.05x with
    2). At least 2, so that multi-device code (`tpu:1`) runs everywhere.
    Raises ValueError when the variable is not a positive integer."""
    value = (settings.get("TORCH_TPU_CPU_DEVICE_COUNT") or "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"TORCH_TPU_CPU_DEVICE_COUNT must be a positive integer (the number of devices "
                             f"the CPU plugin exposes), got {value!r}")
        return int(value)
    if local_world() is not None:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity (macOS)
        cores = os.cpu_count() or 1
    return min(4, max(2, cores))


def _cpu_setup() -> list:
    _take_local_share_of_cores()
    return [("cpu_device_count", cpu_device_count())]


# -- libtpu ---------------------------------------------------------------------------------------
def has_tpu() -> bool:
    """TPU chips on this machine (their device files)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def _tpu_setup() -> list:
    if not has_tpu():
        # No TPU chips here: libtpu would ask the cloud metadata server for the VM's TPU before
        # failing ("No jellyfish device found"), retrying for minutes where none answers.
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    # A TPU VM: under torchrun, each process tells libtpu which chip it owns before the client
    # starts (distributed/tpu_env.py).
    from .distributed.tpu_env import configure_process
    configure_process()
    return []


# -- the table --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plugin:
    """One kind of PJRT plugin. `find()`: its installed .so or None; `present()`: its hardware is on
    this machine; `xla_flags`: added to XLA_FLAGS before its client starts (own_xla_flag); `setup()`:
    the rest of the process's preparation, returning the client's create options as (name, value)
    pairs (ValueError: the device is unusable, with that message); `platforms`: the PJRT platform
    names its client reports (lowered for as `name`); `keyed_by_path`: an executable's cache key names
    the plugin's file (libtpu's names only its version, so that a key computed on another host, as
    torch_tpu.aot does, is the TPU VM's); `refusal`: what its compiler cannot build, refused with a
    message naming the op and dtype before the compiler sees the program."""
    name: str
    package: str
    find: Callable[[], str | None]
    present: Callable[[], bool]
    platforms: tuple[str, ...]
    xla_flags: tuple[str, ...] = ()
    setup: Callable[[], list] = field(default=lambda: [])
    keyed_by_path: bool = True
    file_name: str = ""
    # (StableHLO text, devices it is compiled for) -> why this compiler must not be given it, or None
    refusal: Callable[[str, int], str | None] | None = None

    def prepare(self) -> list:
        """Sets the process up for this plugin's client (flags, environment); its create options."""
        for f in self.xla_flags:
            own_xla_flag(f)
        return self.setup()

    def is_path(self, path: str) -> bool:
        """Whether `path` is this kind's plugin: by `file_name` wherever it lies where the kind has
        one, else the installed plugin's path."""
        if not path:
            return False
        if self.file_name:
            return self.file_name in os.path.basename(path)
        return path == self.find()


TPU = Plugin("tpu", "libtpu", lambda: settings.get("TPU_LIBRARY_PATH") or _package_file("libtpu", "libtpu.so"),
             has_tpu, ("tpu",), setup=_tpu_setup, keyed_by_path=False, refusal=tpu_refusals.refusal)
CUDA = Plugin("cuda", "jax-cuda13-pjrt",
              lambda: (_package_file("jax_plugins.xla_cuda13", "xla_cuda_plugin.so")
                       or _package_file("jax_plugins.xla_cuda12", "xla_cuda_plugin.so")),
              lambda: os.path.exists("/dev/nvidia0"), ("cuda", "gpu"), xla_flags=(GPU_NAN_MIN_MAX,))
CPU = Plugin("cpu", "xla-cpu-pjrt", lambda: _package_file("xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so"),
             lambda: True, ("cpu",), xla_flags=(CPU_NAN_MIN_MAX, NO_XNNPACK), setup=_cpu_setup,
             file_name="xla_cpu_pjrt")
KINDS = (TPU, CUDA, CPU)  # the automatic choice's order


def kind_of(path: str) -> Plugin | None:
    """The kind a plugin path is, or None (no plugin, or a path of another kind)."""
    return next((k for k in KINDS if k.is_path(path)), None)


def for_platform(platform_name: str) -> Plugin | None:
    """The kind whose client reports PJRT platform `platform_name` ("cpu", "gpu", "tpu", ...), or None."""
    name = platform_name.lower()
    return next((k for k in KINDS if name in k.platforms), None)


def resolve() -> tuple[str, str]:
    """(path, error): the plugin to load, or why there is none (raised on first use)."""
    choice = (settings.get(ENV) or "").strip()
    named = next((k for k in KINDS if k.name == choice), None)
    if named is not None:
        path = named.find()
        if path:
            return path, ""
        return "", (f"{ENV}={choice}, but its PJRT plugin is not installed: `pip install {named.package}`, "
                    f"or set {ENV} to another plugin (cpu, cuda, tpu or a path to a plugin .so).")
    if choice:
        return os.path.abspath(os.path.expanduser(choice)), ""
    for k in KINDS:
        if k.present() and k.find():
            return k.find(), ""
    return "", (f"No PJRT plugin found for the tpu device: `pip install xla-cpu-pjrt` (CPU), libtpu (TPU) "
                f"or jax-cuda13-pjrt (GPU), or set {ENV} to the path of a plugin .so.")
