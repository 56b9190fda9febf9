"""Device collectives (torch_tpu.distributed.device_collectives, programs from
torch_tpu.lowering.collectives) across the CPU plugin's devices of one process, against Gloo on CPU
tensors (the reference), run as one ProcessGroupGloo per rank in threads of this process."""
import datetime
import os
import subprocess
import sys
import threading

import pytest
import torch
import torch.distributed as dist

import torch_tpu
from torch_tpu.distributed import device_collectives as dc

N = 2  # the CPU plugin's devices in a test process
ReduceOp = dist.ReduceOp


def _in_threads(rank_fn, n, timeout=120):
    """Runs rank_fn(r) for r in range(n) on daemon threads (a hung rank fails the test, and cannot
    keep the process alive); raises a rank's error."""
    errors = []

    def run(r):
        try:
            rank_fn(r)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    if errors:
        raise errors[0]


def _gloo_group(store, prefix, r, n):
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(interface="lo")]
    opts._timeout = datetime.timedelta(seconds=30)
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), r, n, opts)


def _gloo(call, n=N):
    """Runs call(pg, rank) on n ranks of a fresh Gloo group (threads, loopback)."""
    store = dist.HashStore()
    _in_threads(lambda r: call(_gloo_group(store, "ref", r, n), r), n)


