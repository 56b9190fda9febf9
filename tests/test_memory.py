"""torch.tpu / torch.accelerator memory functions, from the runtime's count of live storages (they
work on the CPU plugin, which reports no device memory statistics of its own)."""
import gc

import pytest
import torch

import torch_tpu

TPU = "tpu"


def _settled():
    gc.collect()
    torch.tpu.synchronize()
    return torch.tpu.memory_allocated()


@torch_tpu.eager_mode("strict")  # fused eager keeps recorded ops' storages alive until its run executes
def test_allocations_and_frees_are_counted():
    base = _settled()
    torch.tpu.reset_peak_memory_stats()
    stats0 = torch.tpu.memory_stats()
    a = torch.empty(1000, device=TPU)                    # 4000 bytes
    b = torch.zeros(10, 10, dtype=torch.float64, device=TPU)  # 800 bytes
    assert torch.tpu.memory_allocated() == base + 4800
    assert torch.accelerator.memory_allocated(0) == base + 4800
    assert torch.tpu.memory_reserved() == torch.tpu.memory_allocated()
    stats = torch.tpu.memory_stats()
    assert stats["allocation.all.current"] == stats0["allocation.all.current"] + 2
    assert stats["allocated_bytes.all.allocated"] >= stats0["allocated_bytes.all.allocated"] + 4800
    del a
    assert torch.tpu.memory_allocated() == base + 800
    assert torch.tpu.max_memory_allocated() >= base + 4800
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == base + 800
    del b
    assert torch.tpu.memory_allocated() == base


@torch_tpu.eager_mode("strict")
def test_views_share_their_storage_and_results_count():
    base = _settled()
    x = torch.ones(256, device=TPU)
    v = x[10:20].view(2, 5)
    assert torch.tpu.memory_allocated() == base + 1024  # a view allocates nothing
    y = x * 2                                           # a result is a new storage
    assert torch.tpu.memory_allocated() == base + 2048
    del x, v, y


def test_accumulated_counters_reset_and_memory_info():
    torch.tpu.reset_accumulated_memory_stats()
    assert torch.tpu.memory_stats()["allocation.all.allocated"] == 0
    t = torch.empty(8, device=TPU)
    assert torch.tpu.memory_stats()["allocation.all.allocated"] == 1
    del t
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total
    assert torch.accelerator.get_memory_info(0) == (free, total) or torch.accelerator.get_memory_info(0)[1] == total
    torch.tpu.empty_cache()
    summary = torch.tpu.memory_summary()
    assert "Allocated memory" in summary and "Allocations" in summary


@pytest.mark.parametrize("mode", ["strict", "debug"])
def test_out_of_memory_raises_torch_out_of_memory_error(mode):
    # What accelerate's find_executable_batch_size and Lightning's batch-size finder catch: a launch
    # whose results cannot be allocated (1 TiB here) raises torch.OutOfMemoryError naming the op, the
    # size and what to do, at the op (debug) or at the next synchronisation (strict, asynchronous).
    keep = torch.arange(4.0, device="tpu")
    with torch_tpu.eager_mode(mode):
        with pytest.raises(torch.OutOfMemoryError, match=r"tpu:0 out of memory\. Tried to allocate 1\.00 TiB for "
                                                         r"the results of the tpu op aten::fill_\.Scalar .* smaller batch"):
            huge = torch.empty(2 ** 38, device="tpu")
            huge.fill_(1.0)
            torch.tpu.synchronize()
    del huge
    # Nothing else is lost: other tensors keep their values and the device goes on.
    assert keep.add(1).tolist() == [1.0, 2.0, 3.0, 4.0]
