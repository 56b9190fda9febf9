"""`torch.tpu`: the tpu device module, mirroring `torch.cuda` where the concept exists on PJRT."""
from __future__ import annotations

import contextlib

import torch

from . import _C, runtime


def is_available() -> bool:
    """True when a PJRT plugin loads and has at least one device. Never raises."""
    try:
        return _C._device_count() > 0
    except Exception:
        return False


def is_initialized() -> bool:
    return _C._runtime_started()


def init() -> None:
    runtime.start()


def device_count() -> int:
    """Number of tpu devices (addressable PJRT devices); 0 when no plugin can start."""
    return _C._device_count()


def current_device() -> int:
    return _C._current_device()


def set_device(device) -> None:
    """Sets the current tpu device (an index, "tpu:N" or torch.device); IndexError if out of range."""
    idx = _index(device)
    if idx is not None:
        _C._set_device(idx)


def _index(device):
    if isinstance(device, int):
        return device
    if device is None:
        return None
    d = torch.device(device)
    if d.type != "tpu":
        raise ValueError(f"expected a tpu device, got {d}")
    return d.index


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
        _C._set_device(self.prev)
        return False


def synchronize(device=None) -> None:
    """Waits for every op issued so far; raises the error of a failed asynchronous op."""
    if _C._runtime_started():
        _C._synchronize(-1 if device is None else (_index(device) or 0))


def default_generator(idx: int | None = None) -> torch.Generator:
    return _C._default_generator(current_device() if idx is None else idx)


def manual_seed(seed: int) -> None:
    """Seeds the current device's generator."""
    default_generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every tpu device's generator (torch.manual_seed calls this)."""
    n = max(_C._device_count(), 1) if _C._runtime_started() else 1
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


def memory_stats(device=None) -> dict:
    """The plugin's memory statistics of a device (bytes_in_use, peak_bytes_in_use, num_allocs,
    bytes_limit); values are -1 where the plugin does not report them (the CPU plugin reports none)."""
    idx = _index(device)
    return dict(_C._memory_stats(current_device() if idx is None else idx))


def memory_allocated(device=None) -> int:
    return max(memory_stats(device)["bytes_in_use"], 0)


def max_memory_allocated(device=None) -> int:
    return max(memory_stats(device)["peak_bytes_in_use"], 0)


def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float16]


def _is_in_bad_fork() -> bool:
    """True in a process forked after the tpu runtime started, where the device cannot be used (every
    launch, transfer or wait raises RuntimeError; see torch.cuda._is_in_bad_fork)."""
    return _C._is_in_bad_fork()


@contextlib.contextmanager
def stream(_=None):
    yield
