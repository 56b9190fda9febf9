"""`torch.tpu`: the tpu device module, mirroring `torch.cuda` where the concept exists on PJRT."""
from __future__ import annotations

import contextlib
import enum

import torch

from . import _C, compile_cache, runtime


def is_available() -> bool:
    """True when a PJRT plugin loads and has at least one device. Never raises."""
    try:
        return _C.runtime.device_count() > 0
    except Exception:
        return False


def is_initialized() -> bool:
    return _C.runtime.started()


def __getattr__(name: str):
    # torch.cuda._initialized, as PyTorch reads it of a device module: torch.utils.checkpoint saves
    # and restores a device's rng state only where `getattr(module, "_initialized", False)` holds
    # (without it, a checkpointed block's dropout drew a new mask in the backward's recomputation).
    if name == "_initialized":
        return is_initialized()
    raise AttributeError(f"module 'torch.tpu' has no attribute {name!r}")


def init() -> None:
    runtime.start()


def device_count() -> int:
    """Number of tpu devices: the plugin's addressable devices; 0 when no plugin can start. In a
    multi-process job on this host whose processes each drive one device (torchrun), the host's
    local world size, as CUDA shows each process every GPU (csrc/aten/device.h visible_device_count):
    tpu:LOCAL_RANK (also tpu:0) is this process's device, the other indices other processes'."""
    return _C.device.visible_device_count()


def current_device() -> int:
    return _C.device.current_device()


def set_device(device) -> None:
    """Sets the current tpu device (an index, "tpu:N" or torch.device); IndexError if out of range.

    In a multi-process job where each process drives one device (torchrun; Google TorchTPU's
    convention: each process sees its own device as tpu:0), the CUDA idiom
    `set_device(LOCAL_RANK)` (which DeviceMesh also uses) selects that device, tpu:0."""
    idx = _index(device)
    if idx is None:
        return
    _C.device.set_device(idx)


def _index(device):
    """The device index `device` (an int, "tpu:N", torch.device or None) names; None for "tpu" or None.
    tpu:LOCAL_RANK is tpu:0 in a process of a multi-process job that drives one device (the CUDA habit
    `f"cuda:{local_rank}"`). ValueError for a device of another type."""
    if device is None:
        return None
    if isinstance(device, int):
        return _C.device.own_device(device)
    d = torch.device(device)
    if d.type != "tpu":
        raise ValueError(f"expected a tpu device, got {d}")
    return None if d.index is None else _C.device.own_device(d.index)


class device:
    """Context manager that makes `idx` the current tpu device."""

    def __init__(self, idx):
        self.idx = _index(idx)
        self.prev = None

    def __enter__(self):
        self.prev = current_device()
        if self.idx is not None:
            set_device(self.idx)

    def __exit__(self, *exc):
        _C.device.set_device(self.prev)
        return False


def synchronize(device=None) -> None:
    """Waits for every op issued so far; raises the error of a failed asynchronous op."""
    if _C.runtime.started():
        _C.runtime.synchronize(-1 if device is None else (_index(device) or 0))


def default_generator(idx: int | None = None) -> torch.Generator:
    return _C.device.default_generator(current_device() if idx is None else idx)


def manual_seed(seed: int) -> None:
    """Seeds the current device's generator."""
    default_generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every tpu device's generator (torch.manual_seed calls this)."""
    n = max(_C.runtime.device_count(), 1) if _C.runtime.started() else 1
    for i in range(n):
        default_generator(i).manual_seed(int(seed))
    _pending_seed[0] = int(seed)


_pending_seed = [None]


def seed() -> None:
    default_generator().seed()


def seed_all() -> None:
    for i in range(max(device_count(), 1)):
        default_generator(i).seed()


def initial_seed() -> int:
    return default_generator().initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    return default_generator(_index(device)).get_state()


def set_rng_state(state: torch.Tensor, device=None) -> None:
    default_generator(_index(device)).set_state(state)


def get_rng_state_all():
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states) -> None:
    for i, s in enumerate(states):
        set_rng_state(s, i)


def _memory_index(device) -> int:
    idx = _index(device)
    idx = current_device() if idx is None else idx
    _C.device.check_device_index(idx)
    runtime.start()  # the counters live in the runtime
    return idx


def memory_stats(device=None) -> dict:
    """torch.cuda.memory_stats's keys for a tpu device ("allocated_bytes.all.current", ...,
    "allocation.all.peak", "num_ooms"), from the runtime's count of live storages (every plugin),
    plus "plugin.<name>" for what the PJRT plugin reports (bytes_in_use, peak_bytes_in_use,
    num_allocs, bytes_limit; -1 where it does not, as the CPU plugin)."""
    idx = _memory_index(device)
    stats = dict(torch.accelerator.memory_stats(idx))
    stats.update({f"plugin.{k}": v for k, v in _C.runtime.memory_stats(idx).items()})
    return stats


