"""Faults and bad input on tpu_dist: a dead rank, a rank that never joins a collective, and
mismatched shapes make the other ranks raise an error naming the collective and the group within
the group's timeout (never a hang), and leave their tensors as they were."""
import os
import time

import pytest
import torch
import torch.distributed as dist

from .runner import run_world, scenario


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


def test_a_rank_that_never_joins_makes_the_others_raise_within_the_timeout(tmp_path):
    run_world(2, scenario(absent_rank), tmp_path, timeout=90)


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
