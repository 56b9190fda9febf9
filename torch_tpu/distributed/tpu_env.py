"""One process per TPU device on a TPU VM: libtpu's process environment, derived from torchrun's.

On a TPU VM, libtpu lets the first process that starts a client take every chip, unless each
process says, before its client starts, which chip it owns and how the job's processes form the
slice. torch_tpu derives that from torchrun's variables (LOCAL_RANK, LOCAL_WORLD_SIZE, RANK,
WORLD_SIZE) and the slice (accelerator type, workers' addresses), as PyTorch/XLA's
configure_topology does and JAX documents for several processes per VM:

    TPU_CHIPS_PER_PROCESS_BOUNDS  1,1,1                      one chip per process
    TPU_PROCESS_BOUNDS            x,y,z (the chip grid)      tpu7x: x,y,z,2 (two devices per chip)
    CLOUD_TPU_TASK_ID             worker id * LOCAL_WORLD_SIZE + LOCAL_RANK   (libtpu's process index)
    TPU_PROCESS_PORT              8476 + LOCAL_RANK
    TPU_PROCESS_ADDRESSES         every process's host:port, host by host
    TPU_VISIBLE_CHIPS             LOCAL_RANK

runtime.configure (torch_tpu's import) calls configure_process() when the running plugin is libtpu
and torchrun started several processes; values already in the environment are kept, and a job
that sets TPU_PROCESS_BOUNDS and TPU_VISIBLE_CHIPS itself (a sub-slice) is left alone.
tpu_process_env() is the derivation alone, for a launcher or a person to print.
"""
from __future__ import annotations

import os
import re
import urllib.request
from typing import Callable, Mapping, MutableMapping, Sequence

from ..tpu_slices import chip_grid, parse_accelerator_type

BASE_PORT = 8476  # libtpu's first process port (PyTorch/XLA's and JAX's default)
_METADATA = "http://metadata.google.internal/computeMetadata/v1/instance/attributes/"


def tpu_process_env(local_rank: int, local_world_size: int, rank: int, world_size: int, accelerator_type: str,
                    worker_hostnames: str | Sequence[str] | None = None, *, topology: str | None = None,
                    worker_id: int | None = None, base_port: int = BASE_PORT) -> dict[str, str]:
    """libtpu's variables for the process LOCAL_RANK `local_rank` of `local_world_size` on its host,
    RANK `rank` of `world_size`, on a slice of `accelerator_type` ("v5litepod-16", "v4-8", "v5p-8",
    "v6e-8", "tpu7x-8") whose hosts are `worker_hostnames` (a list or comma-separated string, in TPU
    worker order; None or one host: this host, "localhost"). `topology` ("4x4", "2x2x2": the VM's
    TPU_TOPOLOGY) overrides Cloud TPU's default chip grid for the chip count; `worker_id` (the VM's
    TPU_WORKER_ID) defaults to rank // local_world_size.

    Returns {name: value} for the six variables in the module's doc. Raises ValueError when the
    processes do not match the slice: one process per device (v4/v5p megacore chips are one device,
    tpu7x chips two), the same number on every host."""
    gen, chips = parse_accelerator_type(accelerator_type)
    hosts = _hosts(worker_hostnames)
    devices = chips * gen.devices_per_chip
    per_host, uneven = divmod(devices, len(hosts))
    if uneven or world_size != devices or local_world_size != per_host:
        raise ValueError(
            f"{accelerator_type} has {chips} chips ({devices} devices) on {len(hosts)} host(s): a tpu job runs one "
            f"process per device, {per_host} per host (torchrun --nnodes {len(hosts)} --nproc_per_node {per_host}); "
            f"this process was started with WORLD_SIZE={world_size}, LOCAL_WORLD_SIZE={local_world_size}. To run on "
            "part of a slice, set TPU_PROCESS_BOUNDS, TPU_CHIPS_PER_PROCESS_BOUNDS and TPU_VISIBLE_CHIPS yourself.")
    if not (0 <= local_rank < local_world_size and 0 <= rank < world_size):
        raise ValueError(f"LOCAL_RANK={local_rank} / RANK={rank} out of range for LOCAL_WORLD_SIZE={local_world_size} "
                         f"/ WORLD_SIZE={world_size}")
    if worker_id is None:
        worker_id = rank // local_world_size
    if not 0 <= worker_id < len(hosts):
        raise ValueError(f"TPU worker id {worker_id} out of range for {len(hosts)} host(s) {hosts}")
    bounds = ",".join(str(d) for d in chip_grid(gen, chips, topology))
    if gen.devices_per_chip == 2 and gen.topology == "tpu7x":
        bounds += ",2"
    ports = [base_port + i for i in range(local_world_size)]
    return {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": bounds,
        "CLOUD_TPU_TASK_ID": str(worker_id * local_world_size + local_rank),
        "TPU_PROCESS_PORT": str(ports[local_rank]),
        "TPU_PROCESS_ADDRESSES": ",".join(f"{h}:{p}" for h in hosts for p in ports),
        "TPU_VISIBLE_CHIPS": str(local_rank),
    }


