"""A view's storage offset is a runtime operand of eager programs (issue 49): `t[i]` for every row i,
and any view of the same sizes and strides at another offset, is one program. Values, writes
through views, overlap errors and every eager mode are checked against CPU."""
import pytest
import torch

import torch_tpu

TPU = torch.device("tpu")


def _misses():
    return torch_tpu.metrics.counters()["plan_cache_misses"]


def _programs_for(fn, offsets):
    """Plan-cache misses over the calls at offsets[1:], after offsets[0]'s; each result compared with
    CPU's (the comparison's own programs are made by offsets[0]'s)."""
    before = None
    for i in offsets:
        c, t = fn(i, "cpu"), fn(i, TPU)
        torch.testing.assert_close(t.cpu(), c, msg=lambda m: f"offset {i}: {m}")
        before = _misses() if before is None else before
    return _misses() - before


@pytest.fixture
def base():
    return torch.randn(40, 6)


@pytest.mark.parametrize("mode", ["strict", "debug", "fused"])
def test_a_loop_over_rows_is_one_program(base, mode):
    tb = base.to(TPU)
    with torch_tpu.eager_mode(mode):
        n = _programs_for(lambda i, d: (base if d == "cpu" else tb)[i] * 2 + 1, list(range(1, 21)))
    if mode != "fused":  # fused eager keys its runs otherwise
        assert n == 0, f"{n} new programs for 19 more rows"


def test_columns_and_strided_boxes_are_one_program(base):
    tb = base.to(TPU)
    src = {"cpu": base, TPU: tb}
    assert _programs_for(lambda i, d: src[d][:, i].sum(), [1, 2, 3, 4, 5]) == 0
    # a box read through a padded window: rows i..i+2, every other column (the last rows included)
    assert _programs_for(lambda i, d: src[d][i:i + 3, 1::2].exp(), [1, 5, 20, 36, 37]) == 0
    # a view whose strides do not nest (read by gather): overlapping windows of the flat storage
    assert _programs_for(lambda i, d: src[d].view(-1).as_strided((3, 4), (1, 2), i) + 0, [1, 7, 100, 230]) == 0


def test_writes_through_views_at_every_offset(base):
    cpu, tpu = base.clone(), base.to(TPU)
    before = None
    for i in range(1, 12):
        for t in (cpu, tpu):
            t[i].mul_(2)
            t[i:i + 2, 1:4].add_(1)
            t[:, 1 + i % 5].copy_(torch.arange(40.0).to(t.device))  # (offset 0 is a program of its own)
            t.view(-1).as_strided((2, 3), (5, 1), 3 * i).sub_(0.5)
        if i == 2:
            before = _misses()
    assert _misses() == before, "writes at new offsets compiled new programs"
    torch.testing.assert_close(tpu.cpu(), cpu)


def test_two_views_of_one_storage():
    """A later view of the same storage is keyed by its offset relative to the first's: t[i] + t[i+1]
    is one program for every i, and the overlap errors CPU raises are raised at every offset."""
    x = torch.randn(30)
    xt = x.to(TPU)
    assert _programs_for(lambda i, d: (x if d == "cpu" else xt)[i:i + 4] + (x if d == "cpu" else xt)[i + 1:i + 5],
                         [1, 2, 9, 20]) == 0
    for t in (x, xt):
        for i in (0, 3, 11):
            with pytest.raises(RuntimeError, match="refer to a single memory location"):
                t[i + 1:i + 5].copy_(t[i:i + 4])
            t[i + 8:i + 12].copy_(t[i:i + 4])  # apart: no overlap
    torch.testing.assert_close(xt.cpu(), x)


def test_views_of_another_dtype_at_offsets():
    x = torch.randn(16, 8)
    xt = x.to(TPU)
    src = {"cpu": x, TPU: xt}
    assert _programs_for(lambda i, d: src[d].view(torch.int32)[i] & 0xFF, [1, 2, 15]) == 0
    assert _programs_for(lambda i, d: src[d].view(torch.uint8)[i, 4:12].to(torch.int64), [1, 3, 15]) == 0
    for t in (x, xt):
        for i in (1, 6):
            t.view(torch.int16)[i, 2:6].fill_(7)
    torch.testing.assert_close(xt.cpu(), x, equal_nan=True)