def _values(shape, dtype, n=N, seed=0):
    """One CPU tensor per rank: small integers (sums and products exact in every order), signed where
    the dtype is."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return [torch.randint(0, 2, shape, generator=g).bool() for _ in range(n)]
    low = 0 if dtype == torch.uint8 else -4
    return [torch.randint(low, 5, shape, generator=g).to(dtype) for _ in range(n)]


def _on_devices(xs):
    return [x.to(f"tpu:{k}") for k, x in enumerate(xs)]


def _equal(tpu, ref, what):
    got = tpu.cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape, (what, got.dtype, got.shape, ref.dtype, ref.shape)
    assert torch.equal(got, ref), f"{what}: device {got} != gloo {ref}"


CASES = [(torch.float32, [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]),
         (torch.bfloat16, [ReduceOp.SUM, ReduceOp.MAX]),
         (torch.float64, [ReduceOp.SUM]),
         (torch.int32, [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR,
                        ReduceOp.BXOR]),
         (torch.int64, [ReduceOp.SUM, ReduceOp.BXOR]),
         (torch.uint8, [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.BOR]),
         (torch.bool, [ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR])]


@pytest.mark.parametrize("dtype, ops", CASES, ids=[str(c[0]).split(".")[1] for c in CASES])
def test_all_reduce_equals_gloo(dtype, ops):
    for op in ops:
        for shape in [(), (3, 5)]:
            xs = _values(shape, dtype, seed=hash((str(dtype), str(op))) % 1000)
            ref = [x.clone() for x in xs]
            _gloo(lambda pg, r: pg.allreduce([ref[r]], _opts(op)).wait())
            ts = _on_devices(xs)
            dc.all_reduce(ts, op=op)
            for k in range(N):
                _equal(ts[k], ref[k], f"all_reduce {op} {dtype} {shape} rank {k}")


def _opts(op):
    o = dist.AllreduceOptions()
    o.reduceOp = op
    return o


def test_all_reduce_avg_is_the_sum_divided_truncating_for_integers():
    # Gloo has no AVG; NCCL's (and tpu_dist's host path): the sum over the group size.
    for dtype in (torch.float32, torch.int32):
        xs = _values((7,), dtype, seed=3)
        ts = _on_devices(xs)
        dc.all_reduce(ts, op=ReduceOp.AVG)
        total = xs[0] + xs[1]
        ref = total / N if dtype.is_floating_point else torch.div(total, N, rounding_mode="trunc")
        for t in ts:
            _equal(t, ref.to(dtype), f"avg {dtype}")


def test_reduce_ops_by_name_and_nccl_code():
    xs = _values((5,), torch.int32, seed=9)
    for op in ("max", 2, ReduceOp.MAX):  # torch.cuda.nccl's code 2 is MAX
        ts = _on_devices(xs)
        dc.all_reduce(ts, op=op)
        _equal(ts[0], torch.maximum(xs[0], xs[1]), f"op {op!r}")
    with pytest.raises(ValueError, match="unknown reduce op"):
        dc.all_reduce(_on_devices(xs), op=9)


def test_all_reduce_into_outputs_leaves_inputs():
    xs = _values((4,), torch.float32)
    ts = _on_devices(xs)
    outs = [torch.empty(4, device=f"tpu:{k}") for k in range(N)]
    dc.all_reduce(ts, outs)
    for k in range(N):
        _equal(ts[k], xs[k], "input")
        _equal(outs[k], xs[0] + xs[1], "output")


def test_reduce_writes_the_root_only():
    xs = _values((2, 3), torch.int32, seed=5)
    ref = [x.clone() for x in xs]

    def call(pg, r):
        o = dist.ReduceOptions()
        o.reduceOp, o.rootRank = ReduceOp.SUM, 1
        pg.reduce([ref[r]], o).wait()
    _gloo(call)
    ts = _on_devices(xs)
    dc.reduce(ts, root=1)
    _equal(ts[1], ref[1], "root")
    _equal(ts[0], xs[0], "non-root keeps its value")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.int8, torch.bool,
                                   torch.complex64])
def test_broadcast_is_bit_exact(dtype):
    if dtype.is_floating_point or dtype.is_complex:
        special = torch.tensor([-0.0, float("nan"), float("inf"), -float("inf"), 1e-30, -3.5])
        root = special.to(dtype) if not dtype.is_complex else torch.complex(special, special.flip(0))
    else:
        root = _values((6,), dtype, seed=1)[0]
    xs = [torch.zeros_like(root), root]
    ts = _on_devices(xs)
    dc.broadcast(ts, root=1)
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64,
            torch.complex64: torch.int64}.get(dtype)
    for t in ts:
        got = t.cpu()
        if bits is not None:  # NaN and -0.0: compare the bit patterns
            assert torch.equal(got.view(bits), root.view(bits)), (dtype, got, root)
        else:
            assert torch.equal(got, root), (dtype, got, root)


@pytest.mark.parametrize("shape", [(), (3,), (2, 4)])
def test_all_gather_equals_gloo(shape):
    xs = _values(shape, torch.float32, seed=7)
    whole = (max(1, shape[0] if shape else 1) * N, *shape[1:])
    ref = [torch.empty(whole) for _ in range(N)]
    _gloo(lambda pg, r: pg._allgather_base(ref[r], xs[r].reshape(-1, *shape[1:])).wait())
    outs = [torch.empty(whole, device=f"tpu:{k}") for k in range(N)]
    dc.all_gather(_on_devices(xs), outs)
    for k in range(N):
        _equal(outs[k], ref[k], f"all_gather {shape}")


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MAX])
def test_reduce_scatter_equals_gloo(op):
    xs = _values((4, 3), torch.int32, seed=11)
    ref = [torch.empty(2, 3, dtype=torch.int32) for _ in range(N)]

    def call(pg, r):
        o = dist.ReduceScatterOptions()
        o.reduceOp = op
        pg.reduce_scatter([ref[r]], [list(xs[r].chunk(N))], o).wait()
    _gloo(call)
    outs = [torch.empty(2, 3, dtype=torch.int32, device=f"tpu:{k}") for k in range(N)]
    dc.reduce_scatter(_on_devices(xs), outs, op=op)
    for k in range(N):
        _equal(outs[k], ref[k], f"reduce_scatter {op}")


def test_all_to_all_equals_gloo():
    xs = [torch.arange(6.).reshape(6, 1) + 10 * r for r in range(N)]
    ref = [torch.empty(6, 1) for _ in range(N)]
    _gloo(lambda pg, r: pg.alltoall_base(ref[r], xs[r], [], [], dist.AllToAllOptions()).wait())
    outs = [torch.empty(6, 1, device=f"tpu:{k}") for k in range(N)]
    dc.all_to_all(_on_devices(xs), outs)
    for k in range(N):
        _equal(outs[k], ref[k], "all_to_all")


def test_send_recv_equals_gloo():
    xs = _values((5,), torch.float32, seed=13)
    ref = [x.clone() for x in xs]

    def call(pg, r):
        (pg.send([ref[0]], 1, 0) if r == 0 else pg.recv([ref[1]], 0, 0)).wait()
    _gloo(call)
    ts = _on_devices(xs)
    dc.send_recv(ts, [(0, 1)])
    for k in range(N):
        _equal(ts[k], ref[k], f"send/recv rank {k}")


def test_views_are_read_and_written_through_their_base():
    bases = [torch.arange(12.).reshape(3, 4) * (k + 1) for k in range(N)]
    ts = [b.to(f"tpu:{k}") for k, b in enumerate(bases)]
    cols = [t[:, 1] for t in ts]
    dc.all_reduce(cols)
    for k in range(N):
        expect = bases[k].clone()
        expect[:, 1] = bases[0][:, 1] + bases[1][:, 1]
        _equal(ts[k], expect, "base of the column view")


def test_a_second_call_compiles_nothing():
    xs = _on_devices(_values((9,), torch.float32, seed=17))
    dc.all_reduce(xs)
    misses = torch_tpu._C.runtime.cache_stats()["misses"]
    dc.all_reduce(xs)
    torch.tpu.synchronize()
    assert torch_tpu._C.runtime.cache_stats()["misses"] == misses


def test_errors_say_what_was_wrong_and_change_nothing():
    xs = _on_devices(_values((4,), torch.float32))
    keep = [x.cpu() for x in xs]
    with pytest.raises(ValueError, match="distinct tpu devices"):
        dc.all_reduce([xs[0], xs[0].clone()])
    with pytest.raises(ValueError, match="one shape and dtype"):
        dc.all_reduce([xs[0], torch.zeros(5, device="tpu:1")])
    with pytest.raises(TypeError, match="BAND"):
        dc.all_reduce(xs, op=ReduceOp.BAND)
    with pytest.raises(ValueError, match="PREMUL_SUM"):
        dc.all_reduce(xs, op="premul_sum")
    with pytest.raises(ValueError, match="equal blocks"):
        dc.reduce_scatter([torch.zeros(3, device=f"tpu:{k}") for k in range(N)],
                          [torch.zeros(1, device=f"tpu:{k}") for k in range(N)])
    with pytest.raises(ValueError, match="tpu:1"):
        dc.all_gather(xs, [torch.zeros(8, device="tpu:0"), torch.zeros(8, device="tpu:0")])
    with pytest.raises(ValueError, match="root 2"):
        dc.broadcast(xs, root=2)
    for x, k in zip(xs, keep):
        _equal(x, k, "unchanged after the errors")


_FOUR = r"""
import torch, torch_tpu
from torch_tpu.distributed import device_collectives as dc
n = torch.tpu.device_count()
assert n == 4, n
xs = [torch.arange(8.).reshape(4, 2) + 100 * k for k in range(n)]
on = lambda ts: [t.to(f"tpu:{k}") for k, t in enumerate(ts)]
t = on(xs); dc.all_reduce(t)
assert all(torch.equal(a.cpu(), sum(xs)) for a in t)
outs = [torch.empty(16, 2, device=f"tpu:{k}") for k in range(n)]
dc.all_gather(on(xs), outs)
assert all(torch.equal(o.cpu(), torch.cat(xs)) for o in outs)
outs = [torch.empty(4, 2, device=f"tpu:{k}") for k in range(n)]
dc.all_to_all(on(xs), outs)
for j in range(n):
    assert torch.equal(outs[j].cpu(), torch.cat([xs[i][j:j + 1] for i in range(n)])), j
