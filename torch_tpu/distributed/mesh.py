"""Topology-aware device meshes: which rank sits where in a torch.distributed DeviceMesh.

`DeviceMesh("tpu", torch.arange(n).reshape(shape))` (what init_device_mesh builds) puts ranks in
rank order, which on a TPU slice need not follow the interconnect: two ranks next to each other on
a mesh axis may be many ICI hops apart. `topology_aware_mesh` orders the ranks by their devices'
physical coordinates instead, so that every mesh axis runs along interconnect links and rings, the
last (innermost, highest-traffic) axis getting the best of them; `topology_aware_device_mesh`
builds the DeviceMesh from that layout.

    layout = topology_aware_mesh("tpu", (4, 4))                  # int64 tensor of ranks, shape (4, 4)
    mesh = topology_aware_device_mesh("tpu", (2, 8), mesh_dim_names=("dp", "tp"))
    mesh = topology_aware_device_mesh("tpu", (1, 8), topology="multi_slice", dcn_mesh_shape=(4, 1))

Sources: the argument names (device_type, mesh_shape, topology, dcn_mesh_shape) are Google
TorchTPU's; the idea of mapping logical axes, highest-traffic first, onto subsets of the physical
torus axes, and of laying slices out over DCN as outer blocks of each axis (full shape = mesh_shape
* dcn_mesh_shape), is JAX's jax.experimental.mesh_utils (create_device_mesh,
create_hybrid_device_mesh). This implementation is its own: it splits physical axes whenever no
subset fits (JAX only on request), and walks an axis that spans several physical axes as a ring (a Hamiltonian cycle of
its sub-grid) rather than row-major, so that consecutive ranks along it are ICI neighbours.

Physical coordinates come from each device's PJRT attributes (torch.tpu.get_device_properties(i)
.attributes: "coords" [x, y, z], "core_on_chip", and "slice_index" on multi-slice jobs). A plugin
that reports none (the CPU plugin) gets rank order, with a warning the first time.
"""
from __future__ import annotations

import itertools
import math
import operator
import warnings
from collections.abc import Sequence

import torch

TOPOLOGIES = ("single_slice", "multi_slice")

__all__ = ["topology_aware_mesh", "topology_aware_device_mesh", "rank_layout", "device_descriptions",
           "TOPOLOGIES"]

_warned: set = set()  # reasons already warned about: the rank-order fallback says so once per process


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, UserWarning, stacklevel=3)


# ----------------------------------------------------------------------------------------------
# Argument checks


def _shape(name: str, value) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    try:
        dims = tuple(value)
    except TypeError:
        raise ValueError(f"{name} must be a tuple of positive ints, got {value!r}") from None
    try:  # numpy / torch integers are fine; bools, floats and strings are not
        if isinstance(value, str) or any(isinstance(d, bool) for d in dims):
            raise TypeError
        dims = tuple(operator.index(d) for d in dims)
    except TypeError:
        dims = ()
    if not dims or min(dims) < 1:
        raise ValueError(f"{name} must be a non-empty tuple of positive ints, got {value!r}")
    return dims


def _check_args(mesh_shape, topology, dcn_mesh_shape) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(mesh_shape, dcn_mesh_shape) as tuples of ints, dcn all ones for a single slice."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}: expected one of {', '.join(map(repr, TOPOLOGIES))}")
    mesh_shape = _shape("mesh_shape", mesh_shape)
    if dcn_mesh_shape is None:
        if topology == "multi_slice":
            raise ValueError("topology='multi_slice' needs dcn_mesh_shape: the number of slices along "
                             "each mesh axis, e.g. (2, 1) for two slices stacked on the first axis")
        return mesh_shape, (1,) * len(mesh_shape)
    dcn = _shape("dcn_mesh_shape", dcn_mesh_shape)
    if len(dcn) != len(mesh_shape):
        raise ValueError(f"dcn_mesh_shape {dcn} must have one entry per mesh axis, like mesh_shape "
                         f"{mesh_shape}")
    if topology == "single_slice" and math.prod(dcn) != 1:
        raise ValueError(f"dcn_mesh_shape {dcn} spreads the mesh over {math.prod(dcn)} slices: "
                         "pass topology='multi_slice'")
    return mesh_shape, dcn


# ----------------------------------------------------------------------------------------------
# Orders of a small grid's points (tuples of digits), consecutive points one step apart


def _snake(dims: Sequence[int]) -> list[tuple[int, ...]]:
    """Boustrophedon walk of a grid: every point once, consecutive points differ by 1 in one digit."""
    order: list[tuple[int, ...]] = [()]
    for d in reversed(dims):  # each outer digit reverses the inner walk on odd steps
        order = [(i,) + rest for i in range(d) for rest in (order if i % 2 == 0 else order[::-1])]
    return order


