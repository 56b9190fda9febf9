"""The executable cache's configuration and key: its directory tiers (process memory first, then a
per-host tier, the local disk and a tier shared by hosts; csrc/runtime/compile_cache.h holds the
cache itself), the warm-start manifest of a command line, what names a compiler (target_identity)
and a program's key under it (program_key, which torch_tpu.aot computes for other targets too), and
the cache's statistics. torch_tpu.runtime.compile looks programs up here.
"""
from __future__ import annotations

import hashlib
import os
import pwd
import sys
import warnings

from . import _C, plugins, settings

# Bump when what torch_tpu puts into programs or compile options changes meaning.
FORMAT = "torch_tpu-0.1.0/compile-options-v1/nan-min-max/shaped-buffers/no-xnnpack"


def _default_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_tpu", "xla")


def _tier2_dir(value: str) -> tuple[str, bool]:
    """The directory of the per-host tier for a TORCH_TPU_TIER2_COMPILATION_CACHE value, and whether
    it must be private to this user: "" when the value turns it off ("", "0", or Google TorchTPU's
    "disabled"). "1" or "default": /dev/shm/torch_tpu_cache-<user>; another name (Google's values are
    names): /dev/shm/torch_tpu_cache-<user>-<name>; a value with a "/": that directory. Unset is
    off, whatever the world size (Google's turns it on for WORLD_SIZE > 1): the disk tier already
    serves the processes of a host."""
    if value in ("", "0", "disabled"):
        return "", False
    if os.sep in value:
        return os.path.expanduser(value), False
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # a container's uid with no passwd entry
        user = str(os.geteuid())
    suffix = "" if value in ("1", "default") else "-" + value
    # Per user, and checked to be ours alone: /dev/shm is writable by everyone, and an entry planted
    # there would be loaded and run by this process.
    return f"/dev/shm/torch_tpu_cache-{user}{suffix}", True


_disk_dir = ""


def disk_dir() -> str:
    """The disk tier's directory as configure() last set it ("" when the tier is off)."""
    return _disk_dir


def configure(cache_dir: str | None = None, disk: bool | None = None, max_bytes: int | None = None,
              tier2: str | None = None, tier3_root: str | None = None) -> None:
    """Sets the executable cache's directory tiers. Each argument left None comes from its
    environment variable. Searched in this order after process memory (fastest first):

    - tier 2, per host (Google TorchTPU's TORCH_TPU_TIER2_COMPILATION_CACHE; off by default): "1"
      or a name puts it in /dev/shm (see _tier2_dir), a path in that directory; capped at max_bytes.
    - disk, the local directory (TORCH_TPU_CACHE_DIR, default ~/.cache/torch_tpu/xla; on unless
      TORCH_TPU_DISK_CACHE=0); capped at max_bytes.
    - tier 3, shared by hosts (Google's TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT: a directory, e.g. on
      a network file system; off by default); entries are written into that directory itself and
      never evicted by torch_tpu. Google's object-store roots (gs://...) are not supported: such a
      value leaves the tier off, with a warning. A root that users other than its owner can write
      (group or other write permission) is off too, with a warning, unless TORCH_TPU_TIER3_TRUSTED=1:
      whoever can write there decides what this process runs.

    max_bytes (TORCH_TPU_CACHE_MAX_BYTES, default 2 GiB) caps each capped tier; the least recently
    used entries go first. A hit is copied into the tiers before it; a compile is written to all.
    A tier whose directory cannot be created or written is off, with one warning, from the first
    lookup that needs it. Replaces the previous tiers and zeroes their counters."""
    cache_dir = cache_dir or settings.get("TORCH_TPU_CACHE_DIR") or _default_dir()
    if disk is None:
        disk = settings.get("TORCH_TPU_DISK_CACHE") != "0"
    if max_bytes is None:
        max_bytes = int(settings.get("TORCH_TPU_CACHE_MAX_BYTES"))
    if tier2 is None:
        tier2 = settings.get("TORCH_TPU_TIER2_COMPILATION_CACHE")
    if tier3_root is None:
        tier3_root = settings.get("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT")
    if "://" in tier3_root:
        warnings.warn(f"torch_tpu: the tier3 compilation cache is off: {tier3_root!r} is not a directory "
                      "(only file-system paths are supported, e.g. a network file system's mount)", stacklevel=2)
        tier3_root = ""
    tier2_dir, tier2_private = _tier2_dir(tier2)
    # Tier 3's entries are executables this process runs: a root that others can write is used only
    # when the user says they trust them (csrc/runtime/compile_cache.h, owner_writes_only).
    tier3_checked = not settings.flag("TORCH_TPU_TIER3_TRUSTED")
    global _disk_dir
    _disk_dir = cache_dir if disk else ""
    _C.runtime.set_warm_manifest(warm_manifest(_disk_dir) if settings.flag("TORCH_TPU_WARM_START") else "")
    _C.runtime.cache_configure([("tier2", tier2_dir, int(max_bytes), tier2_private, False),
                                ("disk", cache_dir if disk else "", int(max_bytes), False, False),
                                ("tier3", os.path.expanduser(tier3_root), 0, False, tier3_checked)])


