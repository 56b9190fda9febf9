"""TPU topologies as compile-only targets: libtpu's compiler on a machine without a TPU.

libtpu (the `libtpu` package, torch_tpu's `tpu` extra) loads on any x86-64 Linux host, and its PJRT C
API describes real TPU topologies ("v5e:2x2") for which PJRT_Compile builds TPU executables with no
chip and no client (csrc/pjrt/pjrt.h, class Topology). Before libtpu initializes on a host without a
TPU, its environment is set for compile-only use (values the user set are kept):
- TPU_SKIP_MDS_QUERY=1: else it asks a cloud metadata server, retried for about 30 s per key;
- TPU_ACCELERATOR_TYPE, TPU_WORKER_HOSTNAMES=localhost: else two warnings (they change nothing
  that is compiled: the topology does);
- TPU_LOG_DIR=disabled: no log files under /tmp;
- ALLOW_MULTIPLE_LIBTPU_LOAD=1: libtpu holds a lock file, and a second process (pytest -n 2, a
  launcher's workers) would fail to initialize it.
On a TPU VM nothing is set: there libtpu is the running plugin, and the same Plugin serves both.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import re

from .. import _C, compile_cache, plugins
from ..tpu_slices import accelerator_type
from .worker import Pool

PLUGIN_ENV = "TPU_LIBRARY_PATH"

def libtpu_path() -> str:
    """The libtpu.so that compiles for TPU targets: TPU_LIBRARY_PATH, else the `libtpu` package's.
    Raises RuntimeError, saying what to install, when there is none."""
    path = plugins.TPU.find()
    if not path:
        raise RuntimeError("torch_tpu.aot compiles for TPU topologies with libtpu's compiler, which is not "
                           "installed: pip install 'torch_tpu[tpu]' (or set TPU_LIBRARY_PATH to a libtpu.so).")
    return path


def compile_only_environment(name: str = "v5e:1x1") -> None:
    """libtpu's environment for a host without a TPU (the module docstring lists it), for topology
    `name`; values the user set are kept; nothing on a TPU VM. Called before libtpu initializes:
    here, and by torch_tpu.pallas before JAX (which loads libtpu when installed) starts a backend."""
    if plugins.has_tpu():
        return
    generation, _, dims = name.partition(":")
    chips = math.prod(int(d) for d in re.findall(r"\d+", dims)) or 1
    for key, value in (("TPU_SKIP_MDS_QUERY", "1"), ("TPU_ACCELERATOR_TYPE", accelerator_type(generation, chips)),
                       ("TPU_WORKER_HOSTNAMES", "localhost"), ("TPU_LOG_DIR", "disabled"),
                       ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")):
        os.environ.setdefault(key, value)


@dataclasses.dataclass(frozen=True)
class Device:
    """One device of a topology, as libtpu describes it.

    id: its global device id (0.. within a slice; slice s's from s * 100000 on multi-slice topologies).
    kind: the device kind ("TPU v5 lite", "TPU v4", ...).
    coords: its chip's physical (x, y, z) in the slice's ICI grid.
    core_on_chip: which TensorCore of its chip (v4 and older: 0 or 1; others 0).
    slice_index: its slice (None on a single slice).
    process_index: the host process that owns it on a real job.
    memory_bytes: its device memory (HBM) in bytes."""
    id: int
    kind: str
    coords: tuple[int, ...]
    core_on_chip: int
    slice_index: int | None
    process_index: int
    memory_bytes: int

    @property
    def description(self) -> dict:
        """The attributes torch_tpu.distributed.mesh.rank_layout reads: coords, core_on_chip, slice_index."""
        d = {"coords": list(self.coords), "core_on_chip": self.core_on_chip}
        if self.slice_index is not None:
            d["slice_index"] = self.slice_index
        return d


class Topology:
    """A TPU topology to compile for, without a TPU (see topology())."""

    def __init__(self, name: str, num_slices: int = 1):
        if not isinstance(name, str) or ":" not in name:
            raise ValueError(f"a TPU topology is named '<generation>:<chips per axis>', e.g. 'v5e:2x2', "
                             f"'v4:2x2x1', 'v5p:2x2x1', 'v6e:4x4'; got {name!r}")
        if not isinstance(num_slices, int) or num_slices < 1:
            raise ValueError(f"num_slices must be a positive int, got {num_slices!r}")
        path = libtpu_path()
        compile_only_environment(name)
        options = [("num_slices", num_slices)] if num_slices > 1 else []
        try:
            self._t = _C.runtime.Topology(path, PLUGIN_ENV, name, options)
        except _C.runtime.PjrtError as e:
            raise ValueError(f"libtpu does not know the topology {name!r} (num_slices={num_slices}): {e}. Names "
                             "look like 'v5e:2x2', 'v4:2x2x1', 'v5p:2x2x1', 'v6e:4x4', 'tpu7x:2x2x1'.") from None
        self.name = name
        self.num_slices = num_slices
        self.platform_version = self._t.platform_version
        self.devices = [_device(d) for d in self._t.devices()]
        self.kind = self.devices[0].kind if self.devices else ""
        # Compiles run in worker processes (worker.py): a libtpu crash costs one program, not the job.
        self._workers = Pool(path, PLUGIN_ENV, name, num_slices, size=min(os.cpu_count() or 1, 4))

    @property
    def device_memory_bytes(self) -> int:
        """Device memory (HBM) of one device, in bytes."""
        return min(d.memory_bytes for d in self.devices)

    def identity(self) -> str:
        """compile_cache.target_identity of this target: what the runtime of a TPU VM with the same libtpu
        computes for its own client, so that both name an executable by the same key (read when a key
        is made: it covers XLA_FLAGS and LIBTPU_INIT_ARGS as they are then)."""
        return compile_cache.target_identity(self._t.platform_name, self.platform_version, tuple(self._t.api_version),
                                       libtpu_path())

    def key(self, program: str) -> str:
        """The executable cache's key of `program` compiled for this target (compile_cache.program_key)."""
        return compile_cache.program_key(self.identity(), program)

    def compile(self, program: str, devices=None) -> dict:
        """Compiles StableHLO text for this topology, in a worker process: for one device (1 replica,
        1 partition: what the runtime compiles on each TPU process), or, with `devices` (global device
        ids of this topology, e.g. [d.id for d in topo.devices]), as one replica on each of them, so
        that the program's collectives run across them (replica_groups index `devices`).
        Returns the _C.runtime.Topology.compile dict. Raises ValueError for ids this topology does not have,
        TypeError for what TPU cannot run (plugins.TPU.refusal: tpu_refusals.py, checked before libtpu sees the program),
        RuntimeError with the compiler's message, and worker.CompilerCrash (a RuntimeError) when libtpu
        crashed compiling it."""
        ids = [0] if devices is None else [int(i) for i in devices]
        known = {d.id for d in self.devices}
        if not ids or len(set(ids)) != len(ids) or not set(ids) <= known:
            raise ValueError(f"devices must be distinct device ids of {self.name} (x{self.num_slices}), e.g. "
                             f"{sorted(known)[:4]}...; got {devices!r}")
        why = plugins.TPU.refusal(program, len(ids))
        if why:
            raise TypeError(why)
        return self._workers.compile(program, _C.runtime.replica_compile_options(ids) if devices is not None else b"")

    def __repr__(self):
        return (f"Topology({self.name!r}, num_slices={self.num_slices}: {len(self.devices)} x {self.kind}, "
                f"{self.device_memory_bytes / 2**30:.1f} GiB each)")


def _device(d: dict) -> Device:
    a = d["attributes"]
    coords = a.get("coords", ())
    coords = tuple(coords) if isinstance(coords, (list, tuple)) else (coords,)
    return Device(id=d["id"], kind=d["kind"], coords=coords, core_on_chip=int(a.get("core_on_chip", 0)),
                  slice_index=a.get("slice_index"), process_index=d["process_index"],
                  memory_bytes=int(a.get("device_memory_bytes_limit", 0)))


@functools.lru_cache(maxsize=None)
def topology(name: str, num_slices: int = 1) -> Topology:
    """The TPU topology `name` ("v5e:1x1", "v5e:2x2", "v4:2x2x1", "v5p:2x2x1", "v6e:4x4",
    "tpu7x:2x2x1", ...), `num_slices` slices of it, as libtpu describes it: `.devices` (each with
    `.id`, `.coords`, `.core_on_chip`, `.kind`, `.slice_index`) and `.device_memory_bytes` (per
    device). Creating it loads libtpu once per process (about 0.1 s; nothing else starts).
    Raises ValueError for a name libtpu does not know, RuntimeError when libtpu is not installed."""
    return Topology(name, num_slices)
