"""Collectives across the tpu devices of one process, as one device program (`torch.cuda.nccl`'s API
for tpu): each call runs one StableHLO collective (torch_tpu.lowering.collectives) compiled as one
replica on each of the inputs' devices, and launched on all of them at once.

This is what every tpu_dist collective becomes on a plugin with device collectives (the same
programs, over the group's devices); here it runs wherever the plugin runs collectives across its
local devices, the CPU plugin included (its devices are threads of one process), so the programs'
numbers are checked against Gloo's. Programs are cached like any other (memory, then the
executable cache's tiers), keyed by the program text and its devices.

    from torch_tpu.distributed import device_collectives as dc
    xs = [torch.ones(4, device=f"tpu:{i}") for i in range(2)]
    dc.all_reduce(xs)                       # in place: every xs[i] is 2.0 now
    outs = [torch.empty(8, device=f"tpu:{i}") for i in range(2)]
    dc.all_gather(xs, outs)                 # outs[i] = cat(xs) on every device

Every function takes `inputs`, one tpu tensor per device (distinct devices, one shape and dtype),
in rank order: inputs[k] plays group rank k. `op` is a torch.distributed.ReduceOp, its lower-case
name, or torch.cuda.nccl's integer code (0 SUM, 1 PROD, 2 MAX, 3 MIN, 4 AVG). Errors (ValueError / TypeError) are raised before anything runs; a failed launch writes no
tensor on any device. Results are asynchronous like any tpu op.

backend_device_path() sets up tpu_dist's device path for a group (csrc/distributed/
device_collectives.h): the same programs, compiled over the group's devices by their global ids.
graph_replicas() gives a compiled graph with collectives the world group's device path, so that it
runs as one program over its ranks' devices.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import socket
import uuid
from typing import Sequence

import torch

from .. import _C, plugins, runtime, settings
from ..lowering import collectives as programs


# torch.cuda.nccl's integer reduce ops (ncclRedOp_t): SUM, PROD, MAX, MIN, AVG.
_NCCL_OPS = {0: "sum", 1: "product", 2: "max", 3: "min", 4: "avg"}


def _op_name(op) -> str:
    if isinstance(op, str):
        return op.lower()
    if isinstance(op, int) and not isinstance(op, bool) and op in _NCCL_OPS:
        return _NCCL_OPS[op]
    name = getattr(op, "name", None) or str(op).split(".")[-1]  # RedOpType, or ReduceOp wrapping one
    if not isinstance(name, str) or name == "ReduceOp":
        name = str(getattr(op, "op", op)).split(".")[-1]
    return name.lower()


def _check_inputs(name: str, inputs: Sequence[torch.Tensor]) -> list[int]:
    inputs = list(inputs)
    if not inputs or not all(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in inputs):
        raise ValueError(f"{name}: inputs must be a non-empty list of tpu tensors, one per device")
    devices = [t.device.index for t in inputs]
    if len(set(devices)) != len(devices):
        raise ValueError(f"{name}: inputs must be on distinct tpu devices, got {['tpu:%d' % d for d in devices]}")
    first = inputs[0]
    for t in inputs[1:]:
        if t.shape != first.shape or t.dtype != first.dtype:
            raise ValueError(f"{name}: every input must have one shape and dtype; got {tuple(first.shape)} "
                             f"{first.dtype} on tpu:{first.device.index} and {tuple(t.shape)} {t.dtype} on "
                             f"tpu:{t.device.index}")
    return devices


def _check_outputs(name: str, outputs, devices: list[int], shape: tuple, dtype: torch.dtype) -> list:
    outputs = list(outputs)
    if len(outputs) != len(devices):
        raise ValueError(f"{name}: {len(devices)} inputs but {len(outputs)} outputs")
    for t, d in zip(outputs, devices):
        if not isinstance(t, torch.Tensor) or t.device != torch.device("tpu", d):
            raise ValueError(f"{name}: outputs[k] must be a tpu tensor on inputs[k]'s device (tpu:{d})")
        if t.dtype != dtype or t.numel() != torch.Size(shape).numel():
            raise ValueError(f"{name}: each output must hold {torch.Size(shape).numel()} elements of {dtype} "
                             f"(shape {tuple(shape)}), got {tuple(t.shape)} {t.dtype}")
    return outputs


def _whole(t: torch.Tensor) -> bool:
    """True when `t` is its storage, densely: the program may take and replace the storage's buffer."""
    return t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _run(name: str, kind: str, inputs, outputs, out_shape: tuple, **kw) -> None:
    """Runs collective `kind` over the inputs' devices; writes its results into `outputs`."""
    devices = _check_inputs(name, inputs)
    _check_outputs(name, outputs, devices, out_shape, inputs[0].dtype)
    srcs = [t if _whole(t) else t.contiguous().clone() for t in inputs]
    # The program takes each storage's buffer as it is laid out ((dtype, dims) of its PJRT buffer).
    dims = tuple(_C.device.storage_spec(srcs[0])[1])
    if any(tuple(_C.device.storage_spec(s)[1]) != dims for s in srcs[1:]):
        srcs = [s.clone() for s in srcs]  # copies made by one program: one layout
        dims = tuple(_C.device.storage_spec(srcs[0])[1])
    text = programs.program(kind, tuple(inputs[0].shape), inputs[0].dtype, len(devices), buffer_shape=dims, **kw)
    exe = runtime.compile(text, f"{name} over tpu:{','.join(map(str, devices))}",
                          device_ids=[_C.runtime.describe_device(d)["id"] for d in devices])
    sinks = [o if _whole(o) else None for o in outputs]
    _C.eager.fused_flush()  # ops fused eager recorded on these tensors run first
    parts = [([s], [o], [] if o is not None else [_C.eager.FreshSpec(tuple(out_shape), inputs[0].dtype)], d)
             for s, o, d in zip(srcs, sinks, devices)]
    fresh = _C.runtime.launch_replicas(exe, parts, name)
    for o, new in zip(outputs, fresh):
        if new:  # a view (or a strided tensor) receives its result through a copy
            o.copy_(new[0].view(o.shape))


