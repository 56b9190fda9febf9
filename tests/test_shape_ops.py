import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from helpers import check, to_tpu
from helpers import data as _data, grad as _grad

FLOATS = [torch.float32, torch.bfloat16]
ALL = FLOATS + [torch.int64, torch.bool]


@pytest.mark.parametrize("dtype", ALL)
def test_cat_stack(dtype):
    a, b = _grad(_data((2, 3), dtype)), _grad(_data((4, 3), dtype))
    check(lambda a, b: torch.cat([a, b]), a, b)
    check(lambda a, b: torch.cat([a.t(), b.t(), a.t()], dim=-1), a, b)  # non-contiguous
    check(lambda a, b: torch.cat([a, torch.empty(0, dtype=a.dtype, device=a.device), b]), a, b)  # legacy empty
    check(lambda a, b: torch.cat([a[:0], b, a[:, :3][:0]]), a, b)
    check(lambda a, b: torch.stack([a, b[:2]], dim=1), a, b)
    check(lambda a, b: torch.hstack([a, b[:2]]), a, b)
    check(lambda a: torch.cat([a]), a)


def test_cat_promotion():
    i = torch.tensor([[1, 2]], dtype=torch.int32)
    f = torch.randn(1, 2, dtype=torch.bfloat16)
    bo = torch.tensor([[True, False]])
    check(lambda i, f: torch.cat([i, f]), i, f)
    check(lambda bo, i: torch.cat([bo, i, bo]), bo, i)
    check(lambda i: torch.cat([i, torch.tensor([[5]], dtype=torch.int64, device=i.device)], dim=1), i)
    check(lambda f: torch.cat([f, torch.empty(0, dtype=torch.float32, device=f.device)]), f)


@pytest.mark.parametrize("dtype", ALL)
def test_pad_flip_roll_repeat(dtype):
    x = _grad(_data((2, 3, 4), dtype))
    v = 1 if dtype != torch.bool else True
    check(lambda x: F.pad(x, (1, 2), value=v), x)
    check(lambda x: F.pad(x, (0, 1, 2, 0, 1, 1)), x)
    check(lambda x: F.pad(x, (-1, 2, 1, -2)), x)  # negative pads crop
    check(lambda x: torch.constant_pad_nd(x.transpose(0, 2), [1, 1]), x)
    check(lambda x: torch.flip(x, [0, 2]), x)
    check(lambda x: torch.flip(x.transpose(1, 2), [-1]), x)
    check(lambda x: torch.roll(x, 1, 0), x)
    check(lambda x: torch.roll(x, (-5, 2), (2, 1)), x)
    check(lambda x: torch.roll(x, 7), x)
    check(lambda x: x.repeat(2, 1, 3), x)
    check(lambda x: x.repeat(2, 1, 1, 2), x)
    check(lambda x: x.t().repeat(1, 2) if x.dim() == 2 else x[0].t().repeat(1, 2), x)
    check(lambda x: x.repeat(0, 1, 1), x)


@pytest.mark.parametrize("dtype", ALL)
def test_tril_triu(dtype):
    x = _grad(_data((2, 3, 5), dtype))
    for k in (-1, 0, 2, 7):
        check(lambda x: torch.tril(x, k), x)
        check(lambda x: torch.triu(x, k), x)
    check(lambda x: torch.triu(x.transpose(1, 2)), x)
    check(lambda x: x[0].clone().tril_(1), x)


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64, torch.bool])
def test_sort(dtype):
    x = _data((3, 6), dtype)
    if dtype.is_floating_point:
        x[0, 1] = float("nan")
        x[1, 3] = float("nan")
        x[2, 0] = float("inf")
        x[2, 5] = -float("inf")
    else:
        x[0, :4] = x[0, 0]  # ties: stable order
    for desc in (False, True):
        check(lambda x: torch.sort(x, stable=True, descending=desc), x)
        check(lambda x: torch.sort(x, dim=0, stable=True, descending=desc), x)
        check(lambda x: torch.sort(x.t(), dim=0, stable=True, descending=desc), x)
        check(lambda x: torch.argsort(x, stable=True, descending=desc), x)


def test_sort_grad():
    x = torch.randn(3, 5, requires_grad=True)
    check(lambda x: torch.sort(x, dim=1)[0], x)
    check(lambda x: torch.sort(x, dim=0, descending=True)[0], x)
    check(lambda x: torch.sort(torch.tensor(3.0, device=x.device)), x, grad=False)


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
def test_topk(dtype):
    x = torch.randperm(24).reshape(4, 6).to(dtype)  # distinct values: no tie ambiguity
    if dtype.is_floating_point:
        x[1, 2] = float("nan")
        x = _grad(x)
    for largest in (True, False):
        check(lambda x: torch.topk(x, 3, largest=largest), x)
        check(lambda x: torch.topk(x, 2, dim=0, largest=largest), x)
        check(lambda x: torch.topk(x.t(), 4, dim=1, largest=largest), x)
    check(lambda x: torch.topk(x, 0), x)


@pytest.mark.parametrize("dtype", ALL)
def test_where_scalars(dtype):
    x = _grad(_data((3, 4), dtype))
    c = torch.randn(3, 4) > 0
    check(lambda c, x: torch.where(c, x, 0), c, x)
    check(lambda c, x: torch.where(c, 1, x), c, x)
    check(lambda c: torch.where(c, 1.5, 0), c)
    check(lambda c: torch.where(c, 2, 3), c)


def test_shape_errors():
    x = torch.randn(3, 4)
    xt = to_tpu(x)
    before = torch_tpu.metrics.fallback_counts()
    for fn, exc in [(lambda x: torch.topk(x, 5), RuntimeError), (lambda x: torch.flip(x, [0, 0]), RuntimeError),
                    (lambda x: torch.cat([x, x[:, :2]]), RuntimeError), (lambda x: x.repeat(2), RuntimeError),
                    (lambda x: torch.roll(x, 1, 2), IndexError), (lambda x: F.pad(x, (-3, -2)), RuntimeError)]:
        with pytest.raises(exc):
            fn(x)
        with pytest.raises(exc):
            fn(xt)
    assert torch.equal(xt.cpu(), x)
    assert torch_tpu.metrics.fallback_counts() == before


@pytest.mark.parametrize("dim,index", [(0, -1), (1, 2)])
def test_select_scatter(dim, index):
    x = torch.randn(4, 3, requires_grad=True)
    src = torch.randn(x.select(dim, index).shape, requires_grad=True)
    check(lambda a, s: torch.select_scatter(a, s, dim, index), x, src)


@pytest.mark.parametrize("shape,kw", [
    ((2, 3 * 2 * 2, 12), dict(output_size=(4, 5), kernel_size=2)),
    ((3 * 3 * 2, 9), dict(output_size=(5, 5), kernel_size=(3, 2), dilation=(1, 2), padding=1, stride=2)),
])
def test_fold_col2im(shape, kw):
    check(lambda x: torch.nn.functional.fold(x, **kw), torch.randn(*shape, requires_grad=True))
