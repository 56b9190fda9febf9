"""Faults and bad input on tpu_dist: a dead rank, a rank that dies in the middle of a collective, a
rank that never joins one, and mismatched shapes make the other ranks raise an error naming the
collective and the group within the group's timeout (never a hang), and leave their tensors as they
were. An async collective nobody waits for is finished (and its tensors released) at exit; an
earlier op's launch error is not blamed on a collective."""
import os
import sys
import time

import pytest
import torch
import torch.distributed as dist

import torch_tpu

from .runner import run_world, scenario

pytestmark = pytest.mark.multiprocess  # every test here starts processes


def _expect_failure(fn, x, before, started, limit):
    with pytest.raises(dist.DistBackendError) as info:
        fn()
    took = time.monotonic() - started
    msg = str(info.value)
    assert "tpu_dist all_reduce on process group" in msg, msg
    assert took < limit, f"raised after {took:.1f} s (group timeout {limit} s)"
    assert torch.equal(x.cpu(), before), "a failed collective changed its tensor"
    return msg


def dead_rank():
    r = dist.get_rank()
    x = torch.arange(4.0, device="tpu")
    dist.all_reduce(x)  # the group works
    if r == 1:
        os._exit(3)  # dies without a word
    before = x.cpu()
    time.sleep(0.5)
    _expect_failure(lambda: dist.all_reduce(x), x, before, time.monotonic(), limit=dead_rank.timeout + 5)
    os._exit(0)  # the group cannot be torn down cleanly without its peer


dead_rank.timeout = 8


def absent_rank():
    r = dist.get_rank()
    x = torch.ones(3, device="tpu")
    if r == 1:
        time.sleep(absent_rank.timeout + 6)  # alive, but never calls the collective
        os._exit(0)
    before = x.cpu()
    _expect_failure(lambda: dist.all_reduce(x), x, before, time.monotonic(), limit=absent_rank.timeout + 5)
    os._exit(0)


absent_rank.timeout = 5


def mismatched_shapes():
    r = dist.get_rank()
    x = torch.ones(4 + r, device="tpu")
    before = x.cpu()
    with pytest.raises(ValueError, match="did not make the same call") as info:
        dist.all_reduce(x)
    msg = str(info.value)
    assert "rank 0: ALLREDUCE of 1 tensor(s), the first Float[4]" in msg, msg
    assert "rank 1: ALLREDUCE of 1 tensor(s), the first Float[5]" in msg, msg
    assert torch.equal(x.cpu(), before)
    # A different collective on each rank is refused the same way; the group still works after.
    with pytest.raises(ValueError, match="did not make the same call"):
        if r == 0:
            dist.all_reduce(x)
        else:
            dist.broadcast(x, src=0)
    y = torch.ones(2, device="tpu")
    dist.all_reduce(y)
    assert y.cpu().tolist() == [2.0, 2.0]


mismatched_shapes.timeout = 30


def test_a_dead_rank_makes_the_others_raise_within_the_timeout(tmp_path):
    run_world(2, scenario(dead_rank), tmp_path, timeout=90, expect_rc={1: 3})


def peer_dies_mid_collective():
    """Rank 1 posts a 16 MiB all_reduce (its half goes out on the wire) and dies; rank 0 joins the
    collective only once rank 1 is gone, so the collective cannot have finished anywhere. (The ranks'
    call check, TORCH_TPU_DIST_VERIFY, is off: with it, rank 1 would wait in it for rank 0.)"""
    r = dist.get_rank()
    x = torch.full((1 << 22,), float(r + 1), device="tpu")
    store = dist.distributed_c10d._get_default_store()
    if r == 1:
        store.set("rank1_pid", str(os.getpid()))
        dist.all_reduce(x, async_op=True)
        time.sleep(0.2)
        os._exit(3)
    pid = int(store.get("rank1_pid"))
    while _running(pid):
        time.sleep(0.02)
    before = x.cpu()
    _expect_failure(lambda: dist.all_reduce(x), x, before, time.monotonic(),
                    limit=peer_dies_mid_collective.timeout + 5)
    os._exit(0)