def _ring(dims: Sequence[int]) -> list[tuple[int, ...]]:
    """A walk of a grid (every dim > 1) whose consecutive points, and last and first, are one step
    apart where the grid allows it (some dim even); otherwise a snake (the ends are not neighbours)."""
    if len(dims) < 2:
        return _snake(dims)
    even = [k for k, d in enumerate(dims) if d % 2 == 0]
    if not even:
        return _snake(dims)  # an odd x odd grid graph has no Hamiltonian cycle
    r = even[0]
    rest = [k for k in range(len(dims)) if k != r]
    path = _snake([dims[k] for k in rest])  # the other dims as one line of adjacent points
    rows, cols = dims[r], len(path)
    # Row 0 left to right; rows 1.. snake over columns 1..cols-1; back up column 0 (rows even).
    cells = [(0, c) for c in range(cols)]
    for row in range(1, rows):
        cells += [(row, c) for c in (range(cols - 1, 0, -1) if row % 2 else range(1, cols))]
    cells += [(row, 0) for row in range(rows - 1, 0, -1)]
    out = []
    for row, c in cells:
        digits = [0] * len(dims)
        digits[r] = row
        for k, v in zip(rest, path[c]):
            digits[k] = v
        out.append(tuple(digits))
    return out


# ----------------------------------------------------------------------------------------------
# One slice


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _assign_axes(extents: Sequence[int], mesh_shape: Sequence[int]) -> list[list[tuple[int, int, int]]]:
    """For each logical axis, its pieces (physical axis, factor, stride): the logical axis walks
    `factor` positions `stride` apart along each of them. Logical axes are served last to first (the
    last carries the most traffic); each takes, among the ways to write its size as a product of
    divisors of what is left of the physical axes, the one that (1) uses no already-split physical
    axis (whose remaining positions are more than one hop apart), (2) splits the fewest physical
    axes, (3) spans the most physical axes (more links), (4) prefers the earlier physical axes."""
    caps = list(extents)
    strides = [1] * len(caps)
    pieces: list[list[tuple[int, int, int]]] = [[] for _ in mesh_shape]
    for axis in reversed(range(len(mesh_shape))):
        size = mesh_shape[axis]
        if size == 1:
            continue
        best = None
        for combo in itertools.product(*(_divisors(c) for c in caps)):
            if math.prod(combo) != size:
                continue
            used = [j for j, a in enumerate(combo) if a > 1]
            key = (sum(strides[j] > 1 for j in used), sum(combo[j] < caps[j] for j in used), -len(used),
                   tuple(-a for a in combo))
            if best is None or key < best[0]:
                best = (key, combo)
        # The sizes left always factor over what is left of the physical axes (their products are
        # equal), so a choice exists.
        assert best is not None, (extents, mesh_shape)
        for j, a in enumerate(best[1]):
            if a > 1:
                pieces[axis].append((j, a, strides[j]))
                strides[j] *= a
                caps[j] //= a
    return pieces


def _slice_layout(members: list[tuple[int, dict]], mesh_shape: tuple[int, ...]) -> list[int] | None:
    """The ranks of one slice (`members`: (rank, description)) laid out row-major over mesh_shape,
    or None when their coordinates do not describe a full grid (the caller falls back)."""
    points = {}
    for rank, desc in members:
        coords = desc.get("coords")
        if coords is None:
            return None
        point = tuple(int(c) for c in coords) + (int(desc.get("core_on_chip") or 0),)
        if point in points or (points and len(point) != len(next(iter(points)))):
            return None
        points[point] = rank
    ndim = len(next(iter(points)))
    lo = [min(p[k] for p in points) for k in range(ndim)]
    extent = [max(p[k] for p in points) - lo[k] + 1 for k in range(ndim)]
    if math.prod(extent) != len(points):
        return None  # holes: not a box of devices
    # Physical axes: the cores of a chip first (the fastest link, so preferred on a tie), then x, y, z.
    phys = [k for k in [ndim - 1] + list(range(ndim - 1)) if extent[k] > 1]
    pieces = _assign_axes([extent[k] for k in phys], mesh_shape)
    walks = [_ring([a for _, a, _ in p]) for p in pieces]
    layout = []
    for index in itertools.product(*(range(s) for s in mesh_shape)):
        digits: dict[int, list] = {}  # physical axis -> [(stride, factor, digit)] of its pieces
        for axis, i in enumerate(index):
            for (j, factor, stride), digit in zip(pieces[axis], walks[axis][i]):
                digits.setdefault(j, []).append((stride, factor, digit))
        point = list(lo)
        for j, parts in digits.items():
            point[phys[j]] += _fold(sorted(parts))
        layout.append(points[tuple(point)])
    return layout


