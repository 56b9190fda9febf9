"""embedding_bag (aten::_embedding_bag and its backward ops) and segment_reduce on tpu vs CPU."""
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import check

T = torch.tensor


def _w(*shape, dtype=torch.float32, grad=True):
    g = torch.Generator().manual_seed(1)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype).requires_grad_(grad)


# -- embedding_bag --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_embedding_bag_modes(mode, dtype):
    idx = T([1, 2, 4, 5, 4, 3, 2, 9])
    off = T([0, 2, 2, 5])                        # bag 1 is empty
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode), _w(10, 3, dtype=dtype), idx, off)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_padding_last_offset(mode):
    idx = T([1, 2, 4, 5, 4, 3, 2, 2], dtype=torch.int32)
    off = T([0, 2, 3, 3, 8], dtype=torch.int32)
    # bag 1 holds only the padding index: it counts as empty
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, padding_idx=4, include_last_offset=True),
          _w(10, 4), idx, off)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_2d_input_scale_grad_by_freq(mode):
    idx = T([[1, 1, 3], [0, 1, 9], [5, 5, 7]])  # CPU scales row r by the count of sorted[rank of r]
    check(lambda w, i: F.embedding_bag(i, w, mode=mode, scale_grad_by_freq=True), _w(10, 5), idx)


@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_bag_per_sample_weights(padding_idx):
    idx = T([1, 2, 4, 5, 4, 3, 2])
    off = T([0, 3, 3])
    check(lambda w, p, i, o: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p, padding_idx=padding_idx),
          _w(8, 3), _w(7, grad=True), idx, off)


def test_embedding_bag_noncontiguous_weight():
    w = _w(3, 10).detach().t().requires_grad_()  # stride(1) != 1: CPU takes its general path
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode="sum"), w, T([0, 9, 3, 3]), T([0, 1]))


def test_embedding_bag_max_ties_nan():
    w = T([[1.0, float("nan")], [1.0, 5.0], [float("nan"), 7.0], [3.0, 2.0], [-0.0, 0.0], [0.0, -0.0]])
    idx = T([0, 1, 3, 2, 1, 4, 5, 5, 4])
    off = T([0, 3, 5, 7])
    # ties go to the earliest; a NaN counts only as a bag's first element
    for fn in (lambda w, i, o: torch.ops.aten._embedding_bag(w, i, o, False, 2),
               lambda w, i, o: F.embedding_bag(i, w, o, mode="max")):
        check(fn, w.clone().requires_grad_(), idx, off)


def test_embedding_bag_all_outputs():
    idx = T([3, 0, 2, 0, 1, 1])
    off = T([0, 2, 2, 4])
    # output, offset2bag, bag_size (padding not counted) and, in max mode, max_indices (the meta
    # kernel sizes mean mode's unused max_indices differently off CPU, so it is not compared there)
    for mode, keep in ((1, 3), (2, 4)):
        check(lambda w, i, o: torch.ops.aten._embedding_bag(w, i, o, False, mode, False, None, False, 1)[:keep],
              _w(4, 3, dtype=torch.float64), idx, off)


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_embedding_bag_forward_only(mode):
    # a weight without grad goes through aten::_embedding_bag_forward_only
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, include_last_offset=True),
          _w(6, 2, grad=False), T([0, 5, 5, 1, 2]), T([0, 1, 1, 4, 5]))


def test_embedding_bag_empty():
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode="mean"), _w(4, 3), T([], dtype=torch.long), T([0, 0]))


@pytest.mark.parametrize("idx,off", [([0, 7], [0, 1]), ([0, -1], [0, 1]), ([0, 1], [1, 1]), ([0, 1], [0, 3])])
def test_embedding_bag_errors(idx, off):
    import torch_tpu  # noqa: F401
    w = _w(5, 2, dtype=torch.float64, grad=False)
    with pytest.raises(RuntimeError):
        F.embedding_bag(T(idx), w, T(off), mode="max")
    with pytest.raises(RuntimeError):
        F.embedding_bag(T(idx), w.to("tpu"), T(off).to("tpu"), mode="max")


# -- segment_reduce -------------------------------------------------------------------------------
NAN = float("nan")


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.0])
def test_segment_reduce_lengths(reduce, initial):
    d = T([[1.0, NAN, 3.0, 0.0, 2.0, 5.0], [4.0, 4.0, -1.0, 0.0, 0.0, 1.5]], dtype=torch.float64)
    ln = T([[2, 0, 3, 1], [1, 2, 0, 3]])
    check(lambda x, n: torch.segment_reduce(x, reduce, lengths=n, axis=1, initial=initial), d.requires_grad_(), ln)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
def test_segment_reduce_offsets_axis0(reduce):
    d = _w(7, 3)
    off = T([1, 3, 3, 6])                       # rows 0 and 6 belong to no segment
    check(lambda x, o: torch.segment_reduce(x, reduce, offsets=o, axis=0, initial=1.0, unsafe=True), d, off)


def test_segment_reduce_half():
    d = _w(6, 2, dtype=torch.bfloat16)
    check(lambda x, n: torch.segment_reduce(x, "mean", lengths=n, initial=0.5), d, T([2, 4]))


def test_segment_reduce_errors():
    import torch_tpu  # noqa: F401
    d = torch.ones(5)
    for ln in (T([2, 2]), T([6, -1])):
        with pytest.raises(RuntimeError):
            torch.segment_reduce(d, "sum", lengths=ln)
        with pytest.raises(RuntimeError):
            torch.segment_reduce(d.to("tpu"), "sum", lengths=ln.to("tpu"))
