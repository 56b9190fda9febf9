"""torch_tpu.distributed's topology-aware mesh on synthetic TPU topologies (no TPU needed).

Each synthetic job is a grid of devices described as the PJRT plugin would ("coords", "core_on_chip",
"slice_index"), handed to the ranks in a shuffled order, so that rank order says nothing about
where a device sits. The layout must hold every rank once and put neighbours along each mesh axis
on neighbouring devices (one ICI hop: one coordinate, or the core on the chip, differs by 1, or by
the ring's wrap-around on a torus axis).
"""
import itertools
import random
import warnings

import pytest
import torch

from torch_tpu.distributed import mesh as tm
from torch_tpu.distributed import topology_aware_device_mesh, topology_aware_mesh


def _grid(extents, cores=1, seed=0, slice_index=None):
    devs = []
    for c in itertools.product(*(range(e) for e in extents)):
        for core in range(cores):
            d = {"coords": list(c), "core_on_chip": core}
            if slice_index is not None:
                d["slice_index"] = slice_index
            devs.append(d)
    random.Random(seed).shuffle(devs)
    return devs


def _point(d):
    return tuple(d["coords"]) + (d.get("core_on_chip", 0),)


def _hop(a, b, torus=()):
    """True when devices a and b are one ICI hop apart (torus: the extents of wrapping axes)."""
    if a.get("slice_index") != b.get("slice_index"):
        return False
    diff = [abs(x - y) for x, y in zip(_point(a), _point(b))]
    moved = [k for k, v in enumerate(diff) if v]
    if len(moved) != 1:
        return False
    k = moved[0]
    return diff[k] == 1 or (k < len(torus) and torus[k] > 2 and diff[k] == torus[k] - 1)


def _lines(layout, axis):
    """Every line of the layout along `axis` (the other indices fixed), as lists of ranks."""
    moved = layout.movedim(axis, -1)
    return moved.reshape(-1, moved.shape[-1]).tolist()


def _check(layout, devs, shape, adjacent_axes=None, rings=(), torus=()):
    """layout: a permutation of the ranks shaped `shape`; along each of `adjacent_axes` (default
    all) consecutive ranks are neighbours, and along `rings` the last and first are too."""
    assert layout.dtype == torch.int64 and tuple(layout.shape) == tuple(shape)
    assert sorted(layout.flatten().tolist()) == list(range(len(devs)))
    axes = range(len(shape)) if adjacent_axes is None else adjacent_axes
    for axis in axes:
        for line in _lines(layout, axis):
            for r, s in zip(line, line[1:]):
                assert _hop(devs[r], devs[s], torus), (axis, _point(devs[r]), _point(devs[s]), layout)
    for axis in rings:
        for line in _lines(layout, axis):
            if len(line) > 2:
                assert _hop(devs[line[-1]], devs[line[0]], torus), (axis, "ring", layout)


# ------------------------------------------------------------------------------------------------
# Single slice


@pytest.mark.parametrize("shape, adjacent, rings", [
    ((4, 4), None, ()),
    ((16,), None, (0,)),       # the 4x4 grid walked as a closed ring
    ((1, 16), None, (1,)),
    ((2, 8), (1,), (1,)),      # 8 = x by half of y, a closed 2x4 ring; the 2 steps over that half
    ((2, 2, 4), (1, 2), ()),
])
def test_v5e_4x4(shape, adjacent, rings):
    devs = _grid((4, 4, 1))
    _check(topology_aware_mesh("tpu", shape, devices=devs), devs, shape, adjacent, rings)


@pytest.mark.parametrize("shape, rings", [((2, 4), ()), ((4, 2), ()), ((8,), (0,))])
def test_v5e_2x4(shape, rings):
    devs = _grid((2, 4, 1), seed=1)
    _check(tm.rank_layout(devs, shape), devs, shape, rings=rings)


@pytest.mark.parametrize("shape, adjacent, rings", [
    ((4, 4), None, (1,)), ((2, 8), None, (1,)), ((16,), None, (0,)),
    ((2, 2, 4), (1, 2), ()),  # z split 2x2 without a wrap link: the first axis steps 0->3 or 1->2
])
def test_v4_2x2x4(shape, adjacent, rings):
    devs = _grid((2, 2, 4), seed=2)
    _check(tm.rank_layout(devs, shape), devs, shape, adjacent, rings)


# (2, 32): 32 = x, y and half of z; the 2 takes z's other half, one hop over the wrap or inside.
@pytest.mark.parametrize("shape", [(16, 4), (4, 16), (4, 4, 4), (64,), (2, 32)])
def test_v4_4x4x4_torus_every_axis_is_a_ring(shape):
    devs = _grid((4, 4, 4), seed=3)
    layout = tm.rank_layout(devs, shape)
    _check(layout, devs, shape, rings=[a for a, s in enumerate(shape) if s > 2], torus=(4, 4, 4))