def _hosts(worker_hostnames) -> list[str]:
    if worker_hostnames is None:
        names = []
    elif isinstance(worker_hostnames, str):
        names = [h.strip() for h in worker_hostnames.split(",") if h.strip()]
    else:
        names = [str(h).strip() for h in worker_hostnames]
    return names if len(names) > 1 else ["localhost"]


def metadata(key: str, timeout: float = 2.0) -> str:
    """A TPU VM's instance attribute `key` ("accelerator-type", "worker-network-endpoints",
    "agent-worker-number", "tpu-env") from the cloud metadata server. Raises OSError off a VM."""
    req = urllib.request.Request(_METADATA + key, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310  (a fixed http URL)
        return r.read().decode()


def environment_for(env: Mapping[str, str], fetch: Callable[[str], str] = metadata) -> dict[str, str] | None:
    """tpu_process_env() for the process `env` describes (torchrun's variables; TPU_ACCELERATOR_TYPE,
    TPU_WORKER_HOSTNAMES, TPU_WORKER_ID, TPU_TOPOLOGY where set, else the VM's metadata through
    `fetch`). None when `env` is not a multi-process job or already carries its own process bounds.
    Raises ValueError (the slice and the processes disagree) or OSError (no metadata and no
    TPU_ACCELERATOR_TYPE)."""
    try:
        local_rank, local_world = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    if world <= 1 or ("TPU_PROCESS_BOUNDS" in env and "TPU_VISIBLE_CHIPS" in env):
        return None
    accelerator = env.get("TPU_ACCELERATOR_TYPE") or fetch("accelerator-type").strip()
    hosts = env.get("TPU_WORKER_HOSTNAMES")
    if hosts is None:
        # "hostname:uid:ip,..." in worker order
        hosts = [w.split(":")[2] for w in fetch("worker-network-endpoints").strip().split(",") if w.count(":") >= 2]
    worker_id = env.get("TPU_WORKER_ID")
    topology = env.get("TPU_TOPOLOGY")
    if topology is None and "TPU_ACCELERATOR_TYPE" not in env:
        m = re.search(r"^TOPOLOGY:\s*'?([\dx]+)'?", fetch("tpu-env"), re.M)
        topology = m.group(1) if m else None
    return tpu_process_env(local_rank, local_world, rank, world, accelerator, hosts, topology=topology,
                           worker_id=int(worker_id) if worker_id not in (None, "") else None)


def configure_process(env: MutableMapping[str, str] = os.environ,
                      fetch: Callable[[str], str] = metadata) -> dict[str, str]:
    """Sets environment_for(env) in `env`, keeping every value already there; returns what it set.
    Raises as environment_for does, with what to set instead."""
    try:
        derived = environment_for(env, fetch)
    except OSError as e:
        raise ValueError(f"torch_tpu: cannot tell this TPU VM's slice (the metadata server did not answer: {e}); "
                         "set TPU_ACCELERATOR_TYPE (e.g. v5litepod-16) and TPU_WORKER_HOSTNAMES (the hosts, "
                         "comma-separated, in worker order)") from None
    set_now = {}
    for k, v in (derived or {}).items():
        if k not in env:
            env[k] = set_now[k] = v
    return set_now
