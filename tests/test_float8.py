"""float8 tensors on tpu (float8_e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e8m0fnu: XLA's f8 types, what TPUs
compute fp8 matmuls in): they live on the device, convert, copy, index and multiply bit for bit as on
CPU. Arithmetic that CPU has no float8 kernel for (add, sum) runs on tpu, rounded from float32 as XLA
computes it: CPU's refusal there is a missing kernel, not a rule (README, "dtypes")."""
import pytest
import torch

import torch_tpu
from helpers import TPU

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
          torch.float8_e8m0fnu]


def _bits(t):
    return t.detach().cpu().view(torch.uint8)


def _x(dtype, shape=(4, 3)):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(shape, generator=g).abs() + 0.1).to(dtype)  # positive: e8m0 holds powers of 2 only


_SAME_AS_CPU = {
    "round trip": lambda x: x.clone(),
    "from float32": lambda x: (x.float() * 3).to(x.dtype),
    "to float32": lambda x: x.float(),
    "to bfloat16": lambda x: x.to(torch.bfloat16),
    "transpose contiguous": lambda x: x.t().contiguous(),
    "copy_": lambda x: x.clone().copy_(x.t().t()),
    "cat": lambda x: torch.cat([x, x[1:]]),
    "stack": lambda x: torch.stack([x, x]),
    "flip": lambda x: x.flip(0),
    "index_select": lambda x: x.index_select(0, torch.tensor([3, 1], device=x.device)),
    "advanced index": lambda x: x[[0, 2]],
    "fill_": lambda x: x.clone().fill_(2),
    "zero_": lambda x: x.clone().zero_(),
    "where": lambda x: torch.where(x == x, x, x.flip(0)),
    "eq / ne / isnan": lambda x: torch.stack([x == x.flip(0), x != x, x.isnan()]),
    "mul": lambda x: x * x.flip(0),
    "view as uint8": lambda x: x.view(torch.uint8),
}


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
@pytest.mark.parametrize("name", list(_SAME_AS_CPU))
def test_float8_as_cpu(dtype, name):
    fn = _SAME_AS_CPU[name]
    x = _x(dtype)
    before = sum(torch_tpu.metrics.fallback_counts().values())
    want, got = fn(x), fn(x.to(TPU))
    assert got.device.type == "tpu" and got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.itemsize == 1 and want.dtype.is_floating_point:
        assert torch.equal(_bits(got), _bits(want))
    else:
        assert torch.equal(got.cpu(), want)
    assert sum(torch_tpu.metrics.fallback_counts().values()) == before


@pytest.mark.parametrize("dtype", FLOAT8[:4], ids=str)
def test_float8_matmul_and_index_put_as_cpu(dtype):
    x = _x(dtype)
    assert torch.equal(_bits(x.to(TPU) @ x.to(TPU).t()), _bits(x @ x.t()))
    i = torch.tensor([0, 3])
    want = x.clone().index_put_((i,), x[1:3])
    got = x.to(TPU).index_put_((i.to(TPU),), x[1:3].to(TPU))
    assert torch.equal(_bits(got), _bits(want))


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_arithmetic_cpu_lacks_is_float32_rounded(dtype):
    x = _x(dtype)
    with pytest.raises((RuntimeError, NotImplementedError), match="not implemented"):
        x + x
    t = x.to(TPU)
    assert torch.equal(_bits(t + t.flip(0)), _bits((x.float() + x.flip(0).float()).to(dtype)))
    torch.testing.assert_close((t * 1).sum().float().cpu(), x.float().sum().to(dtype).float(), rtol=0.25, atol=0)


def test_float8_in_a_compiled_graph():
    x = _x(torch.float8_e4m3fn)
    f = torch.compile(lambda a: (a.float() * 2).to(torch.float8_e4m3fn).t().contiguous(), backend="tpu", fullgraph=True)
    assert torch.equal(_bits(f(x.to(TPU))), _bits((x.float() * 2).to(torch.float8_e4m3fn).t().contiguous()))