def warm_manifest(cache_dir: str) -> str:
    """The warm-start manifest of this process's command line in `cache_dir` ("" when it is ""):
    the keys of the programs the last process started with the same command line (interpreter,
    script or -c code or -m module, arguments: sys.orig_argv) and the same compiler settings (plugin,
    XLA_FLAGS, LIBTPU_INIT_ARGS: under others its programs are others) used, in the order it first
    used them, which this process loads from the cache on the compile pool's threads as soon as its
    client starts (csrc/runtime/warm_start.h). TORCH_TPU_WARM_START=0 turns it off."""
    if not cache_dir:
        return ""
    line = "\0".join([*getattr(sys, "orig_argv", sys.argv), _C.runtime.configured_plugin(), plugins.keyed_xla_flags(),
                      settings.get("LIBTPU_INIT_ARGS")])
    return os.path.join(cache_dir, "warm-" + hashlib.sha256(line.encode(errors="surrogateescape")).hexdigest()[:32] + ".keys")


def target_identity(platform_name: str, platform_version: str, api_version: tuple[int, int], plugin_path: str) -> str:
    """What an executable depends on besides its program: the compiler that builds it and the options
    and flags it is built with (XLA_FLAGS, LIBTPU_INIT_ARGS: the plugins read their debug options and
    TPU flags from them). A TPU executable is named by what libtpu says of itself (its platform version
    names the device kind and libtpu's build, e.g. "TFRT TPU v5 lite\nBuilt on ... cl/..."), not by
    where libtpu is installed: the TPU VM's runtime then finds what torch_tpu.aot compiled on another
    host for the same libtpu. Other plugins are named by their file too (a serialized CPU or CUDA
    executable loads only on the build that wrote it, and their versions do not name the build)."""
    kind = plugins.for_platform(platform_name)
    where = plugin_path if kind is None or kind.keyed_by_path else ""
    return "\0".join([where, platform_name, platform_version, "%d.%d" % tuple(api_version), FORMAT,
                       plugins.keyed_xla_flags(), settings.get("LIBTPU_INIT_ARGS")])


def program_key(identity: str, program: str) -> str:
    """The executable cache's key (a hex digest) of `program` compiled by the target `identity`."""
    return hashlib.sha256((identity + "\0" + program).encode()).hexdigest()


def stats() -> dict:
    """Executable cache statistics of this process: op-signature entries and hits (the eager fast
    path); the program cache's memory_hits; per directory tier (tier2, disk, tier3: see
    configure) <tier>_hits, <tier>_writes (compiles and promotions written), <tier>_rejected
    (corrupt or foreign entries removed) and <tier>_evictions; misses (compiles), evictions (all
    tiers), compile_seconds spent and compile_seconds_saved by tier hits."""
    plans = _C.eager.plan_cache_stats()
    d = {"op_entries": plans["entries"], "op_hits": plans["hits"], "op_misses": plans["misses"]}
    d.update(_C.runtime.cache_stats())
    return d
