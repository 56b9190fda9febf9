"""`tpu_dist`: torch.distributed on tpu tensors, one process per device.

Importing torch_tpu registers the backend (`torch.distributed.Backend.register_backend("tpu_dist",
..., extended_api=True, devices=["tpu"])`), so that each of these works:

    dist.init_process_group("tpu_dist")
    dist.init_process_group("cpu:gloo,tpu:tpu_dist")   # CPU tensors on Gloo, tpu tensors on tpu_dist
    dist.init_process_group()                          # the same: tpu -> tpu_dist, cpu -> gloo
    dist.init_process_group("tpu_dist", device_id=torch.device("tpu"))

The backend itself is C++ (csrc/distributed/backend.h, `torch_tpu._C.distributed.TpuBackend`). On a plugin
without cross-process collectives (the CPU plugin), each collective is staged through host memory
and run by PyTorch's ProcessGroupGloo, created here on the same store: one device -> host and one
host -> device copy per collective. The group's `timeout` bounds every collective: a rank that died
or never joined makes the others raise torch.distributed.DistBackendError within it.
On a plugin with cross-process collectives (libtpu, a multi-node CUDA client) the one-tensor
collectives run on the device instead, as StableHLO collective programs over the group's devices
(.device_collectives.backend_device_path; TORCH_TPU_DIST_DEVICE_COLLECTIVES=auto|1|0).

Device convention (Google's TorchTPU): under torchrun each process drives one device, and sees it
as `tpu:0` (`torch.device("tpu")`); see torch_tpu.runtime for how the CPU plugin is sized per process.
Topology-aware meshes (.mesh): topology_aware_mesh (rank layout), topology_aware_device_mesh (DeviceMesh).
On a TPU VM, each torchrun process owns one chip: tpu_process_env (.tpu_env) derives libtpu's
variables for it, and torch_tpu sets them before the client starts.
"""
from __future__ import annotations

import functools
from datetime import timedelta

import torch
import torch.distributed as dist

from .. import _C
from .. import tpu as tpu_module
from .device_collectives import backend_device_path
from .mesh import topology_aware_device_mesh, topology_aware_mesh  # noqa: F401
from .tpu_env import tpu_process_env  # noqa: F401

BACKEND_NAME = "tpu_dist"


class _HostOptions(dist.ProcessGroupGloo._Options if dist.is_available() else object):
    """The host (Gloo) group's options, copyable: split_group() deep-copies the parent backend's
    `options` for the split, which PyTorch's own Gloo options do not support."""

    @classmethod
    def make(cls, timeout: timedelta) -> "_HostOptions":
        opts = cls()
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_default_device()]
        opts._threads = 2  # Gloo's default
        return opts

    def __deepcopy__(self, memo):
        new = type(self)()
        new._timeout, new._devices, new._threads = self._timeout, self._devices, self._threads
        return new


def _create_backend(dist_backend_opts, backend_options=None):
    """The creator torch.distributed calls for each tpu_dist group (the world and every new_group /
    DeviceMesh sub-group): a Gloo group on a sub-prefix of the group's store stages the collectives."""
    store = dist.PrefixStore("tpu_dist/host/", dist_backend_opts.store)
    rank, size = dist_backend_opts.group_rank, dist_backend_opts.group_size
    _check_one_device_per_process(size)
    timeout = dist_backend_opts.timeout
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    opts = _HostOptions.make(timeout)
    device = backend_device_path(dist.PrefixStore("tpu_dist/device/", dist_backend_opts.store), rank, size,
                                 _C.device.current_device(), str(dist_backend_opts.group_id), timeout=timeout)
    backend = _C.distributed.TpuBackend(dist.ProcessGroupGloo(store, rank, size, opts), rank, size, timeout, device)
    # pybind hands back this Python object for the C++ options only while it is alive; the backend's
    # Python wrapper is dropped after creation, so the options are kept here (one per group).
    _HOST_OPTIONS.append(opts)
    return backend


_HOST_OPTIONS: list = []