def memory_allocated(device=None) -> int:
    """Bytes of tpu storages alive on the device."""
    return torch.accelerator.memory_allocated(_memory_index(device))


def max_memory_allocated(device=None) -> int:
    """Peak of memory_allocated since the start or reset_peak_memory_stats."""
    return torch.accelerator.max_memory_allocated(_memory_index(device))


def memory_reserved(device=None) -> int:
    """Bytes held for tpu storages: memory_allocated (no caching allocator holds more)."""
    return torch.accelerator.memory_reserved(_memory_index(device))


def max_memory_reserved(device=None) -> int:
    return torch.accelerator.max_memory_reserved(_memory_index(device))


def reset_peak_memory_stats(device=None) -> None:
    """Sets the peaks to the current values."""
    torch.accelerator.reset_peak_memory_stats(_memory_index(device))


def reset_accumulated_memory_stats(device=None) -> None:
    """Zeroes the accumulated allocation and free counts."""
    torch.accelerator.reset_accumulated_memory_stats(_memory_index(device))


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the device: the plugin's limit and use where it reports them, the host's
    available and physical memory on the CPU plugin (its device memory is host memory)."""
    return torch.accelerator.get_memory_info(_memory_index(device))


def empty_cache() -> None:
    """Nothing is cached: a freed storage's buffer is released once the work queued before the free
    is done. Kept so that code written for torch.cuda runs."""
    torch.accelerator.empty_cache()


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A table of the device's memory counters (current, peak, allocated, freed), as
    torch.cuda.memory_summary lays out the same statistics."""
    stats = memory_stats(device)
    rows = [("Allocated memory", "allocated_bytes.all", True), ("Allocations", "allocation.all", False)]

    def fmt(v, as_bytes):
        if not as_bytes:
            return str(v)
        for unit in ("B", "KiB", "MiB", "GiB"):
            if abs(v) < 1024 or unit == "GiB":
                return f"{v:.0f} {unit}" if unit == "B" else f"{v:.2f} {unit}"
            v /= 1024
    lines = [f"tpu memory summary, device {_memory_index(device)} ({runtime.platform()} platform)",
             f"{'':20s}{'current':>14s}{'peak':>14s}{'allocated':>14s}{'freed':>14s}"]
    for title, key, as_bytes in rows:
        lines.append(f"{title:20s}" + "".join(f"{fmt(stats.get(f'{key}.{c}', 0), as_bytes):>14s}"
                                             for c in ("current", "peak", "allocated", "freed")))
    free, total = mem_get_info(device)
    lines.append(f"device memory: {free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB")
    return "\n".join(lines)


def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float16]


class Precision(enum.Enum):
    """Google TorchTPU's names for the precision of float32 matmuls and convolutions: DEFAULT (one
    bfloat16 pass on a TPU), HIGH (three passes), HIGHEST (float32); PyTorch's "medium", "high" and
    "highest" (torch.set_float32_matmul_precision), which they set."""
    DEFAULT = "medium"
    HIGH = "high"
    HIGHEST = "highest"


@contextlib.contextmanager
def precision(level: Precision):
    """Within the block, float32 matmuls and convolutions use `level` (a Precision); PyTorch's
    float32 matmul precision is restored after it. TypeError for anything but a Precision."""
    if not isinstance(level, Precision):
        raise TypeError(f"torch.tpu.precision expects a torch.tpu.Precision, got {level!r}")
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(level.value)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def _get_cache_stats() -> dict:
    """The executable cache's counters (Google TorchTPU's name): hits per tier (memory, tier2, disk,
    tier3), writes, rejected entries, misses, compile seconds spent and saved, entries
    (torch_tpu.compile_cache.stats)."""
    return compile_cache.stats()


def _is_in_bad_fork() -> bool:
    """True in a process forked after the tpu runtime started, where the device cannot be used (every
    launch, transfer or wait raises RuntimeError; see torch.cuda._is_in_bad_fork)."""
    return _C.runtime.in_bad_fork()


def get_device_name(device=None) -> str:
    """The PJRT device kind of a tpu device (e.g. "TPU v5 lite"; "cpu" on the CPU plugin)."""
    return get_device_properties(device).name


class _DeviceProperties:
    """What torch.tpu.get_device_properties returns: `name` (the PJRT device kind), `platform`
    ("tpu", "cuda" or "cpu"), `total_memory` (bytes; 0 where the plugin does not report it, as the
    CPU plugin does not), `id` and `process_index` (PJRT's global device id and its owning process),
    and `attributes` (the plugin's device attributes, e.g. a TPU's "coords" and "core_on_chip")."""

    def __init__(self, desc: dict, platform: str, total_memory: int):
        self.name = desc["kind"]
        self.platform = platform
        self.total_memory = total_memory
        self.id = desc["id"]
        self.process_index = desc["process_index"]
        self.attributes = dict(desc["attributes"])

    def __repr__(self):
        return (f"_TpuDeviceProperties(name='{self.name}', platform='{self.platform}', "
                f"total_memory={self.total_memory // (1024 * 1024)}MB, id={self.id})")