def _running(pid):
    """Whether `pid` runs (a dead process the launcher has not reaped yet is a zombie: 'Z')."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


peer_dies_mid_collective.timeout = 8


def test_a_rank_dying_mid_collective_makes_the_others_raise_and_leaves_no_process(tmp_path):
    run_world(2, scenario(peer_dies_mid_collective), tmp_path, timeout=90, expect_rc={1: 3}, no_leftovers=True,
              env={"TORCH_TPU_DIST_VERIFY": "0"})


def unwaited_async_at_exit():
    """Rank 0 posts an async all_reduce, drops its tensor and exits without waiting: the exit waits
    for the collective and releases the tensor (the weakref's callback runs) before the interpreter
    is gone; rank 1, 2 s later, gets the sum."""
    import weakref
    r = dist.get_rank()
    x = torch.full((1 << 16,), float(r + 1), device="tpu")
    if r == 1:
        time.sleep(2)
        dist.all_reduce(x)
        print("rank 1 got", x[:2].cpu().tolist(), flush=True)
        return
    global _PROBE
    _PROBE = weakref.ref(x, lambda _: print("released", flush=True))
    dist.all_reduce(x, async_op=True)
    del x
    print("exiting", flush=True)
    sys.exit(0)


unwaited_async_at_exit.timeout = 20


@pytest.mark.slow
def test_an_unwaited_async_collective_finishes_at_exit_and_releases_its_tensor(tmp_path):
    out = run_world(2, scenario(unwaited_async_at_exit), tmp_path, timeout=90, no_leftovers=True)
    assert "rank 1 got [3.0, 3.0]" in out[1], out[1]
    lines = [ln for ln in out[0].splitlines() if ln in ("exiting", "released")]
    assert lines == ["exiting", "released"], out[0]


def launch_error_then_collective():
    """An op whose launch fails (out of memory) after an async all_reduce was posted: the all_reduce,
    written back later, succeeds; the next sync raises the op's OutOfMemoryError."""
    r = dist.get_rank()
    y = torch.full((1024,), float(r + 1), device="tpu")
    if r == 1:
        time.sleep(1)  # rank 0's failed launch is in the queue before the result is written back
        dist.all_reduce(y)
        return
    work = dist.all_reduce(y, async_op=True)
    huge = torch.empty(2 ** 38, device="tpu")
    with torch_tpu.eager_mode("strict"):  # (debug eager would raise at the op itself)
        huge.fill_(1.0)  # asynchronous: its error waits for the next sync
    work.wait()
    with pytest.raises(torch.OutOfMemoryError, match=r"tpu:0 out of memory.*aten::fill_"):
        torch.tpu.synchronize()
    assert y[:2].cpu().tolist() == [3.0, 3.0]
    del huge


launch_error_then_collective.timeout = 30


@pytest.mark.slow
def test_a_launch_error_is_raised_by_the_next_sync_not_by_a_collective(tmp_path):
    run_world(2, scenario(launch_error_then_collective), tmp_path, timeout=90)


@pytest.mark.slow
def test_a_rank_that_never_joins_makes_the_others_raise_within_the_timeout(tmp_path):
    run_world(2, scenario(absent_rank), tmp_path, timeout=90)


@pytest.mark.slow
def test_mismatched_shapes_raise(tmp_path):
    run_world(2, scenario(mismatched_shapes), tmp_path, timeout=90)


def debug_detail():
    """TORCH_DISTRIBUTED_DEBUG=DETAIL wraps tpu_dist in PyTorch's ProcessGroupWrapper, which checks
    every collective's shapes across ranks first (over its own Gloo group)."""
    r = dist.get_rank()
    x = torch.full((3,), float(r + 1), device="tpu")
    dist.all_reduce(x)
    assert x.cpu().tolist() == [3.0] * 3
    bad = torch.ones(2 + r, device="tpu")
    with pytest.raises(RuntimeError, match="(?i)mismatch|shape"):
        dist.all_reduce(bad)
    assert bad.cpu().tolist() == [1.0] * (2 + r)
    os._exit(0)


debug_detail.timeout = 20


def test_torch_distributed_debug_detail(tmp_path):
    run_world(2, scenario(debug_detail), tmp_path, timeout=90, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
