"""Functional collectives inside torch.compile(backend="tpu") graphs on tpu_dist (what DTensor and
FSDP2 emit under compile): the graph is cut at its collectives on the CPU plugin, its compute
compiled, its collectives run by the backend; nothing falls back to eager."""
import torch
import torch.distributed as dist
import torch.nn as nn

import torch_tpu

from .runner import run_world, scenario


def functional_collectives_in_a_graph():
    import torch.distributed._functional_collectives as funcol
    r, n = dist.get_rank(), dist.get_world_size()
    torch_tpu.metrics.reset()

    @torch.compile(backend="tpu", fullgraph=True)
    def f(x, w):
        y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
        z = funcol.all_gather_tensor(y.sin(), 0, dist.group.WORLD)
        s = funcol.reduce_scatter_tensor(z, "sum", 0, dist.group.WORLD)
        return (z @ w).relu() + 1, s

    w = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    for step in range(2):  # the second call reuses the compiled segments
        x = torch.full((2, 3), float(r + 1 + step), device="tpu")
        out, s = f(x, w.to("tpu"))
        y = torch.full((2, 3), 2.0 * sum(range(1 + step, n + 1 + step)))
        z = torch.cat([y.sin()] * n)
        torch.testing.assert_close(out.cpu(), (z @ w).relu() + 1)
        torch.testing.assert_close(s.cpu(), z[r * 2:(r + 1) * 2] * n)  # every rank's z, summed, row-block r
    counters = torch_tpu.metrics.counters()
    assert counters.get("graph_eager_fallbacks", 0) == 0
    assert counters.get("compiled_graphs", 0) == 3  # x*2 | all_reduce | sin | all_gather | matmul..., reduce_scatter


def tensor_parallel_under_compile():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    r, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("tpu", (n,))
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    model.load_state_dict(ref.state_dict())
    parallelize_module(model.to("tpu"), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    compiled = torch.compile(model, backend="tpu")
    torch_tpu.metrics.reset()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    out = compiled(x.to("tpu"))
    out.sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(out.cpu(), ref(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model[0].weight.grad.full_tensor().cpu(), ref[0].weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model[2].weight.grad.full_tensor().cpu(), ref[2].weight.grad, rtol=1e-5, atol=1e-5)
    assert torch_tpu.metrics.counters().get("graph_eager_fallbacks", 0) == 0


def test_functional_collectives_in_a_compiled_graph(tmp_path):
    run_world(2, scenario(functional_collectives_in_a_graph), tmp_path, timeout=180)


def test_tensor_parallel_module_under_compile(tmp_path):
    run_world(2, scenario(tensor_parallel_under_compile), tmp_path, timeout=180)