outs = [torch.empty(1, 2, device=f"tpu:{k}") for k in range(n)]
dc.reduce_scatter(on(xs), outs)
for j in range(n):
    assert torch.equal(outs[j].cpu(), sum(xs)[j:j + 1]), j
t = on(xs); dc.broadcast(t, root=2)
assert all(torch.equal(a.cpu(), xs[2]) for a in t)
t = on(xs); dc.send_recv(t, [(k, (k + 1) % n) for k in range(n)])
assert all(torch.equal(t[(k + 1) % n].cpu(), xs[k]) for k in range(n))
t = on(xs); dc.all_reduce(t[1:3])  # a group of two of the four devices
assert torch.equal(t[1].cpu(), xs[1] + xs[2]) and torch.equal(t[0].cpu(), xs[0])
print("OK")
"""


@pytest.mark.multiprocess
def test_four_devices_in_rank_order():
    env = dict(os.environ, TORCH_TPU_CPU_DEVICE_COUNT="4")
    p = subprocess.run([sys.executable, "-c", _FOUR], env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0 and "OK" in p.stdout, p.stdout + p.stderr


# -- tpu_dist's device path, ranks as threads of this process ----------------------------------------
def _tpu_dist_ranks(call, n=N):
    """Runs call(backend, gloo, rank) on n tpu_dist ranks in threads, rank r driving tpu:r, each with
    the device path on (device_collectives.backend_device_path, mode "1") and a Gloo group beside it
    for the reference."""
    store = dist.HashStore()

    def rank(r):
        host, gloo = _gloo_group(store, "host", r, n), _gloo_group(store, "ref", r, n)
        path = dc.backend_device_path(dist.PrefixStore("device", store), r, n, r, "test", mode="1")
        call(torch_tpu._C.distributed.TpuBackend(host, r, n, datetime.timedelta(seconds=30), path), gloo, r)
    _in_threads(rank, n)


def test_tpu_dist_device_path_equals_gloo_without_host_copies():
    results = {}

    def call(backend, gloo, r):
        x = _values((4, 3), torch.int32, seed=21)[r]
        ref = x.clone()
        gloo.allreduce([ref], _opts(ReduceOp.MAX)).wait()
        t = x.to(f"tpu:{r}")
        torch.tpu.synchronize()
        gloo.barrier().wait()  # both ranks count over the same window, with no download in it
        before = torch_tpu._C.runtime.counters()["d2h_transfers"]
        backend.allreduce([t], _opts(ReduceOp.MAX)).wait()
        bcast = x.to(f"tpu:{r}").float()
        o = dist.BroadcastOptions()
        o.rootRank = 1
        backend.broadcast([bcast], o).wait()
        gathered = torch.empty(8, 3, device=f"tpu:{r}")
        backend._allgather_base(gathered, x.float().to(f"tpu:{r}")).wait()
        scattered = torch.empty(2, 3, device=f"tpu:{r}")
        backend._reduce_scatter_base(scattered, x.float().to(f"tpu:{r}"), dist.ReduceScatterOptions()).wait()
        swapped = torch.empty(4, 3, device=f"tpu:{r}")
        backend.alltoall_base(swapped, x.float().to(f"tpu:{r}"), [], [], dist.AllToAllOptions()).wait()
        # send/recv, rank 0 -> rank 1, of a 2-D tensor into a 1-D one (c10d only matches sizes)
        if r == 0:
            sent = x.float().to("tpu:0")
            backend.send([sent], 1, 0).wait()
            received = sent
        else:
            received = torch.full((12,), -1.0, device="tpu:1")
            backend.recv([received], 0, 0).wait()
        torch.tpu.synchronize()
        copies = torch_tpu._C.runtime.counters()["d2h_transfers"] - before
        gloo.barrier().wait()
        results[r] = dict(copies=copies, all_reduce=(t.cpu(), ref),
                          broadcast=bcast.cpu(), all_gather=gathered.cpu(), reduce_scatter=scattered.cpu(),
                          all_to_all=swapped.cpu(), received=received.cpu(), x=x)
    _tpu_dist_ranks(call)
    xs = [results[r]["x"].float() for r in range(N)]
    for r in range(N):
        got = results[r]
        _equal(*got["all_reduce"], f"all_reduce rank {r}")
        _equal(got["broadcast"], xs[1], f"broadcast rank {r}")
        _equal(got["all_gather"], torch.cat(xs), f"all_gather rank {r}")
        _equal(got["reduce_scatter"], (xs[0] + xs[1])[2 * r:2 * r + 2], f"reduce_scatter rank {r}")
        _equal(got["all_to_all"], torch.cat([xs[i][2 * r:2 * r + 2] for i in range(N)]), f"all_to_all rank {r}")
        _equal(got["received"], xs[0] if r == 0 else xs[0].flatten(), f"send/recv rank {r}")
        # Only the agreement check crossed the host, on CPU tensors: no device-to-host copy.
        assert got["copies"] == 0, got["copies"]


def test_tpu_dist_device_path_runs_list_and_coalesced_forms_as_gloo_does():
    # all_gather and reduce_scatter with tensor lists, all_reduce_coalesced, and the coalesced
    # into-tensor forms: one device program each, against Gloo's results on the same values.
    results = {}

    def call(backend, gloo, r):
        a = _values((2, 3), torch.int32, seed=31)[r].float()
        c = _values((5,), torch.int32, seed=32)[r].float()
        dev = f"tpu:{r}"
        ref = {}
        # Gloo on CPU tensors
        outs = [torch.empty(2, 3) for _ in range(N)]
        gloo.allgather([outs], [a.clone()]).wait()
        ref["all_gather"] = outs
        mine = torch.empty(2, 3)
        gloo.reduce_scatter([mine], [[a * (k + 1) for k in range(N)]], dist.ReduceScatterOptions()).wait()
        ref["reduce_scatter"] = mine
        co = [a.clone(), c.clone()]
        o = dist.AllreduceCoalescedOptions()
        o.reduceOp = ReduceOp.MAX
        gloo.allreduce_coalesced(co, o).wait()
        ref["all_reduce_coalesced"] = co
        gathered = [torch.empty(2 * N, 3), torch.empty(5 * N)]
        for x, out in zip((a, c), gathered):
            gloo._allgather_base(out, x.clone()).wait()
        ref["all_gather_coalesced"] = gathered
        scattered = [torch.empty(1, 3), torch.empty(2)]
        for x, out in zip((a, c[:4]), scattered):
            gloo._reduce_scatter_base(out, x.clone(), dist.ReduceScatterOptions()).wait()
        ref["reduce_scatter_coalesced"] = scattered
        # tpu_dist's device path; the coalesced forms through a ProcessGroup, as c10d calls them
        pg = dist.ProcessGroup(dist.HashStore(), r, N)
        pg._register_backend(torch.device("tpu"), dist.ProcessGroup.BackendType.CUSTOM, backend)
        gloo.barrier().wait()
        before = torch_tpu._C.runtime.counters()["d2h_transfers"]
        got = {}
        outs = [torch.full((2, 3), -1.0, device=dev) for _ in range(N)]
        backend.allgather([outs], [a.to(dev)]).wait()
        got["all_gather"] = outs
        mine = torch.full((2, 3), -1.0, device=dev)
        backend.reduce_scatter([mine], [[(a * (k + 1)).to(dev) for k in range(N)]], dist.ReduceScatterOptions()).wait()
        got["reduce_scatter"] = mine
        co = [a.to(dev), c.to(dev)]
        backend.allreduce_coalesced(co, o).wait()
        got["all_reduce_coalesced"] = co
        gathered = [torch.empty(2 * N, 3, device=dev), torch.empty(5 * N, device=dev)]
        pg.allgather_into_tensor_coalesced(gathered, [a.to(dev), c.to(dev)]).wait()
        got["all_gather_coalesced"] = gathered
        scattered = [torch.empty(1, 3, device=dev), torch.empty(2, device=dev)]
        pg.reduce_scatter_tensor_coalesced(scattered, [a.to(dev), c[:4].to(dev)],
                                                dist.ReduceScatterOptions()).wait()
        got["reduce_scatter_coalesced"] = scattered
        torch.tpu.synchronize()
        copies = torch_tpu._C.runtime.counters()["d2h_transfers"] - before
        gloo.barrier().wait()
        results[r] = (ref, {k: [t.cpu() for t in v] if isinstance(v, list) else v.cpu() for k, v in got.items()},
                      copies)
    _tpu_dist_ranks(call)
    for r in range(N):
        ref, got, copies = results[r]
        for k in ref:
            want = ref[k] if isinstance(ref[k], list) else [ref[k]]
            have = got[k] if isinstance(got[k], list) else [got[k]]
            for i, (h, w) in enumerate(zip(have, want)):
                _equal(h, w, f"{k}[{i}] rank {r}")
        assert copies == 0, copies


def test_tpu_dist_device_path_writes_views_and_refuses_what_c10d_refuses():
    def call(backend, gloo, r):
        base = torch.arange(12.).reshape(3, 4).to(f"tpu:{r}") * (r + 1)
        col = base[:, 1]
        backend.allreduce([col], _opts(ReduceOp.SUM)).wait()
        expect = torch.arange(12.).reshape(3, 4) * (r + 1)
        expect[:, 1] = torch.arange(12.).reshape(3, 4)[:, 1] * 3
        _equal(base, expect, f"base of the view, rank {r}")
        keep = base.cpu()
        with pytest.raises(RuntimeError, match="PREMUL_SUM"):
            o = dist.AllreduceOptions()
            o.reduceOp = dist._make_nccl_premul_sum(2.0)
            backend.allreduce([base], o).wait()
        with pytest.raises(dist.DistBackendError, match="BAND"):
            backend.allreduce([base], _opts(ReduceOp.BAND)).wait()
        _equal(base, keep, "unchanged after refused calls")
    _tpu_dist_ranks(call)


def test_device_path_choice():
    # The CPU plugin has no cross-process collectives: off by default, refused when forced across processes.
    assert dc.backend_device_path(dist.HashStore(), 0, 2, 0, "g") is None
    store = dist.HashStore()
    store.set("rank1", "another-host:1|0|0")
    with pytest.raises(RuntimeError, match="no cross-process collectives"):
        dc.backend_device_path(store, 0, 2, 0, "g", mode="1")
    with pytest.raises(ValueError, match="auto, 0 or 1"):
        dc.backend_device_path(dist.HashStore(), 0, 2, 0, "g", mode="yes")