def get_device_properties(device=None) -> _DeviceProperties:
    """Properties of a tpu device (an index, "tpu:N", torch.device or None for the current one);
    IndexError for an index out of range. Starts the runtime."""
    idx = _index(device)
    idx = current_device() if idx is None else idx
    desc = _C.runtime.describe_device(idx)
    limit = _C.runtime.memory_stats(idx)["bytes_limit"]
    return _DeviceProperties(desc, runtime.platform(), max(limit, 0))


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 is native on every TPU and computed by XLA on the CPU and CUDA plugins."""
    return is_available()


class Stream(torch.Stream):
    """A tpu stream: `torch.Stream` on the tpu device, with CUDA's methods (query, synchronize,
    wait_event, wait_stream, record_event) and usable as a context manager.

    PJRT has no user-visible streams: every stream of a device issues to the device's one in-order
    launch queue (csrc/aten/guard.cc). Work is never reordered across streams, so waits between
    streams are already satisfied and cost nothing; query() and synchronize() cover all the
    device's work. CUDA-style multi-stream code therefore runs unchanged and correctly, without
    overlap between streams."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if kwargs:  # wrapping an existing stream: Stream(stream_id=, device_index=, device_type=)
            return super().__new__(cls, **kwargs)
        idx = _index(device)
        return super().__new__(cls, device=torch.device("tpu", current_device() if idx is None else idx),
                               priority=priority)


class _EventType(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, torch.Event) and obj.device.type == "tpu"


class Event(metaclass=_EventType):
    """A tpu event: `torch.Event(device="tpu:N")` for the current device (torch.Event itself, since
    its methods accept no subclass; isinstance(e, torch.tpu.Event) holds for any tpu torch.Event).
    record() marks the work issued so far on the device; query() tells, without blocking, whether it
    has finished; synchronize() waits for it and raises its error; elapsed_time(end) gives the
    milliseconds between two events made with enable_timing=True, after end.synchronize()
    (RuntimeError before, as on CUDA)."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return torch.Event(device=torch.device("tpu", current_device()), enable_timing=enable_timing,
                           blocking=blocking, interprocess=interprocess)


def _wrap(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device=None) -> Stream:
    """The calling thread's current stream on a tpu device (the default stream unless changed)."""
    idx = _index(device)
    return _wrap(torch._C._accelerator_getStream(current_device() if idx is None else idx))


def default_stream(device=None) -> Stream:
    """The default stream (id 0) of a tpu device."""
    cur = current_stream(device)
    return Stream(stream_id=0, device_index=cur.device_index, device_type=cur.device_type)


def set_stream(stream: torch.Stream) -> None:
    """Makes `stream` the calling thread's current stream on its device."""
    if stream is not None:
        torch._C._accelerator_setStream(stream)


@contextlib.contextmanager
def stream(s: torch.Stream | None):
    """Context manager that makes `s` the current stream of its device (None: no change)."""
    if s is None:
        yield
        return
    prev = current_stream(s.device_index)
    prev_dev = current_device()
    set_stream(s)
    try:
        yield
    finally:
        set_stream(prev)
        _C.device.set_device(prev_dev)


# -- legacy typed storages ---------------------------------------------------------------------------
# torch.tpu.FloatStorage and the other classes torch.cuda has (PyTorch's deprecated typed-storage API:
# `x.storage_type()`, `torch.tpu.FloatStorage(n)`). PyTorch finds them by name in the device module and
# takes their device from their module's name, "...tpu".
def _make_legacy_storages() -> dict:
    from torch._utils import classproperty
    from torch.storage import _LegacyStorage, _dtype_to_storage_type_map, _warn_typed_storage_removal

    class _TpuLegacyStorage(_LegacyStorage):
        @classmethod
        def from_buffer(cls, *args, **kwargs):
            _warn_typed_storage_removal()
            raise RuntimeError("from_buffer: Not available for tpu storage")

        @classmethod
        def _new_with_weak_ptr(cls, *args, **kwargs):
            raise RuntimeError("_new_with_weak_ptr: Not available for tpu storage")

        @classmethod
        def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
            raise RuntimeError("_new_shared_filename: Not available for tpu storage")

    def typed(name, dtype):
        def public(cls):
            _warn_typed_storage_removal()
            return dtype
        return type(name, (_TpuLegacyStorage,), {"__module__": __name__, "dtype": classproperty(public),
                                                  "_dtype": classproperty(lambda cls: dtype)})
    return {name: typed(name, dtype) for dtype, name in _dtype_to_storage_type_map().items()}


globals().update(_make_legacy_storages())