def test_highest_traffic_axis_spans_the_most_links():
    # On 2x2x4 a mesh (4, 4)'s last axis takes the 2x2 plane (two physical axes), the first the z line.
    devs = _grid((2, 2, 4), seed=4)
    layout = tm.rank_layout(devs, (4, 4))
    for line in _lines(layout, 1):
        assert len({devs[r]["coords"][2] for r in line}) == 1          # z fixed along the last axis
    for line in _lines(layout, 0):
        assert len({tuple(devs[r]["coords"][:2]) for r in line}) == 1  # x, y fixed along the first


def test_cores_on_a_chip_are_neighbours():
    devs = _grid((2, 2, 1), cores=2, seed=5)  # TPU v3-like: two cores per chip
    for shape, rings in [((2, 4), (1,)), ((8,), (0,)), ((4, 2), ())]:
        _check(tm.rank_layout(devs, shape), devs, shape, rings=rings)
    # On a tie the last axis takes the cores of each chip (the fastest link).
    layout = tm.rank_layout(devs, (4, 2))
    for a, b in _lines(layout, 1):
        assert devs[a]["coords"] == devs[b]["coords"]


def test_offset_coordinates_and_one_device():
    devs = [dict(d, coords=[d["coords"][0] + 4, d["coords"][1] + 8, 2]) for d in _grid((2, 2, 1), seed=6)]
    _check(tm.rank_layout(devs, (2, 2)), devs, (2, 2))
    assert tm.rank_layout([{"coords": [0, 0, 0]}], (1, 1)).tolist() == [[0]]


def test_rings_and_snakes_visit_every_point_one_step_apart():
    for dims in [(4,), (2, 2), (4, 4), (3, 4), (3, 3), (2, 3, 5), (2, 2, 2), (3, 5), (5, 3, 3)]:
        has_cycle = len(dims) > 1 and any(d % 2 == 0 for d in dims)
        for walk, closed in [(tm._snake(dims), False), (tm._ring(dims), has_cycle)]:
            assert sorted(walk) == sorted(itertools.product(*(range(d) for d in dims))), dims
            pairs = list(zip(walk, walk[1:])) + ([(walk[-1], walk[0])] if closed else [])
            for a, b in pairs:
                assert sum(abs(x - y) for x, y in zip(a, b)) == 1, (dims, a, b)


# ------------------------------------------------------------------------------------------------
# Multi-slice


def _slices(n, extents, first_index=0):
    devs = [d for s in range(n) for d in _grid(extents, seed=10 + s, slice_index=first_index + 3 * s)]
    random.Random(7).shuffle(devs)
    return devs


@pytest.mark.parametrize("mesh_shape, dcn, full", [((2, 4), (2, 1), (4, 4)), ((2, 4), (1, 2), (2, 8)),
                                                   ((2, 2), (2, 2), (4, 4))])
def test_multi_slice_blocks_follow_slice_index(mesh_shape, dcn, full):
    n = dcn[0] * dcn[1]
    devs = _slices(n, (2, 4, 1) if mesh_shape == (2, 4) else (2, 2, 1), first_index=5)
    layout = topology_aware_mesh("tpu", mesh_shape, topology="multi_slice", dcn_mesh_shape=dcn, devices=devs)
    assert tuple(layout.shape) == full
    assert sorted(layout.flatten().tolist()) == list(range(len(devs)))
    indices = sorted({d["slice_index"] for d in devs})
    for s, (i, j) in enumerate(itertools.product(range(dcn[0]), range(dcn[1]))):
        block = layout[i * mesh_shape[0]:(i + 1) * mesh_shape[0], j * mesh_shape[1]:(j + 1) * mesh_shape[1]]
        assert {devs[r]["slice_index"] for r in block.flatten().tolist()} == {indices[s]}  # row-major DCN
        for axis in range(2):  # within a slice, neighbours along both axes are one hop apart
            for line in _lines(block, axis):
                for r, t in zip(line, line[1:]):
                    assert _hop(devs[r], devs[t])


def test_multi_slice_without_slice_index_takes_rank_blocks(monkeypatch):
    monkeypatch.setattr(tm, "_warned", set())
    devs = _grid((2, 2, 1), seed=8) + _grid((2, 2, 1), seed=9)  # two slices, each with its own coordinates
    with pytest.warns(UserWarning, match="no slice_index"):
        layout = tm.rank_layout(devs, (2, 2), topology="multi_slice", dcn_mesh_shape=(2, 1))
    assert sorted(layout[:2].flatten().tolist()) == [0, 1, 2, 3]
    assert sorted(layout[2:].flatten().tolist()) == [4, 5, 6, 7]