def _check_one_device_per_process(group_size: int) -> None:
    """On a TPU, tpu_dist runs one process per device: a process of a multi-process group that sees
    several chips (TPU_VISIBLE_CHIPS unset or naming more than one) would drive chips another process
    also claims. Raises RuntimeError saying what to set."""
    from .. import plugins
    # Only where libtpu is the plugin: elsewhere this must not start the client (a rank may never
    # use its tpu device).
    if group_size > 1 and plugins.kind_of(plugins.resolve()[0]) is plugins.TPU and _C.runtime.device_count() > 1:
        raise RuntimeError(
            f"tpu_dist: this process sees {_C.runtime.device_count()} TPU devices, but tpu_dist runs one process per "
            "device. Under torchrun torch_tpu sets TPU_VISIBLE_CHIPS=LOCAL_RANK and the process bounds itself "
            "(torch_tpu.distributed.tpu_process_env); a job that sets TPU_VISIBLE_CHIPS must name one chip.")


def _say_tpu_dist_for_nccl(init):
    """init_process_group that, where NCCL is not built in (a CPU or TPU build of torch), adds to
    PyTorch's "Distributed package doesn't have NCCL built in" what a CUDA script moved to tpu needs:
    backend "tpu_dist". Arguments, results and every other error are init's own."""
    @functools.wraps(init)
    def init_process_group(*args, **kwargs):
        try:
            return init(*args, **kwargs)
        except RuntimeError as e:
            backend = kwargs.get("backend", args[0] if args else None)
            if "nccl" not in str(backend or "").lower() or dist.is_nccl_available():
                raise
            raise RuntimeError(
                f"{e}. NCCL is CUDA's; for tpu tensors use backend 'tpu_dist': "
                "dist.init_process_group('tpu_dist'), or no backend (tpu tensors on tpu_dist, CPU ones on gloo)") from e
    init_process_group.__torch_tpu_wrapped__ = True
    return init_process_group


def _tpu_device_id(d):
    """A DDP device id (an int, "tpu:N" or torch.device) naming a tpu device, as the index of the
    device it names (tpu:LOCAL_RANK is tpu:0 in a process driving one device: torch_tpu.tpu._index)."""
    if isinstance(d, (str, torch.device)) and torch.device(d).type != "tpu":
        return d
    return tpu_module._index(d)


def _ddp_with_own_device_ids(init):
    """DistributedDataParallel.__init__ that, for a module on tpu, turns device_ids and output_device
    into the index of the device they name (CUDA scripts pass device_ids=[local_rank]; torch_tpu's
    process sees that device as tpu:0). Without it, DDP moves each input to tpu:LOCAL_RANK (a copy
    to the same device every step) through a side stream that it looks up by that index among the
    device_count() streams, and fails (IndexError). Everything else is DDP's own."""
    @functools.wraps(init)
    def __init__(self, module, device_ids=None, output_device=None, *args, **kwargs):
        on_tpu = any(p.device.type == "tpu" for p in module.parameters())
        if on_tpu and device_ids:
            device_ids = [_tpu_device_id(d) for d in device_ids]
        if on_tpu and output_device is not None:
            output_device = _tpu_device_id(output_device)
        init(self, module, device_ids, output_device, *args, **kwargs)
    __init__.__torch_tpu_wrapped__ = True
    return __init__


def register() -> None:
    """Registers `tpu_dist` with torch.distributed (idempotent; called when torch_tpu loads); makes
    init_process_group("nccl") name it where NCCL is not built in, and DDP take CUDA-habit device_ids."""
    if not dist.is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["tpu"])
    if not getattr(dist.init_process_group, "__torch_tpu_wrapped__", False):
        from torch.distributed import distributed_c10d
        dist.init_process_group = distributed_c10d.init_process_group = _say_tpu_dist_for_nccl(
            distributed_c10d.init_process_group)
    from torch.nn.parallel import DistributedDataParallel as DDP
    if not getattr(DDP.__init__, "__torch_tpu_wrapped__", False):
        DDP.__init__ = _ddp_with_own_device_ids(DDP.__init__)