def _fold(parts: list[tuple[int, int, int]]) -> int:
    """The position along a split physical axis of (stride, factor, digit) pieces, inner first: each
    outer digit's odd blocks run backwards (boustrophedon), so an inner step stays one hop and an
    outer step at the block's edge is one hop too (with the wrap link, all are on a 2x2-split 4-ring)."""
    pos, size = 0, 1
    for _, factor, digit in parts:
        if digit % 2:
            pos = size - 1 - pos
        pos, size = digit * size + pos, size * factor
    return pos


# ----------------------------------------------------------------------------------------------
# The layout


def rank_layout(devices: Sequence[dict], mesh_shape, *, topology: str = "single_slice",
                dcn_mesh_shape=None) -> torch.Tensor:
    """The topology-aware rank layout for the devices described by `devices` (pure: no runtime).

    devices: one dict per rank, rank i's at index i, with the keys the plugin reports (any may be
        missing): "coords" (a sequence of ints, e.g. [x, y, z]), "core_on_chip" (int), "slice_index"
        (int, multi-slice jobs).
    mesh_shape: the mesh's shape within a slice (the whole mesh for a single slice), a tuple of
        positive ints ordered from the least to the most communication-heavy axis.
    topology: "single_slice" (the default) or "multi_slice".
    dcn_mesh_shape: multi-slice only: the number of slices along each mesh axis; the full mesh is
        mesh_shape[i] * dcn_mesh_shape[i] on axis i, each slice one block (its DCN position the
        outer part of each axis index). Slices are placed in slice_index order, row-major over
        dcn_mesh_shape; without slice_index, ranks in consecutive blocks of prod(mesh_shape) are
        taken as the slices.

    Returns an int64 CPU tensor of the full mesh's shape holding each rank in range(len(devices))
    exactly once, for DeviceMesh(device_type, mesh=...). Within a slice, neighbours along each mesh
    axis are ICI neighbours wherever the shapes allow (an axis spanning a physical axis, or a
    several-axis sub-grid walked as a ring); an axis that gets the outer part of a split physical
    axis steps over the inner part (whose blocks alternate direction, so that the steps at their
    edges are one hop, and, over the wrap link of a 4-long torus ring split 2x2, all of them).
    Without usable coordinates (none reported, duplicated, or not a full box of devices) each slice
    is laid out in rank order and a UserWarning says so (once).

    Raises ValueError: unknown topology; mesh_shape / dcn_mesh_shape not tuples of positive ints,
    of different lengths, or dcn_mesh_shape with more than one slice for topology="single_slice"
    or missing for "multi_slice"; prod(mesh_shape) * prod(dcn_mesh_shape) != len(devices); a
    single_slice topology over devices from several slices; slices whose number is not
    prod(dcn_mesh_shape) or whose sizes are not prod(mesh_shape); slice_index on some devices only.
    """
    mesh_shape, dcn = _check_args(mesh_shape, topology, dcn_mesh_shape)
    n, per_slice, slices = len(devices), math.prod(mesh_shape), math.prod(dcn)
    if per_slice * slices != n:
        what = f"mesh_shape {mesh_shape}" + (f" x dcn_mesh_shape {dcn}" if topology == "multi_slice" else "")
        raise ValueError(f"{what} holds {per_slice * slices} devices, but there are {n}")
    indexed = [i for i, d in enumerate(devices) if d.get("slice_index") is not None]
    if indexed and len(indexed) != n:
        raise ValueError(f"only {len(indexed)} of {n} devices report a slice_index")
    if indexed:
        groups: dict[int, list] = {}
        for rank, desc in enumerate(devices):
            groups.setdefault(int(desc["slice_index"]), []).append((rank, desc))
        members = [groups[k] for k in sorted(groups)]
        if topology == "single_slice" and len(members) > 1:
            raise ValueError(f"the devices span {len(members)} slices (slice_index {sorted(groups)}): pass "
                             "topology='multi_slice' and dcn_mesh_shape")
    else:
        members = [list(enumerate(devices))[s * per_slice:(s + 1) * per_slice] for s in range(slices)]
        if topology == "multi_slice":
            _warn_once("no slice_index", "topology_aware_mesh: the devices report no slice_index; each "
                       f"block of {per_slice} consecutive ranks is taken as one slice")
    if len(members) != slices:
        raise ValueError(f"dcn_mesh_shape {dcn} asks for {slices} slices, but the devices form {len(members)}")
    for group in members:
        if len(group) != per_slice:
            raise ValueError(f"slice_index {group[0][1].get('slice_index')} has {len(group)} devices; "
                             f"mesh_shape {mesh_shape} needs {per_slice} in each slice")
    flat = []
    for group in members:
        layout = _slice_layout(group, mesh_shape)
        if layout is None:
            if all(d.get("coords") is None for _, d in group):
                _warn_once("no coords", "topology_aware_mesh: the devices report no physical coordinates "
                           "(the CPU plugin does not); the mesh is laid out in rank order")
            else:
                _warn_once("bad coords", "topology_aware_mesh: the devices' coordinates are missing on some, "
                           "repeated or do not form a full box; the mesh is laid out in rank order")
            layout = [rank for rank, _ in group]
        flat += layout
    # Blocks (dcn..., mesh...) -> interleave each DCN axis just outside its mesh axis -> full shape.
    nd = len(mesh_shape)
    blocks = torch.tensor(flat, dtype=torch.int64).reshape(*dcn, *mesh_shape)
    order = [k for axis in range(nd) for k in (axis, nd + axis)]
    return blocks.permute(order).reshape([d * m for d, m in zip(dcn, mesh_shape)]).contiguous()