# ------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("kwargs, match", [
    (dict(mesh_shape=(4, 3)), "holds 12 devices, but there are 16"),
    (dict(mesh_shape=(32,)), "holds 32 devices, but there are 16"),
    (dict(mesh_shape=(4, 0)), "positive ints"),
    (dict(mesh_shape=()), "positive ints"),
    (dict(mesh_shape=(4.0, 4)), "positive ints"),
    (dict(mesh_shape="44"), "positive ints"),
    (dict(mesh_shape=(True, 16)), "positive ints"),
    (dict(mesh_shape=(4, 4), topology="torus"), "unknown topology 'torus'"),
    (dict(mesh_shape=(4, 4), topology="multi_slice"), "needs dcn_mesh_shape"),
    (dict(mesh_shape=(4, 4), dcn_mesh_shape=(2, 1)), "pass topology='multi_slice'"),
    (dict(mesh_shape=(4, 4), dcn_mesh_shape=(1,)), "one entry per mesh axis"),
    (dict(mesh_shape=(2, 4), topology="multi_slice", dcn_mesh_shape=(2, -1)), "positive ints"),
    (dict(mesh_shape=(2, 4), topology="multi_slice", dcn_mesh_shape=(2, 2)), "holds 32 devices"),
])
def test_bad_arguments_raise_value_error(kwargs, match):
    devs = _grid((4, 4, 1))
    with pytest.raises(ValueError, match=match):
        topology_aware_mesh("tpu", devices=devs, **kwargs)


def test_bad_slices_raise_value_error():
    two = _slices(2, (2, 2, 1))
    with pytest.raises(ValueError, match="span 2 slices"):
        tm.rank_layout(two, (8,))
    with pytest.raises(ValueError, match="asks for 1 slices, but the devices form 2"):
        tm.rank_layout(two, (8,), topology="multi_slice", dcn_mesh_shape=(1,))
    uneven = [dict(d, slice_index=0 if i < 3 else 1) for i, d in enumerate(_grid((2, 4, 1)))]
    with pytest.raises(ValueError, match="has 3 devices; mesh_shape \\(4,\\) needs 4"):
        tm.rank_layout(uneven, (4,), topology="multi_slice", dcn_mesh_shape=(2,))
    partial = [dict(d, slice_index=0) if i else d for i, d in enumerate(_grid((2, 2, 1)))]
    with pytest.raises(ValueError, match="only 3 of 4 devices report a slice_index"):
        tm.rank_layout(partial, (4,))


def test_bad_device_type_and_names():
    with pytest.raises(ValueError, match="device_type must be 'tpu'"):
        topology_aware_mesh("cuda", (2,), devices=_grid((2, 1, 1)))
    with pytest.raises(ValueError, match="mesh_dim_names"):
        topology_aware_device_mesh("tpu", (2, 1), mesh_dim_names=("dp",))


def test_device_mesh_needs_a_process_group():
    import torch.distributed as dist
    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    with pytest.raises(RuntimeError, match="initialized process group"):
        topology_aware_device_mesh("tpu", (torch.tpu.device_count(),))


# ------------------------------------------------------------------------------------------------
# No coordinates: rank order, said once


def test_cpu_plugin_falls_back_to_rank_order_with_one_warning(monkeypatch):
    props = torch.tpu.get_device_properties()
    if props.platform != "cpu":
        pytest.skip("the CPU plugin's behaviour")
    assert props.attributes == {}  # the CPU plugin reports no coordinates
    monkeypatch.setattr(tm, "_warned", set())
    n = torch.tpu.device_count()
    descs = tm.device_descriptions()
    assert len(descs) == n and [d["id"] for d in descs] == [torch.tpu.get_device_properties(i).id for i in range(n)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = topology_aware_mesh("tpu", (n,))
        second = topology_aware_mesh("tpu", (1, n))
    assert first.tolist() == list(range(n)) and second.tolist() == [list(range(n))]
    said = [w for w in caught if "no physical coordinates" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]
    with pytest.raises(ValueError, match=f"there are {n}"):
        topology_aware_mesh("tpu", (n + 1,))


def test_unusable_coordinates_fall_back_to_rank_order(monkeypatch):
    monkeypatch.setattr(tm, "_warned", set())
    holes = [{"coords": [x, 0, 0]} for x in (0, 1, 2, 4)]   # not a box
    twice = [{"coords": [0, 0, 0]}, {"coords": [0, 0, 0]}]  # the same place twice
    some = [{"coords": [1, 0, 0]}, {}]                       # coordinates on one device only
    with pytest.warns(UserWarning, match="do not form a full box"):
        assert tm.rank_layout(holes, (2, 2)).tolist() == [[0, 1], [2, 3]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once already
        assert tm.rank_layout(twice, (2,)).tolist() == [0, 1]
        assert tm.rank_layout(some, (2,)).tolist() == [0, 1]


def test_integer_likes_are_shapes():
    devs = _grid((2, 4, 1))
    expect = tm.rank_layout(devs, (2, 4))
    assert torch.equal(tm.rank_layout(devs, torch.Size([2, 4])), expect)
    import numpy as np
    assert torch.equal(tm.rank_layout(devs, np.array([2, 4])), expect)