def all_reduce(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None, op="sum") -> None:
    """Every outputs[k] (default: inputs[k], in place) becomes the reduction of all inputs under `op`."""
    _run("all_reduce", "all_reduce", inputs, inputs if outputs is None else outputs, tuple(inputs[0].shape),
         op=_op_name(op))


def reduce(inputs: Sequence[torch.Tensor], output: torch.Tensor | None = None, root: int = 0, op="sum") -> None:
    """inputs[root] (or `output`, on its device) becomes the reduction of all inputs; the others keep
    their values."""
    outs = list(inputs)
    if output is not None:
        outs[root] = output
    _run("reduce", "reduce", inputs, outs, tuple(inputs[0].shape), root=root, op=_op_name(op))


def broadcast(inputs: Sequence[torch.Tensor], root: int = 0) -> None:
    """Every inputs[k] becomes inputs[root], bit for bit."""
    _run("broadcast", "broadcast", inputs, inputs, tuple(inputs[0].shape), root=root)


def all_gather(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
    """Every outputs[k] becomes the inputs concatenated along dim 0 (len(inputs) x inputs[0]'s elements)."""
    shape = tuple(inputs[0].shape) or (1,)
    _run("all_gather", "all_gather", inputs, outputs, (shape[0] * len(inputs), *shape[1:]))


def reduce_scatter(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], op="sum") -> None:
    """outputs[k] becomes block k (along dim 0) of the reduction of all inputs under `op`."""
    shape = tuple(inputs[0].shape)
    n = len(inputs)
    if not shape or shape[0] % n:
        raise ValueError(f"reduce_scatter: dim 0 of the inputs ({shape}) must divide into {n} equal blocks")
    _run("reduce_scatter", "reduce_scatter", inputs, outputs, (shape[0] // n, *shape[1:]), op=_op_name(op))


def all_to_all(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
    """Block j (along dim 0) of inputs[i] becomes block i of outputs[j] (all_to_all_single, equal splits)."""
    _run("all_to_all", "all_to_all", inputs, outputs, tuple(inputs[0].shape))


def send_recv(inputs: Sequence[torch.Tensor], pairs: Sequence[tuple[int, int]]) -> None:
    """For each (source, target) pair of ranks, inputs[target] becomes inputs[source] (what a matched
    send/recv does); a rank that is no target keeps its value."""
    targets = {int(t) for _, t in pairs}
    outs = [t if k in targets else torch.empty_like(t) for k, t in enumerate(inputs)]
    _run("send_recv", "permute", inputs, outs, tuple(inputs[0].shape), pairs=pairs)


# -- tpu_dist's device path -------------------------------------------------------------------------

def _has_cross_process_collectives() -> bool:
    """libtpu (ICI/DCN), or the CUDA plugin started with a job's key-value store (NCCL across nodes)."""
    path = plugins.resolve()[0]
    if not path or plugins.kind_of(path) is plugins.CPU:  # decided without starting the client
        return False
    platform = _C.runtime.platform_name()
    return platform == "tpu" or (platform == "cuda" and _C.distributed.KeyValueCallbacks.of_runtime() is not None)


@dataclasses.dataclass(frozen=True)
class _Path:
    """A group's device path in this process: `key` (the group, unique to this job), per group rank
    its device's global id and its local device index here (-1: another process drives it)."""
    key: str
    ids: tuple[int, ...]
    local: tuple[int, ...]
    timeout: datetime.timedelta


_PATHS: dict[str, _Path] = {}  # by c10d group name


@dataclasses.dataclass(frozen=True)
class GraphReplicas:
    """Where a compiled graph with collectives runs as one program (torch_tpu.dynamo): replica k on
    global device `device_ids[k]` for rank span[k], driven here where `local[k]` >= 0 (a local
    device index). Parts launched by several threads of this process meet at `place(program text)`
    (runtime/replica_meeting.h), waiting at most `timeout`."""
    device_ids: tuple[int, ...]
    local: tuple[int, ...]
    key: str
    timeout: datetime.timedelta

    def place(self, text: str) -> str:
        return f"{self.key}/graph/{hashlib.sha256(text.encode()).hexdigest()[:24]}"


def graph_replicas(span: Sequence[int]) -> GraphReplicas | None:
    """The devices of the global ranks `span` under the world group's device path, or None where the
    world's collectives run on the host (then a graph is cut at its collectives)."""
    import torch.distributed as dist
    if not dist.is_initialized():
        return None
    world = _PATHS.get(dist.group.WORLD.group_name)
    if world is None or len(world.ids) != dist.get_world_size():
        return None
    return GraphReplicas(tuple(world.ids[r] for r in span), tuple(world.local[r] for r in span),
                         world.key, world.timeout)


def backend_device_path(store, rank: int, size: int, device: int, group_name: str, mode: str | None = None,
                        timeout: datetime.timedelta = datetime.timedelta(minutes=30)):
    """The device path of one tpu_dist group for its rank `rank` driving local device `device`, as
    _C.distributed.TpuBackend takes it: (group_key, local_devices, build), or None for the host path.

    `mode` (default: env TORCH_TPU_DIST_DEVICE_COLLECTIVES): "auto" (on where the plugin has
    cross-process collectives), "1" (on; on the CPU plugin only when every rank of the group is in
    this process, e.g. ranks as threads), "0" (off). Every rank of the group calls this at the same
    time: the ranks exchange (process, local device, device id) through `store`; the path is kept
    under `group_name` for compiled graphs (graph_replicas), with the group's `timeout`. Raises
    RuntimeError for "1" where the group spans processes of a plugin without cross-process collectives."""
    mode = (mode or settings.get("TORCH_TPU_DIST_DEVICE_COLLECTIVES")).strip().lower()
    if mode not in ("auto", "0", "1"):
        raise ValueError(f"TORCH_TPU_DIST_DEVICE_COLLECTIVES must be auto, 0 or 1, got {mode!r}")
    _PATHS.pop(group_name, None)  # a group of an earlier job by this name
    if mode == "0" or (mode == "auto" and not _has_cross_process_collectives()):
        return None
    me = f"{socket.gethostname()}:{os.getpid()}"
    store.set(f"rank{rank}", f"{me}|{device}|{_C.runtime.describe_device(device)['id']}")
    if rank == 0:
        store.set("token", uuid.uuid4().hex)
    peers = [store.get(f"rank{r}").decode().split("|") for r in range(size)]
    local = [int(d) if p == me else -1 for p, d, _ in peers]
    ids = [int(i) for _, _, i in peers]
    if -1 in local and not _has_cross_process_collectives():
        raise RuntimeError(f"TORCH_TPU_DIST_DEVICE_COLLECTIVES=1: this group spans processes, but the "
                           f"{_C.runtime.platform_name()} plugin has no cross-process collectives; unset it (the "
                           "host path runs them)")
    key = f"{group_name}:{store.get('token').decode()}"
    _PATHS[group_name] = _Path(key, tuple(ids), tuple(local), timeout)

    def build(kind, shape, dtype, dims, op, root, ranks):
        span = [ids[r] for r in ranks] if ranks else ids
        pairs = [(0, 1)] if kind == "permute" else None  # send/recv: ranks (src, dst)
        text = programs.program(kind, shape, dtype, len(span), op=op or "sum", root=root, pairs=pairs,
                                buffer_shape=dims)
        return runtime.compile(text, f"tpu_dist {kind} over {len(span)} devices", device_ids=span)
    return key, local, build
