"""Every environment variable torch_tpu reads, in one table: its name, its default and what it does.

Python reads them through `get(name)` where each takes effect (the plugin's at the client's start,
the cache's at its configuration, the eager mode's at import), so a process that sets one before
that point is heard; the C++ core reads the few it needs (`read_by="C++"`) through its own reader,
whose table (csrc/runtime/settings.h) holds the same names and defaults. tests/test_settings.py
fails if code reads a TORCH_TPU_ variable that is not here, if the two tables disagree, or if the
README's table of variables ("Choosing the plugin and the mode") leaves one out.
Variables of other tools that torch_tpu also honours (torchrun's RANK, LOCAL_RANK, WORLD_SIZE...)
keep their owners' meaning and are not listed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    default: str | None   # the value when unset (None: no value, the reader decides)
    meaning: str
    read_by: str = "Python"  # or "C++"


SETTINGS: tuple[Setting, ...] = (
    # the plugin and its devices
    Setting("TORCH_TPU_PJRT_PLUGIN", None, "cpu, cuda, tpu or a PJRT plugin's path; unset: libtpu, else CUDA, else CPU"),
    Setting("TPU_LIBRARY_PATH", None, "libtpu's path (libtpu's own variable), instead of the installed package's"),
    Setting("TORCH_TPU_CPU_DEVICE_COUNT", None, "devices the CPU plugin exposes; unset: usable cores in [2, 4]"),
    Setting("TORCH_TPU_CPU_PIN", "1", "0: a torchrun process keeps its whole CPU affinity mask"),
    Setting("TORCH_TPU_PLUGIN_LOGS", None, "1: the plugin's own start-up logs", read_by="C++"),
    Setting("XLA_FLAGS", "", "XLA's flags (part of every executable's cache key)"),
    Setting("LIBTPU_INIT_ARGS", "", "libtpu's flags (part of every executable's cache key)"),
    # eager execution
    Setting("TORCH_TPU_EAGER_MODE", "strict", "strict, debug or fused"),
    Setting("TPU_LAUNCH_BLOCKING", None, "1: debug eager (Google TorchTPU's name)"),
    Setting("TORCH_TPU_DEFER_AND_FUSE", None, "1: fused eager (Google TorchTPU's name)"),
    Setting("TORCH_TPU_CPU_FALLBACK", "1", "0: an op with no lowering raises instead of running on CPU", read_by="C++"),
    Setting("TORCH_TPU_ASYNC_LAUNCH", "1", "0: launches issued on the calling thread", read_by="C++"),
    Setting("TORCH_TPU_OP_OPT_LEVEL", "1", "XLA's backend optimization level of eager one-op programs on the CPU "
            "plugin (XLA's default: 3; XLA_FLAGS' own setting wins)"),
    Setting("TORCH_TPU_COMPILE_THREADS", None, "threads compiling eager programs while ops go on queuing; unset: one "
            "per core; 0: compile on the calling thread"),
    Setting("TORCH_TPU_KEEP_BUSY_BYTES", "262144", "bytes a launch may keep alive instead of donating a busy buffer",
            read_by="C++"),
    # the executable cache
    Setting("TORCH_TPU_RECOMPILE_WARN", "32", "sizes of one changing dimension (its other sizes equal) one op or graph "
            "makes programs for before a warning; 0: never"),
    Setting("TORCH_TPU_CACHE_DIR", None, "the disk tier's directory; unset: ~/.cache/torch_tpu/xla"),
    Setting("TORCH_TPU_DISK_CACHE", "1", "0: no disk tier"),
    Setting("TORCH_TPU_WARM_START", "1", "0: a process does not load the programs its command line used last time "
            "when its client starts (nor write their list at exit)"),
    Setting("TORCH_TPU_CACHE_MAX_BYTES", str(2 << 30), "cap of the disk tier and tier 2, each"),
    Setting("TORCH_TPU_TIER2_COMPILATION_CACHE", "", "the per-host /dev/shm tier: 1, a name or a path"),
    Setting("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", "", "the shared tier's root directory"),
    Setting("TORCH_TPU_TIER3_TRUSTED", "0", "1: use a tier-3 root that others can write"),
    # torch.compile
    Setting("TORCH_TPU_COMPILE_FULLGRAPH", None, "1: a graph that cannot be one program raises (no eager fallback)"),
    Setting("TORCH_TPU_SHAPE_BUCKETS", "pow2", "a graph's symbolic sizes compile per bucket: pow2, pow2:N (at least N; "
            "pow2 is pow2:16), multiple:N, or off (per shape)"),
    Setting("TORCH_TPU_INDUCTOR_PALLAS", None, "1: backend inductor compiles tpu graphs to Pallas kernels on a TPU"),
    # checking a job for TPU
    Setting("TORCH_TPU_SHADOW_TOPOLOGY", None, "a TPU topology every program is also compiled for (v5e:1x1)"),
    Setting("TORCH_TPU_SHADOW_REPORT", None, "a file each process appends its shadow report to"),
    # tpu_dist
    Setting("TORCH_TPU_DIST_DEVICE_COLLECTIVES", "auto", "auto, 1 or 0: collectives as device programs"),
    Setting("TORCH_TPU_DIST_VERIFY", "1", "0: collectives skip the shape/dtype agreement check", read_by="C++"),
)

_BY_NAME = {s.name: s for s in SETTINGS}


def get(name: str) -> str | None:
    """The value of variable `name` now: os.environ's, else the table's default. Raises KeyError for
    a variable that is not in SETTINGS (each must be declared, with its meaning, here)."""
    return os.environ.get(name, _BY_NAME[name].default)


def flag(name: str) -> bool:
    """Whether variable `name` is "1" (a switch; its default counts when unset). KeyError as get."""
    return get(name) == "1"
