"""Transfers that make no program (csrc/eager/copies.cc), so that a batch of a new shape compiles
nothing (issue 49):
- host -> tpu into a whole storage (upload_whole, Runtime::upload_ordered): a transfer ordered after
  the queued launches; small uploads keep their host bytes (Cell::host_copy), which every write of the
  storage must drop, since a bucketed graph re-uploads its input from them;
- tpu -> host of a contiguous range of a storage at most 4 times its size (a bucketed graph's output
  at the front of its bucket-sized buffer): the whole buffer comes down, the range is cut on the host."""
import pytest
import torch

import torch_tpu
from torch_tpu import _C, recompiles

TPU = torch.device("tpu")


def programs_made() -> int:
    return sum(sum(c.values()) for c in torch_tpu.metrics.program_causes().values())


def test_an_upload_of_a_new_shape_makes_no_program():
    recompiles.reset()
    torch.manual_seed(0)
    for n in (3, 17, 40, 41):
        for dtype in (torch.float32, torch.int64, torch.bool, torch.bfloat16):
            x = torch.randn(5, n).to(dtype)
            before = programs_made()
            t = x.to(TPU)
            assert programs_made() == before, f"uploading a ({5}, {n}) {dtype} tensor made a program"
            assert t.dtype == dtype and t.shape == x.shape
            assert torch.equal(t.cpu(), x)


def test_an_upload_takes_effect_after_the_launches_queued_before_it():
    """Ops queued before an upload into their operand read the old value; ops after it the new one
    (the launch queue orders both), whatever the eager mode."""
    for mode in ("strict", "debug", "fused"):
        with torch_tpu.eager_mode(mode):
            x = torch.zeros(4096, device=TPU)
            reads = [x * k for k in range(1, 30)]  # queued behind one another
            x.copy_(torch.ones(4096))
            after = x + 1
            for k, r in enumerate(reads, start=1):
                assert torch.count_nonzero(r.cpu()) == 0, (mode, k)
            assert torch.equal(after.cpu(), torch.full((4096,), 2.0)), mode
            assert torch.equal(x.cpu(), torch.ones(4096)), mode


def test_uploads_the_copy_program_keeps():
    """A view, another dtype, a broadcast source, a storage shared with another dtype: the copy program."""
    base = torch.zeros(6, device=TPU)
    base[2:5].copy_(torch.tensor([1.0, 2.0, 3.0]))
    assert base.cpu().tolist() == [0, 0, 1, 2, 3, 0]
    d = torch.zeros(3, device=TPU)
    d.copy_(torch.tensor([1, 2, 3]))  # int64 -> float32
    assert d.cpu().tolist() == [1.0, 2.0, 3.0]
    b = torch.zeros(2, 3, device=TPU)
    b.copy_(torch.tensor([7.0, 8.0, 9.0]))  # broadcast
    assert b.cpu().tolist() == [[7, 8, 9], [7, 8, 9]]
    f = torch.ones(2, device=TPU)
    f.view(torch.int32).copy_(torch.tensor([0x40000000, 0], dtype=torch.int32))  # bits of 2.0 and 0.0
    assert f.cpu().tolist() == [2.0, 0.0]
    c = torch.zeros(3, dtype=torch.complex64, device=TPU)
    c.copy_(torch.tensor([1 + 2j, 3 - 1j, 0j]).conj())
    assert c.cpu().tolist() == [1 - 2j, 3 + 1j, 0j]


def test_host_copy_is_dropped_by_every_write():
    x = torch.arange(8.0).to(TPU)
    assert torch.equal(_C.device.host_copy(x), torch.arange(8.0))
    writes = [
        lambda t: t.add_(1),                                 # an in-place op
        lambda t: t.__setitem__(3, 5.0),                     # a write through a view
        lambda t: t.copy_(torch.ones(8, device=TPU)),        # a device copy
        lambda t: t[2:].copy_(torch.ones(6)),                # an upload into a view (the copy program)
        lambda t: torch.add(t, 1, out=t),                    # an out= variant
        lambda t: t.index_put_((torch.tensor([1]),), torch.tensor(3.0)),  # an indexed write
        lambda t: t.zero_(),
    ]
    for write in writes:
        t = torch.arange(8.0).to(TPU)
        assert _C.device.host_copy(t) is not None
        write(t)
        assert _C.device.host_copy(t) is None, write
    big = torch.zeros(256 * 1024 // 4 + 1).to(TPU)  # past 256 KiB: not kept
    assert _C.device.host_copy(big) is None


def test_a_bucketed_graph_reuploads_a_batch_and_copies_a_written_one(monkeypatch):
    """A compiled graph with a symbolic length takes an uploaded batch at its bucket's layout by
    uploading the kept bytes again (no program for the new length); a batch written on the device
    after its upload has no kept bytes and is copied on the device, with its new value."""
    monkeypatch.delenv("TORCH_TPU_SHAPE_BUCKETS", raising=False)
    torch._dynamo.reset()
    f = torch.compile(lambda x: (x * 2).sum(dim=1), backend="tpu")
    for n in (5, 6):  # the first call is static; the second compiles the bucketed graph
        f(torch.randn(3, n).to(TPU))
    counts = torch_tpu.metrics.counters
    up, cp, made = counts()["bucket_input_uploads"], counts()["bucket_input_copies"], programs_made()
    x = torch.randn(3, 9)
    torch.testing.assert_close(f(x.to(TPU)).cpu(), (x * 2).sum(dim=1))
    assert programs_made() == made, "a length in a seen bucket made a program"
    assert counts()["bucket_input_uploads"] == up + 1
    t = x.to(TPU)
    t.mul_(-1)  # written on the device: the kept bytes are stale and must not be used
    torch.testing.assert_close(f(t).cpu(), (-x * 2).sum(dim=1))
    assert counts()["bucket_input_copies"] == cp + 1
    torch._dynamo.reset()


@pytest.mark.parametrize("mode", ["strict", "debug"])
def test_upload_into_a_tensor_autograd_saved(mode):
    """x.data's storage replaced by an upload after a backward graph saved x: the version counter
    still catches the in-place change (copy_ bumps it as on CPU)."""
    with torch_tpu.eager_mode(mode):
        w = torch.ones(3, device=TPU, requires_grad=True)
        y = (w * w).sum()
        with torch.no_grad():
            w.copy_(torch.full((3,), 2.0))
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()


def test_a_download_of_a_range_of_a_small_enough_storage_makes_no_program():
    base = torch.arange(64.0).to(TPU)
    made = programs_made()
    for n in range(16, 60, 5):  # storage <= 4x the range: downloaded whole
        assert torch.equal(base[:n].cpu(), torch.arange(float(n)))
        assert torch.equal(base[5:5 + n].view(1, -1).cpu(), torch.arange(5.0, 5 + n).view(1, -1))
    assert base[40:56].view(4, 4).tolist() == torch.arange(40.0, 56).view(4, 4).tolist()
    assert programs_made() == made
    # not contiguous, a conj view, another dtype's view, a small range of a large storage: the clone
    # program (values checked)
    m = torch.arange(24.0).view(4, 6)
    assert torch.equal(m.to(TPU)[:, 1:4].cpu(), m[:, 1:4])
    c = torch.tensor([1 + 1j, 2 - 3j, 4j, 5])
    assert torch.equal(c.to(TPU)[1:].conj().cpu(), c[1:].conj())
    assert torch.equal(base.view(torch.int32)[5:30].cpu(), torch.arange(64.0).view(torch.int32)[5:30])
    assert base[10:12].cpu().tolist() == [10.0, 11.0]
    assert base[7].item() == 7.0
