"""torch_tpu/dynamo/relayout.py: a tensor of symbolic sizes between its compact layout (a 1-D buffer,
row-major at its true sizes) and its bucket's padded layout, moved by rows. Each case runs one
program: compact -> padded (rows gathered) -> a program-side mark of the true sizes -> compact
(rows scattered), and must give back the valid elements bit for bit (NaN payloads, -0.0 and
subnormals included), whatever the padding held."""
import math

import pytest
import torch

import torch_tpu
from torch_tpu import _C, runtime
from torch_tpu.dynamo import relayout
from torch_tpu.lowering.builder import Builder, TensorType


@pytest.fixture(autouse=True)
def strict():
    """The programs here are launched by hand (_C.testing.launch) on tensors uploaded just before:
    strict eager, whatever mode the suite runs in (fused eager would still hold the uploads)."""
    with torch_tpu.eager_mode("strict"):
        yield


def _round_trip(bucket, true, dtype, garbage):
    """(the compact buffer given, the compact buffer the program returns) for a tensor of sizes
    `true` in the bucket `bucket`; dims where they differ are symbolic (true sizes passed at run time)."""
    symbolic = [d for d in range(len(bucket)) if bucket[d] != true[d]] or [len(bucket) - 1]
    cap = math.prod(bucket)
    b = Builder()
    flat = b.arg(TensorType((cap,), dtype))
    n = b.arg(TensorType((len(symbolic),), torch.int32))
    sizes = [None] * len(bucket)
    for i, d in enumerate(symbolic):
        sizes[d] = b.reshape(b.slice(n, [i], [i + 1]), ())
    x = relayout.to_padded(b, flat, sizes, bucket)
    for d in symbolic:
        x = b.set_dimension_size(x, sizes[d], d)
    out = relayout.to_compact(b, x, sizes, cap)
    exe = runtime.compile(b.module([out]), "relayout test")
    numel = math.prod(true)
    if dtype.is_floating_point:
        bits = torch.randint(-2**15, 2**15, (cap * dtype.itemsize // 2,), dtype=torch.int16)
        given = bits.view(dtype).clone()  # every bit pattern: NaNs, infinities, subnormals, -0.0
    elif dtype.is_complex:
        given = torch.randn(cap, dtype=dtype)
    elif dtype == torch.bool:
        given = torch.rand(cap) < 0.5
    else:
        given = torch.randint(0 if dtype == torch.uint8 else -100, 100, (cap,), dtype=dtype)
    given[numel:] = garbage if dtype != torch.bool else True
    sizes_arg = torch.tensor([true[d] for d in symbolic], dtype=torch.int32)
    got = _C.testing.launch(exe, [given.to("tpu"), sizes_arg.to("tpu")], [None],
                            [_C.eager.FreshSpec((cap,), dtype)], 0, "relayout test")[0].cpu()
    return given[:numel], got[:numel]


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@pytest.mark.parametrize("bucket,true", [
    ((16,), (5,)),                 # one dimension
    ((16, 8), (9, 8)),             # the outermost symbolic: one row
    ((3, 16, 4), (3, 7, 4)),       # a static tail after it (rows of 16 x 4)
    ((4, 16), (4, 11)),            # the last dimension symbolic (rows of one length)
    ((2, 16, 16), (2, 5, 13)),     # two symbolic dimensions (attention scores)
    ((16, 3, 16, 2), (6, 3, 9, 2)),
    ((8, 4), (8, 4)),              # at the bound
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_round_trip_is_exact_whatever_the_padding(bucket, true, dtype):
    given, got = _round_trip(bucket, true, dtype, float("nan"))
    assert torch.equal(_bits(got), _bits(given))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool, torch.complex64])
def test_round_trip_of_other_dtypes(dtype):
    given, got = _round_trip((2, 16, 16), (2, 5, 13), dtype, 7 if not dtype.is_complex else complex("nan+nanj"))
    assert torch.equal(got, given)


def test_padded_rows_are_read_from_their_compact_places():
    """compact -> padded alone: element (i, j, k) of the padded result is element i*t1*K + j*K + k of
    the compact buffer for every valid index (a misplaced row would show)."""
    b = Builder()
    flat = b.arg(TensorType((3 * 16 * 4,), torch.float32))
    n = b.arg(TensorType((), torch.int32))
    x = relayout.to_padded(b, flat, [None, n, None], (3, 16, 4))
    exe = runtime.compile(b.module([x]), "relayout test")
    given = torch.arange(3 * 16 * 4, dtype=torch.float32)
    for t in (1, 7, 16):
        got = _C.testing.launch(exe, [given.to("tpu"), torch.tensor(t, dtype=torch.int32).to("tpu")], [None],
                                [_C.eager.FreshSpec((3, 16, 4), torch.float32)], 0, "relayout test")[0].cpu()
        assert torch.equal(got[:, :t], given[:3 * t * 4].view(3, t, 4))


def test_a_buffer_too_small_for_the_bucket_is_refused():
    b = Builder()
    flat = b.arg(TensorType((10,), torch.float32))
    with pytest.raises(ValueError, match="cannot hold the bucket"):
        relayout.to_padded(b, flat, [b.constant(3, torch.int32)], (16,))
