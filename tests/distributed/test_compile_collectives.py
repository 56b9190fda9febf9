"""Functional collectives inside torch.compile(backend="tpu") graphs on tpu_dist (what DTensor and
FSDP2 emit under compile). One process per device on the CPU plugin: the graph is cut at its
collectives, its compute compiled, its collectives run by the backend. Ranks as threads with
tpu_dist's device path (what a TPU VM's processes run): the graph is one program over the ranks'
devices. Nothing falls back to eager; the numbers are the same."""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import torch_tpu

from .runner import run_world, scenario
from .threads import run_threads

pytestmark = pytest.mark.multiprocess  # every test here starts processes


def _functional_collectives_steps():
    import torch.distributed._functional_collectives as funcol
    r, n = dist.get_rank(), dist.get_world_size()

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


def functional_collectives_in_a_graph():
    torch_tpu.metrics.reset()
    _functional_collectives_steps()
    counters = torch_tpu.metrics.counters()
    assert counters.get("graph_eager_fallbacks", 0) == 0
    assert counters.get("compiled_graphs", 0) == 3  # x*2 | all_reduce | sin | all_gather | matmul..., reduce_scatter


def _tensor_parallel_step():
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
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    out = compiled(x.to("tpu"))
    out.sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(out.cpu(), ref(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model[0].weight.grad.full_tensor().cpu(), ref[0].weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model[2].weight.grad.full_tensor().cpu(), ref[2].weight.grad, rtol=1e-5, atol=1e-5)


def tensor_parallel_under_compile():
    torch_tpu.metrics.reset()
    _tensor_parallel_step()
    assert torch_tpu.metrics.counters().get("graph_eager_fallbacks", 0) == 0


@pytest.mark.slow
def test_functional_collectives_in_a_compiled_graph(tmp_path):
    run_world(2, scenario(functional_collectives_in_a_graph), tmp_path, timeout=180)


@pytest.mark.slow
def test_tensor_parallel_module_under_compile(tmp_path):
    run_world(2, scenario(tensor_parallel_under_compile), tmp_path, timeout=180)


def test_a_graph_with_collectives_is_one_program_over_the_ranks_devices():
    counters = run_threads(2, scenario(_functional_collectives_steps))
    # One program per rank's graph (Dynamo compiles the function once per device), nothing cut.
    assert counters.get("compiled_graphs") == 2, counters
    assert counters.get("graph_eager_fallbacks", 0) == 0


def _gather_forward_scatter_backward():
    # all_gather_tensor_autograd: its backward is a reduce_scatter, in the compiled backward graph.
    import torch.distributed._functional_collectives as funcol
    r, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(r)
    x, w = torch.randn(2, 3, generator=g), torch.randn(3, 4, generator=torch.Generator().manual_seed(7))
    xt, wt = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()

    @torch.compile(backend="tpu", fullgraph=True)
    def loss_of(x, w):
        return funcol.all_gather_tensor_autograd(x @ w, 0, dist.group.WORLD).square().sum()
    # The backward graph compiled with the forward, on this rank's thread: c10d's world is this
    # thread's when ranks are threads (the autograd engine's threads have none).
    with torch._functorch.config.patch(force_non_lazy_backward_lowering=True):
        loss = loss_of(xt, wt)
    loss.backward()
    ys = [torch.randn(2, 3, generator=torch.Generator().manual_seed(k)) @ w for k in range(n)]
    torch.testing.assert_close(loss.cpu(), sum(y.square().sum() for y in ys))
    dy = 2 * n * (x @ w)  # every rank's 2 * gathered, reduce-scattered back: row block r, summed n times
    torch.testing.assert_close(xt.grad.cpu(), dy @ w.T)
    torch.testing.assert_close(wt.grad.cpu(), x.T @ dy)


@pytest.mark.slow
def test_forward_and_backward_with_collectives_as_programs_over_the_ranks_devices():
    counters = run_threads(2, scenario(_gather_forward_scatter_backward))
    assert counters.get("compiled_graphs") == 4, counters  # per rank: forward and backward, nothing cut
    assert counters.get("graph_eager_fallbacks", 0) == 0
