"""topology_aware_device_mesh in 4 processes (runner.run_world): a 2x2 DeviceMesh whose groups
all_reduce along each mesh dimension.

The CPU plugin reports no coordinates, so one scenario stands in a TPU's: each rank's device
description is replaced by a 2x2 grid point in a scrambled order, which every rank shares through
all_gather_object; the mesh must then follow the coordinates, not rank order.
"""
import pytest
import torch
import torch.distributed as dist

from torch_tpu.distributed import mesh as tm
from torch_tpu.distributed import topology_aware_device_mesh

from .runner import run_world, scenario

pytestmark = pytest.mark.multiprocess  # every test here starts processes

# rank -> coords: ranks 0..3 sit at (1,1), (0,0), (1,0), (0,1) on a 2x2 chip grid
_COORDS = [[1, 1, 0], [0, 0, 0], [1, 0, 0], [0, 1, 0]]


def _all_reduce_along(mesh, name):
    """Each rank's sum over its group along mesh dim `name` must be the sum of the ranks in its
    line of the layout along that dim."""
    r = dist.get_rank()
    layout = mesh.mesh
    dim = mesh.mesh_dim_names.index(name)
    line = [row for row in layout.movedim(dim, -1).reshape(-1, layout.shape[dim]).tolist() if r in row][0]
    x = torch.full((3,), float(r), device="tpu")
    dist.all_reduce(x, group=mesh.get_group(name))
    assert x.cpu().tolist() == [float(sum(line))] * 3, (name, line, x.cpu().tolist())
    assert sorted(dist.get_process_group_ranks(mesh.get_group(name))) == sorted(line)


def rank_order_without_coordinates():
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mesh = topology_aware_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
    assert any("no physical coordinates" in str(w.message) for w in caught)
    assert mesh.mesh.tolist() == [[0, 1], [2, 3]]
    _all_reduce_along(mesh, "tp")
    _all_reduce_along(mesh, "dp")


def follows_gathered_coordinates():
    r = dist.get_rank()
    tm._describe = lambda index: {"id": r, "process_index": r, "coords": _COORDS[r], "core_on_chip": 0}
    mesh = topology_aware_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
    expect = tm.rank_layout([{"coords": c} for c in _COORDS], (2, 2))
    assert torch.equal(mesh.mesh, expect) and expect.tolist() != [[0, 1], [2, 3]]
    for line in expect.tolist() + expect.t().tolist():  # neighbours along both dims: one hop apart
        a, b = (_COORDS[i] for i in line)
        assert sum(abs(p - q) for p, q in zip(a, b)) == 1
    _all_reduce_along(mesh, "tp")
    _all_reduce_along(mesh, "dp")


@pytest.mark.slow
def test_rank_order_mesh_on_four_processes(tmp_path):
    run_world(4, scenario(rank_order_without_coordinates), tmp_path, timeout=180)


@pytest.mark.slow
def test_coordinate_mesh_on_four_processes(tmp_path):
    run_world(4, scenario(follows_gathered_coordinates), tmp_path, timeout=180)
