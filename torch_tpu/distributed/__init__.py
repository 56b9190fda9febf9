"""`tpu_dist`: torch.distributed on tpu tensors, one process per device.

Importing torch_tpu registers the backend (`torch.distributed.Backend.register_backend("tpu_dist",
..., extended_api=True, devices=["tpu"])`), so that each of these works:

    dist.init_process_group("tpu_dist")
    dist.init_process_group("cpu:gloo,tpu:tpu_dist")   # CPU tensors on Gloo, tpu tensors on tpu_dist
    dist.init_process_group()                          # the same: tpu -> tpu_dist, cpu -> gloo
    dist.init_process_group("tpu_dist", device_id=torch.device("tpu"))

The backend itself is C++ (csrc/distributed/backend.h, `torch_tpu._C._TpuBackend`). On a plugin
without cross-process collectives (the CPU plugin), each collective is staged through host memory
and run by PyTorch's ProcessGroupGloo, created here on the same store: one device -> host and one
host -> device copy per collective. The group's `timeout` bounds every collective: a rank that died
or never joined makes the others raise torch.distributed.DistBackendError within it.

Device convention (Google's TorchTPU): under torchrun each process drives one device, and sees it
as `tpu:0` (`torch.device("tpu")`); see torch_tpu.runtime for how the CPU plugin is sized per process.
"""
from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from .. import _C

BACKEND_NAME = "tpu_dist"


def _create_backend(dist_backend_opts, backend_options=None):
    """The creator torch.distributed calls for each tpu_dist group (the world and every new_group /
    DeviceMesh sub-group): a Gloo group on a sub-prefix of the group's store stages the collectives."""
    store = dist.PrefixStore("tpu_dist/host/", dist_backend_opts.store)
    rank, size = dist_backend_opts.group_rank, dist_backend_opts.group_size
    timeout = dist_backend_opts.timeout
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    host = dist.ProcessGroupGloo(store, rank, size, timeout)
    return _C._TpuBackend(host, rank, size, timeout)


def register() -> None:
    """Registers `tpu_dist` with torch.distributed (idempotent; called when torch_tpu loads)."""
    if not dist.is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["tpu"])
