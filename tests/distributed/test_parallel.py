"""What PyTorch stacks on tpu_dist, each against single-process training with the same global batch:
DDP, FSDP2, DTensor, tensor parallelism, a 2-D (FSDP x TP) mesh, distributed checkpointing,
pipeline parallelism and MPMD programs. Every rank also trains the reference model on CPU with the
whole global batch, so each rank checks itself."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .runner import run_world, scenario

pytestmark = pytest.mark.multiprocess  # every test here starts processes

STEPS = 10


def _rank():
    return dist.get_rank(), dist.get_world_size()


def _batches(steps, n, d_in, d_out, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, d_in, generator=g), torch.randn(n, d_out, generator=g)) for _ in range(steps)]


class Net(nn.Module):
    def __init__(self, d=8, hidden=16, out=4, unused=False):
        super().__init__()
        self.a = nn.Linear(d, hidden)
        self.b = nn.Linear(hidden, hidden)
        self.c = nn.Linear(hidden, out)
        self.unused = nn.Linear(3, 3) if unused else None  # find_unused_parameters

    def forward(self, x):
        return self.c(torch.tanh(self.b(F.gelu(self.a(x)))))


def _close(a, b, what, tol=1e-5):
    a = a.full_tensor() if hasattr(a, "full_tensor") else a
    torch.testing.assert_close(a.detach().cpu().float(), b.detach().float(), rtol=tol, atol=tol,
                               msg=lambda m: f"{what}: {m}")


def _train_data_parallel(model, ref, dp_rank, dp_size, what, per=4, tol=1e-5):
    """STEPS AdamW steps of `model` on its data-parallel share of each global batch, and of `ref` (on
    CPU) on the whole batch; then their parameters must agree."""
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    ropt = torch.optim.AdamW(ref.parameters(), lr=0.01)
    for x, y in _batches(STEPS, per * dp_size, 8, 4):
        mine = slice(dp_rank * per, (dp_rank + 1) * per)
        F.mse_loss(model(x[mine].to("tpu")), y[mine].to("tpu")).backward()
        opt.step()
        opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ropt.step()
        ropt.zero_grad()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        _close(p, q, f"{what} parameter {name}", tol=tol)


def ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP
    r, n = _rank()
    torch.manual_seed(0)
    ref = Net(unused=True)
    model = Net(unused=True)
    model.load_state_dict(ref.state_dict())
    # Small buckets: several buckets per step, each a view of DDP's flat gradient buffer.
    ddp = DDP(model.to("tpu"), bucket_cap_mb=0.0005, find_unused_parameters=True)
    opt = torch.optim.AdamW(ddp.parameters(), lr=0.01)
    ropt = torch.optim.AdamW(ref.parameters(), lr=0.01)
    per = 4
    for step, (x, y) in enumerate(_batches(STEPS, per * n, 8, 4)):
        mine = slice(r * per, (r + 1) * per)
        if step % 3 == 1:
            # no_sync: accumulate a half-batch without communication, then a synced half.
            half = per // 2
            with ddp.no_sync():
                F.mse_loss(ddp(x[mine][:half].to("tpu")), y[mine][:half].to("tpu")).mul(0.5).backward()
            F.mse_loss(ddp(x[mine][half:].to("tpu")), y[mine][half:].to("tpu")).mul(0.5).backward()
        else:
            F.mse_loss(ddp(x[mine].to("tpu")), y[mine].to("tpu")).backward()
        opt.step()
        opt.zero_grad()
        if step % 3 == 1:
            # the same gradient: mean over ranks of the mean of two half-batch means
            loss = sum(F.mse_loss(ref(x[k * per:(k + 1) * per][h]), y[k * per:(k + 1) * per][h]) * 0.5
                       for k in range(n) for h in (slice(0, per // 2), slice(per // 2, per))) / n
        else:
            loss = F.mse_loss(ref(x), y)
        loss.backward()
        ropt.step()
        ropt.zero_grad()
    for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
        _close(p, q, f"DDP parameter {name} after {STEPS} steps")
    # DDP's runtime statistics are measured on tpu too (a registered c10d timer), in ns.
    stats = ddp._get_ddp_logging_data()
    assert stats["avg_forward_compute_time"] > 0 and stats["avg_backward_compute_time"] > 0, stats


def fsdp2():
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    r, n = _rank()
    torch.manual_seed(0)
    ref = Net()
    # Built on the meta device, materialized on tpu, then loaded (the large-model recipe).
    with torch.device("meta"):
        model = Net()
    for layer in (model.a, model.b, model.c):
        fully_shard(layer)
    fully_shard(model)
    model.to_empty(device="tpu")
    set_model_state_dict(model, ref.state_dict(), options=StateDictOptions(full_state_dict=True))
    assert all(p.device.type == "tpu" for p in model.parameters())
    _train_data_parallel(model, ref, r, n, "FSDP2")
    per = 4
    # bf16 parameters for compute, fp32 gradient reduction: close to the fp32 reference.
    torch.manual_seed(0)
    ref = Net()
    mp = Net().to("tpu")
    mp.load_state_dict(ref.state_dict())
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in (mp.a, mp.b, mp.c):
        fully_shard(layer, mp_policy=policy)
    fully_shard(mp, mp_policy=policy)
    x, y = _batches(1, per * n, 8, 4, seed=7)[0]
    out = mp(x[r * per:(r + 1) * per].to("tpu"))
    assert out.dtype == torch.bfloat16
    F.mse_loss(out.float(), y[r * per:(r + 1) * per].to("tpu")).backward()
    F.mse_loss(ref(x), y).backward()
    for (name, p), q in zip(mp.named_parameters(), ref.parameters()):
        assert p.grad.dtype == torch.float32
        _close(p.grad, q.grad, f"FSDP2 bf16 gradient {name}", tol=3e-2)


def dtensor_and_tensor_parallel():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)
    r, n = _rank()
    mesh = init_device_mesh("tpu", (n,))
    torch.manual_seed(0)
    a, b = torch.randn(4, 6), torch.randn(6, 3)
    da = distribute_tensor(a.to("tpu"), mesh, [Shard(0)])
    db = distribute_tensor(b.to("tpu"), mesh, [Replicate()])
    assert da.to_local().shape == (4 // n, 6) and da.to_local().device.type == "tpu"
    _close((da @ db).redistribute(mesh, [Replicate()]).to_local(), a @ b, "DTensor matmul")
    _close(da.sum(), a.sum(), "DTensor sum (Partial -> Replicate)")
    _close(distribute_tensor(a.to("tpu"), mesh, [Shard(1)]).redistribute(mesh, [Shard(0)]), a, "Shard(1)->Shard(0)")
    part = DTensor.from_local(torch.full((2,), float(r + 1), device="tpu"), mesh, [Partial()])
    _close(part.redistribute(mesh, [Replicate()]).to_local(), torch.full((2,), float(sum(range(1, n + 1)))),
           "Partial -> Replicate")
    _close(torch.nn.functional.gelu(da) * 2 + da, F.gelu(a) * 2 + a, "elementwise ops on a DTensor")

    # Tensor parallelism: an MLP with column- then row-wise Linear layers, and a sequence-parallel
    # LayerNorm before it, trained STEPS steps against the same model on CPU.
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(8)
            self.up = nn.Linear(8, 16)
            self.down = nn.Linear(16, 8)

        def forward(self, x):
            return self.down(F.relu(self.up(self.norm(x))))

    torch.manual_seed(0)
    ref = Block()
    model = Block()
    model.load_state_dict(ref.state_dict())
    model = parallelize_module(model.to("tpu"), mesh, {
        "norm": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1)),
    })
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        x = torch.randn(2, 4 * n, 8, generator=g)  # (batch, sequence, features): sequence sharded
        local = x[:, r * 4:(r + 1) * 4].to("tpu")
        out = model(local)
        out = out.to_local() if isinstance(out, DTensor) else out
        # This rank's part of the sequence; TP sums the parts' gradients.
        ((out ** 2).sum() / x.numel()).backward()
        opt.step()
        opt.zero_grad()
        ((ref(x) ** 2).sum() / x.numel()).backward()
        ropt.step()
        ropt.zero_grad()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        _close(p, q, f"TP parameter {name}", tol=1e-4)


def fsdp_x_tp():
    """A 2-D mesh on 4 processes: FSDP2 over "dp", tensor parallelism over "tp"."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    r, n = _rank()
    mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh["dp"].get_local_rank()
    torch.manual_seed(0)
    ref = Net()
    model = Net().to("tpu")
    model.load_state_dict(ref.state_dict())
    parallelize_module(model, mesh["tp"], {"a": ColwiseParallel(), "b": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    _train_data_parallel(model, ref, dp, 2, "FSDP x TP", tol=1e-4)


def _fsdp_model_and_optimizer():
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = Net().to("tpu")
    for layer in (model.a, model.b, model.c):
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def _probe():
    return torch.randn(5, 8, generator=torch.Generator().manual_seed(11))


def checkpoint_save():
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    r, n = _rank()
    model, opt = _fsdp_model_and_optimizer()
    for x, y in _batches(3, 4 * n, 8, 4):
        F.mse_loss(model(x[r * 4:(r + 1) * 4].to("tpu")), y[r * 4:(r + 1) * 4].to("tpu")).backward()
        opt.step()
        opt.zero_grad()
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.environ["CKPT"])
    torch.save(model(_probe().to("tpu")).detach().cpu(), os.environ["CKPT"] + f".out{r}")
    # One more step after saving: the resumed job must match this.
    x, y = _batches(1, 4 * n, 8, 4, seed=5)[0]
    F.mse_loss(model(x[r * 4:(r + 1) * 4].to("tpu")), y[r * 4:(r + 1) * 4].to("tpu")).backward()
    opt.step()
    torch.save(model(_probe().to("tpu")).detach().cpu(), os.environ["CKPT"] + f".next{r}")


def checkpoint_load():
    """A fresh job: a new model and optimizer, loaded from the checkpoint, give the saved job's
    outputs, and one more step gives the same as the saved job's next step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    r, n = _rank()
    model, opt = _fsdp_model_and_optimizer()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # nothing of the fresh init survives
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=os.environ["CKPT"])
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    torch.testing.assert_close(model(_probe().to("tpu")).detach().cpu(), torch.load(os.environ["CKPT"] + f".out{r}"))
    x, y = _batches(1, 4 * n, 8, 4, seed=5)[0]
    F.mse_loss(model(x[r * 4:(r + 1) * 4].to("tpu")), y[r * 4:(r + 1) * 4].to("tpu")).backward()
    opt.step()
    torch.testing.assert_close(model(_probe().to("tpu")).detach().cpu(),
                               torch.load(os.environ["CKPT"] + f".next{r}"), rtol=1e-6, atol=1e-6)


def pipeline_and_mpmd():
    """MPMD: each rank runs a different program. A two-stage GPipe pipeline (different modules per
    rank, activations and gradients sent between stages), then a rank-0-only evaluation with other
    shapes, then a different torch.compile graph per rank, then a collective that all ranks join."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    r, n = _rank()
    torch.manual_seed(0)
    ref_stages = [nn.Sequential(nn.Linear(8, 16), nn.Tanh()), nn.Sequential(nn.Linear(16, 4))]
    stage_mod = nn.Sequential(*[nn.Linear(m.in_features, m.out_features) if isinstance(m, nn.Linear) else m
                                for m in ref_stages[r]])
    stage_mod.load_state_dict(ref_stages[r].state_dict())
    stage_mod.to("tpu")
    ref = nn.Sequential(*ref_stages)
    stage = PipelineStage(stage_mod, r, n, torch.device("tpu"))
    loss_fn = lambda out, target: F.mse_loss(out, target)  # noqa: E731
    sched = ScheduleGPipe(stage, n_microbatches=2, loss_fn=loss_fn)
    opt = torch.optim.SGD(stage_mod.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for x, y in _batches(STEPS, 4, 8, 4):
        if r == 0:
            sched.step(x.to("tpu"))
        else:
            losses = []
            sched.step(target=y.to("tpu"), losses=losses)
        opt.step()
        opt.zero_grad()
        # The schedule scales gradients by the microbatch count (scale_grads=True): the mean.
        (sum(loss_fn(ref(x[k * 2:(k + 1) * 2]), y[k * 2:(k + 1) * 2]) for k in range(2)) / 2).backward()
        ropt.step()
        ropt.zero_grad()
    for (name, p), q in zip(stage_mod.named_parameters(), ref_stages[r].parameters()):
        _close(p, q, f"pipeline stage {r} parameter {name}", tol=1e-5)
    # Rank 0 alone evaluates with other shapes while rank 1 waits at a collective.
    if r == 0:
        with torch.no_grad():
            ev = stage_mod(torch.randn(7, 8).to("tpu")).sum().item()
        assert ev == ev
    # Each rank compiles a different graph.
    f = torch.compile((lambda t: torch.sin(t) * 2) if r == 0 else (lambda t: t.cumsum(0) - 1), backend="tpu")
    got = f(torch.arange(4.0, device="tpu")).cpu()
    want = torch.sin(torch.arange(4.0)) * 2 if r == 0 else torch.arange(4.0).cumsum(0) - 1
    torch.testing.assert_close(got, want)
    total = torch.tensor([float(r + 1)], device="tpu")
    dist.all_reduce(total)
    assert total.item() == float(n * (n + 1) // 2)


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.slow
def test_ddp_matches_single_process(tmp_path, mode):
    run_world(2, scenario(ddp), tmp_path, env={"TORCH_TPU_EAGER_MODE": mode}, timeout=180)


@pytest.mark.slow
def test_fsdp2_meta_init_and_mixed_precision(tmp_path):
    run_world(2, scenario(fsdp2), tmp_path, timeout=180)


@pytest.mark.slow
def test_dtensor_and_tensor_parallel(tmp_path):
    run_world(2, scenario(dtensor_and_tensor_parallel), tmp_path, timeout=180)


@pytest.mark.slow
def test_fsdp_x_tp_on_a_2d_mesh(tmp_path):
    run_world(4, scenario(fsdp_x_tp), tmp_path, timeout=240)


@pytest.mark.slow
def test_checkpoint_save_then_load_in_a_fresh_job(tmp_path):
    env = {"CKPT": str(tmp_path / "ckpt")}
    save, load = tmp_path / "save", tmp_path / "load"
    save.mkdir()
    load.mkdir()
    run_world(2, scenario(checkpoint_save), save, env=env, timeout=180)
    run_world(2, scenario(checkpoint_load), load, env=env, timeout=180)


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.slow
def test_pipeline_and_mpmd(tmp_path, mode):
    run_world(2, scenario(pipeline_and_mpmd), tmp_path, env={"TORCH_TPU_EAGER_MODE": mode}, timeout=180)
