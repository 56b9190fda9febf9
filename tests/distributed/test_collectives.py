"""tpu_dist's collectives against Gloo on CPU tensors (the reference), in 2 processes.

Each scenario runs in every rank (runner.run_world) with tpu_dist as the default group and a Gloo
group beside it; each collective is made on tpu tensors through tpu_dist and on CPU copies through
Gloo, and the results must be equal (bitwise: both run the same Gloo reduction on the same values).
"""
import os

import pytest
import torch
import torch.distributed as dist

from .runner import run_world, scenario

pytestmark = pytest.mark.multiprocess  # every test here starts processes

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32, torch.int64, torch.uint8,
          torch.bool]
FLOAT_OPS = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
INT_OPS = FLOAT_OPS + [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]


def _value(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(0, 7, shape, generator=g).to(dtype)


def _layouts(dtype, seed):
    """(name, cpu tensor, tpu tensor): 0-dim, empty, 2-D, and a non-contiguous column view of a
    bigger tpu tensor (the base must show the write too)."""
    out = [("0-dim", _value((), dtype, seed)), ("empty", _value((0,), dtype, seed)),
           ("2-D", _value((3, 5), dtype, seed))]
    out = [(n, c, c.to("tpu")) for n, c in out]
    base = _value((4, 6), dtype, seed + 100)
    out.append(("column view", base[:, 2].clone(), base.to("tpu")[:, 2]))
    return out


def _same(a, b, what):
    a = a.cpu()
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    assert torch.equal(a, b), f"{what}: tpu_dist {a} != gloo {b}"


def _rank():
    return dist.get_rank(), dist.get_world_size()


def all_reduce_every_dtype_and_op():
    gloo = dist.new_group(backend="gloo")
    r, n = _rank()
    for dtype in DTYPES:
        ops = INT_OPS if not (dtype.is_floating_point or dtype.is_complex) else FLOAT_OPS
        if dtype == torch.bool:
            ops = [dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.BAND, dist.ReduceOp.BOR]
        for op in ops:
            for name, cpu, tpu in _layouts(dtype, seed=r):
                base = tpu._base
                expect_base = base.cpu() if base is not None else None
                dist.all_reduce(cpu, op=op, group=gloo)
                dist.all_reduce(tpu, op=op)
                _same(tpu, cpu, f"all_reduce {op} {dtype} {name}")
                if base is not None:  # the rest of the base is untouched; the column is the result
                    expect_base[:, 2] = cpu
                    _same(base, expect_base, f"all_reduce {op} {dtype} {name} (base)")


def all_reduce_avg_and_async():
    gloo = dist.new_group(backend="gloo")
    r, n = _rank()
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        cpu = _value((7,), dtype, r)
        tpu = cpu.to("tpu")
        dist.all_reduce(cpu, group=gloo)
        cpu = cpu / n if dtype.is_floating_point else torch.div(cpu, n, rounding_mode="trunc")
        dist.all_reduce(tpu, op=dist.ReduceOp.AVG)
        _same(tpu, cpu.to(dtype), f"all_reduce AVG {dtype}")
    # async_op: Work.wait / is_completed / get_future; the future's value is the tpu tensors.
    x = torch.full((3,), float(r + 1), device="tpu")
    work = dist.all_reduce(x, async_op=True)
    fut = work.get_future()
    assert work.wait()
    assert work.is_completed() and work.is_success()
    got = fut.wait()
    assert got[0] is x or torch.equal(got[0].cpu(), x.cpu())
    assert x.cpu().tolist() == [float(n * (n + 1) // 2)] * 3
    # A chained future (DDP's comm hooks) sees the result.
    y = torch.ones(2, device="tpu")
    doubled = dist.all_reduce(y, async_op=True).get_future().then(lambda f: f.value()[0] * 2).wait()
    assert doubled.cpu().tolist() == [2.0 * n] * 2


def pending_writes_are_seen_and_results_are_seen():
    """A collective reads its inputs after every earlier (queued, in-place, through-a-view) write,
    and later ops read its results."""
    r, n = _rank()
    x = torch.zeros(4, 4, device="tpu")
    x[1].add_(r + 1)            # a pending write through a view
    x.mul_(2)                  # and an in-place op on the base
    dist.all_reduce(x)
    y = x * 1                  # a later op
    expect = torch.zeros(4, 4)
    expect[1] = 2 * sum(range(1, n + 1))
    _same(y, expect, "reads after writes")
    # A DDP-style bucket: gradient views of one flat buffer, reduced as the flat buffer.
    flat = torch.zeros(10, device="tpu")
    g1, g2 = flat[:4].view(2, 2), flat[4:]
    g1.copy_(torch.full((2, 2), float(r)))
    g2.fill_(1.0)
    dist.all_reduce(flat)
    assert g1.cpu().tolist() == [[float(sum(range(n)))] * 2] * 2
    assert g2.cpu().tolist() == [float(n)] * 6


def rooted_and_gathering_collectives():
    gloo = dist.new_group(backend="gloo")
    r, n = _rank()
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.bool):
        # broadcast
        cpu, tpu = _value((3, 2), dtype, r), None
        tpu = cpu.to("tpu")
        dist.broadcast(cpu, src=1, group=gloo)
        dist.broadcast(tpu, src=1)
        _same(tpu, cpu, f"broadcast {dtype}")
        # reduce: the root gets the sum; the others keep their tensor
        if dtype != torch.bool:
            mine = _value((5,), dtype, r)
            cpu, tpu = mine.clone(), mine.to("tpu")
            dist.reduce(cpu, dst=0, group=gloo)
            dist.reduce(tpu, dst=0)
            _same(tpu, cpu if r == 0 else mine, f"reduce {dtype}")
        # all_gather (list), all_gather_into_tensor
        mine = _value((2, 3), dtype, r)
        outs_c = [torch.empty_like(mine) for _ in range(n)]
        outs_t = [torch.empty_like(mine, device="tpu") for _ in range(n)]
        dist.all_gather(outs_c, mine, group=gloo)
        dist.all_gather(outs_t, mine.to("tpu"))
        for i in range(n):
            _same(outs_t[i], outs_c[i], f"all_gather {dtype} [{i}]")
        big_c = torch.empty((2 * n, 3), dtype=dtype)
        big_t = torch.empty((2 * n, 3), dtype=dtype, device="tpu")
        dist.all_gather_into_tensor(big_c, mine, group=gloo)
        dist.all_gather_into_tensor(big_t, mine.to("tpu"))
        _same(big_t, big_c, f"all_gather_into_tensor {dtype}")
        # gather / scatter
        gl_c = [torch.empty_like(mine) for _ in range(n)] if r == 1 else None
        gl_t = [torch.empty_like(mine, device="tpu") for _ in range(n)] if r == 1 else None
        dist.gather(mine, gl_c, dst=1, group=gloo)
        dist.gather(mine.to("tpu"), gl_t, dst=1)
        if r == 1:
            for i in range(n):
                _same(gl_t[i], gl_c[i], f"gather {dtype} [{i}]")
        pieces = [_value((4,), dtype, 50 + i) for i in range(n)]
        sc_c, sc_t = torch.empty(4, dtype=dtype), torch.empty(4, dtype=dtype, device="tpu")
        dist.scatter(sc_c, pieces if r == 0 else None, src=0, group=gloo)
        dist.scatter(sc_t, [p.to("tpu") for p in pieces] if r == 0 else None, src=0)
        _same(sc_t, sc_c, f"scatter {dtype}")


def reduce_scatter_and_all_to_all():
    gloo = dist.new_group(backend="gloo")
    r, n = _rank()
    for dtype in (torch.float32, torch.int32, torch.bfloat16):
        ins = [_value((3,), dtype, 10 * r + i) for i in range(n)]
        out_c, out_t = torch.empty(3, dtype=dtype), torch.empty(3, dtype=dtype, device="tpu")
        dist.reduce_scatter(out_c, ins, group=gloo)
        dist.reduce_scatter(out_t, [t.to("tpu") for t in ins])
        _same(out_t, out_c, f"reduce_scatter {dtype}")
        flat = torch.cat(ins)
        out_c, out_t = torch.empty(3, dtype=dtype), torch.empty(3, dtype=dtype, device="tpu")
        dist.reduce_scatter_tensor(out_c, flat, group=gloo)
        dist.reduce_scatter_tensor(out_t, flat.to("tpu"))
        _same(out_t, out_c, f"reduce_scatter_tensor {dtype}")
        if dtype.is_floating_point:
            dist.reduce_scatter_tensor(out_t, flat.to("tpu"), op=dist.ReduceOp.AVG)
            _same(out_t, (out_c.float() / n).to(dtype), f"reduce_scatter_tensor AVG {dtype}")
        # all_to_all (list) and all_to_all_single, even and uneven splits
        ins = [_value((2,), dtype, 10 * r + i) for i in range(n)]
        outs_c = [torch.empty(2, dtype=dtype) for _ in range(n)]
        outs_t = [torch.empty(2, dtype=dtype, device="tpu") for _ in range(n)]
        dist.all_to_all(outs_c, ins, group=gloo)
        dist.all_to_all(outs_t, [t.to("tpu") for t in ins])
        for i in range(n):
            _same(outs_t[i], outs_c[i], f"all_to_all {dtype} [{i}]")
        src = _value((2 * n,), dtype, r)
        o_c, o_t = torch.empty_like(src), torch.empty_like(src, device="tpu")
        dist.all_to_all_single(o_c, src, group=gloo)
        dist.all_to_all_single(o_t, src.to("tpu"))
        _same(o_t, o_c, f"all_to_all_single even {dtype}")
        # uneven: rank i sends i+1+j elements to rank j
        in_splits = [r + 1 + j for j in range(n)]
        out_splits = [j + 1 + r for j in range(n)]
        src = _value((sum(in_splits),), dtype, r)
        o_c = torch.empty(sum(out_splits), dtype=dtype)
        o_t = torch.empty(sum(out_splits), dtype=dtype, device="tpu")
        dist.all_to_all_single(o_c, src, out_splits, in_splits, group=gloo)
        dist.all_to_all_single(o_t, src.to("tpu"), out_splits, in_splits)
        _same(o_t, o_c, f"all_to_all_single uneven {dtype}")


def coalesced_point_to_point_and_objects():
    r, n = _rank()
    peer = 1 - r
    # coalesced forms
    xs = [torch.full((2,), float(r + 1), device="tpu"), torch.full((3,), float(10 * (r + 1)), device="tpu")]
    dist.all_reduce_coalesced(xs)
    assert xs[0].cpu().tolist() == [3.0] * 2 and xs[1].cpu().tolist() == [30.0] * 3
    outs = [torch.empty(4, device="tpu"), torch.empty(6, device="tpu")]
    with dist._coalescing_manager(async_ops=False):
        dist.all_gather_into_tensor(outs[0], torch.full((2,), float(r), device="tpu"))
        dist.all_gather_into_tensor(outs[1], torch.full((3,), float(r + 5), device="tpu"))
    assert outs[0].cpu().tolist() == [0.0, 0.0, 1.0, 1.0]
    assert outs[1].cpu().tolist() == [5.0] * 3 + [6.0] * 3
    # send / recv, isend / irecv, batch_isend_irecv
    if r == 0:
        dist.send(torch.arange(4.0, device="tpu"), dst=1)
    else:
        got = torch.zeros(4, device="tpu")
        dist.recv(got, src=0)
        assert got.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    buf = torch.zeros(3, dtype=torch.int64, device="tpu")
    reqs = [dist.isend(torch.full((3,), r + 7, device="tpu"), dst=peer), dist.irecv(buf, src=peer)]
    for q in reqs:
        q.wait()
    assert buf.cpu().tolist() == [peer + 7] * 3
    buf2 = torch.zeros(2, device="tpu")
    ops = [dist.P2POp(dist.isend, torch.full((2,), r + 0.5, device="tpu"), peer),
           dist.P2POp(dist.irecv, buf2, peer)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    assert buf2.cpu().tolist() == [peer + 0.5] * 2
    # receive from any source
    if r == 1:
        anyb = torch.zeros(1, device="tpu")
        assert dist.recv(anyb) == 0 and anyb.item() == 42.0
    else:
        dist.send(torch.tensor([42.0], device="tpu"), dst=1)
    # object collectives
    objs = [{"rank": r, "s": "x" * (r + 3)}]
    dist.broadcast_object_list(objs, src=1)
    assert objs == [{"rank": 1, "s": "xxxx"}]
    gathered = [None] * n
    dist.all_gather_object(gathered, ("hello", r))
    assert gathered == [("hello", i) for i in range(n)]
    dist.barrier()


def subgroups():
    """new_group over a subset (the 4-rank run: {0, 2} and {1, 3}) and a DeviceMesh's sub-meshes."""
    r, n = _rank()
    evens, odds = dist.new_group([0, 2]), dist.new_group([1, 3])
    mine = evens if r % 2 == 0 else odds
    x = torch.full((2,), float(r), device="tpu")
    dist.all_reduce(x, group=mine)
    assert x.cpu().tolist() == [float(r % 2 + r % 2 + 2)] * 2
    sub = dist.split_group(split_ranks=[[0, 1], [2, 3]])
    y = torch.full((1,), float(r), device="tpu")
    dist.all_reduce(y, group=sub)
    assert y.item() == float(4 * (r // 2) + 1)  # ranks 2k, 2k+1
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
    z = torch.full((1,), float(r), device="tpu")
    dist.all_reduce(z, group=mesh.get_group("tp"))
    assert z.item() == float(2 * (r // 2) * 2 + 1)  # ranks 2k, 2k+1
    w = torch.full((1,), float(r), device="tpu")
    dist.all_reduce(w, group=mesh.get_group("dp"))
    assert w.item() == float(2 * (r % 2) + 2)        # ranks k, k+2


subgroups.bind_device = True  # split_group needs the default group bound to a device


def bad_input_is_refused_and_changes_nothing():
    r, n = _rank()
    x = torch.arange(3.0, device="tpu")
    with pytest.raises(ValueError, match="invalid root rank 5"):
        dist.distributed_c10d._get_default_group()._get_backend(torch.device("tpu")).broadcast([x], _bcast_opts(5)).wait()
    with pytest.raises(RuntimeError, match="cpu"):
        dist.all_reduce(torch.ones(2))
    with pytest.raises(RuntimeError, match="PREMUL_SUM"):
        dist.all_reduce(x, op=dist._make_nccl_premul_sum(2.0))
    assert x.cpu().tolist() == [0.0, 1.0, 2.0]
    # The group still works after refused calls.
    dist.all_reduce(x)
    assert x.cpu().tolist() == [0.0, float(n), float(2 * n)]


def _bcast_opts(root):
    o = dist.BroadcastOptions()
    o.rootRank = root
    return o


def init_variants():
    """init_process_group("tpu_dist"), with no backend (PyTorch 2.13 maps the accelerator alone, as it
    maps cuda alone to nccl: tpu -> tpu_dist), "cpu:gloo,tpu:tpu_dist" (CPU tensors to Gloo too), and
    with device_id."""
    import torch_tpu.distributed  # noqa: F401
    r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    variants = [({"backend": "tpu_dist"}, "tpu_dist"), ({}, "undefined"),
                ({"backend": "cpu:gloo,tpu:tpu_dist"}, "cpu:gloo,tpu:tpu_dist"),
                ({"backend": "tpu_dist", "device_id": torch.device("tpu", 0)}, "tpu_dist")]
    for i, (kwargs, shown) in enumerate(variants):
        dist.init_process_group(init_method=f"file://{os.environ['TORCH_TPU_TEST_STORE']}.{i}", rank=r,
                                world_size=n, **kwargs)
        assert dist.get_backend() == shown, (kwargs, dist.get_backend())
        tpu_backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("tpu"))
        assert type(tpu_backend).__name__ == "TpuBackend", (kwargs, type(tpu_backend))
        x = torch.full((2,), float(r + 1), device="tpu")
        dist.all_reduce(x)
        assert x.cpu().tolist() == [3.0, 3.0]
        if "gloo" in shown:
            c = torch.full((2,), float(r + 1))
            dist.all_reduce(c)
            assert c.tolist() == [3.0, 3.0]
        dist.destroy_process_group()


init_variants.backend = None  # the scenario initializes the group itself


def test_init_process_group_variants(tmp_path):
    run_world(2, scenario(init_variants), tmp_path)


@pytest.mark.slow
def test_all_reduce_matches_gloo_for_every_dtype_and_op(tmp_path):
    run_world(2, scenario(all_reduce_every_dtype_and_op), tmp_path, timeout=240)


@pytest.mark.slow
def test_avg_async_work_and_futures(tmp_path):
    run_world(2, scenario(all_reduce_avg_and_async), tmp_path)


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.slow
def test_collectives_see_pending_writes_and_later_ops_see_results(tmp_path, mode):
    run_world(2, scenario(pending_writes_are_seen_and_results_are_seen), tmp_path,
              env={"TORCH_TPU_EAGER_MODE": mode})


def test_rooted_and_gathering_collectives_match_gloo(tmp_path):
    run_world(2, scenario(rooted_and_gathering_collectives), tmp_path, timeout=180)


def test_reduce_scatter_and_all_to_all_match_gloo(tmp_path):
    run_world(2, scenario(reduce_scatter_and_all_to_all), tmp_path, timeout=180)


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.slow
def test_coalesced_point_to_point_and_object_collectives(tmp_path, mode):
    run_world(2, scenario(coalesced_point_to_point_and_objects), tmp_path, env={"TORCH_TPU_EAGER_MODE": mode})


@pytest.mark.slow
def test_subgroups_and_device_mesh_on_four_processes(tmp_path):
    run_world(4, scenario(subgroups), tmp_path, timeout=180)


def test_bad_input(tmp_path):
    run_world(2, scenario(bad_input_is_refused_and_changes_nothing), tmp_path)