# ----------------------------------------------------------------------------------------------
# The job's devices


def _plain(value):
    """An attribute value as plain Python (ints, lists of ints), so all_gather_object can send it."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


def _describe(index: int) -> dict:
    from .. import tpu  # the runtime; imported late, as torch_tpu imports this package while loading

    props = tpu.get_device_properties(index)
    desc = {"id": props.id, "process_index": props.process_index}
    for key in ("coords", "core_on_chip", "slice_index"):
        if key in props.attributes:
            desc[key] = _plain(props.attributes[key])
    return desc


def device_descriptions() -> list[dict]:
    """Every rank's device description (rank i's at index i): {"id", "process_index", and the
    attributes "coords", "core_on_chip", "slice_index" the plugin reports}. With a process group
    initialized each rank describes its current tpu device and all_gather_object shares them (a
    collective: every rank must call it); otherwise this process's tpu devices, in index order."""
    import torch.distributed as dist

    from .. import _C, tpu

    if dist.is_available() and dist.is_initialized():
        out: list = [None] * dist.get_world_size()
        dist.all_gather_object(out, _describe(tpu.current_device()))
        return out
    return [_describe(i) for i in range(_C.runtime.device_count())]


def _check_device_type(device_type) -> None:
    if device_type != "tpu":
        raise ValueError(f"device_type must be 'tpu', got {device_type!r}")


def topology_aware_mesh(device_type: str, mesh_shape, *, topology: str = "single_slice",
                        dcn_mesh_shape=None, devices: Sequence[dict] | None = None) -> torch.Tensor:
    """The rank layout of a topology-aware mesh: an int64 CPU tensor of global ranks, shaped like the
    full mesh (mesh_shape, times dcn_mesh_shape per axis for multi-slice), for
    torch.distributed.device_mesh.DeviceMesh(device_type, mesh=layout).

    device_type: "tpu". mesh_shape, topology, dcn_mesh_shape: as in rank_layout (Google TorchTPU's
    names): mesh_shape ordered from the least to the most communication-heavy axis; the last axis
    gets the best interconnect. devices: per-rank descriptions to lay out instead of the job's
    (default: device_descriptions(), a collective when a process group is initialized, so every
    rank must call this then; they all get the same layout).

    Raises ValueError for device_type other than "tpu" and as rank_layout does (e.g. a mesh_shape
    whose product is not the number of ranks, or of devices when no process group is initialized).
    Warns (once) and uses rank order where the devices report no coordinates (the CPU plugin).
    """
    _check_device_type(device_type)
    _check_args(mesh_shape, topology, dcn_mesh_shape)  # bad arguments fail before any collective
    if devices is None:
        devices = device_descriptions()
    return rank_layout(devices, mesh_shape, topology=topology, dcn_mesh_shape=dcn_mesh_shape)


def topology_aware_device_mesh(device_type: str, mesh_shape, *, mesh_dim_names: Sequence[str] | None = None,
                               topology: str = "single_slice", dcn_mesh_shape=None):
    """A torch.distributed DeviceMesh over every rank, laid out by topology_aware_mesh (same
    arguments), with `mesh_dim_names` (one name per mesh axis) if given. A collective: every rank of
    the initialized default process group must call it with the same arguments.

    Raises RuntimeError when no process group is initialized (init_process_group("tpu_dist")
    first); ValueError as topology_aware_mesh does, or for mesh_dim_names of the wrong length.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    _check_device_type(device_type)
    shape, dcn = _check_args(mesh_shape, topology, dcn_mesh_shape)
    if mesh_dim_names is not None:
        mesh_dim_names = tuple(mesh_dim_names)
        if len(mesh_dim_names) != len(shape):
            raise ValueError(f"mesh_dim_names {mesh_dim_names} must name each of the {len(shape)} mesh axes")
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("topology_aware_device_mesh needs an initialized process group: call "
                           "torch.distributed.init_process_group('tpu_dist') first")
    layout = topology_aware_mesh(device_type, shape, topology=topology, dcn_mesh_shape=dcn_mesh_shape)
    return DeviceMesh(device_type, layout, mesh_dim_names=mesh_dim_names)
