import pytest
import torch

import torch_tpu
from helpers import check

TPU = torch.device("tpu")


def _lists(dtype=torch.float32, positive=False):
    g = torch.Generator().manual_seed(0)
    shapes = [(3, 4), (5,), (), (2, 1, 3)]
    xs = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    ys = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    if positive:
        xs = [x.abs() + 0.5 for x in xs]
        ys = [y.abs() + 0.5 for y in ys]
    return xs, ys


def _check_foreach(fn, *lists):
    """fn takes flattened lists; compares functional results and no fallback."""
    n = len(lists[0])
    flat = [t for lst in lists for t in lst]

    def run(*ts):
        return fn(*[list(ts[i * n:(i + 1) * n]) for i in range(len(lists))])
    check(run, *flat, grad=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum", "clamp_min", "clamp_max",
                                  "pow"])
def test_binary(name, dtype):
    xs, ys = _lists(dtype, positive=True)
    f = getattr(torch, f"_foreach_{name}")
    _check_foreach(lambda a, b: f(a, b), xs, ys)
    _check_foreach(lambda a: f(a, 1.5), xs)
    _check_foreach(lambda a: f(a, [0.5, 2.0, 3.0, 1.25]), xs)


def test_alpha_and_tensor_overloads():
    xs, ys = _lists()
    _check_foreach(lambda a, b: torch._foreach_add(a, b, alpha=-0.3), xs, ys)
    _check_foreach(lambda a, b: torch._foreach_sub(a, b, alpha=2), xs, ys)
    _check_foreach(lambda a: torch._foreach_mul(a, torch.tensor(2.5).to(a[0].device)), xs)
    _check_foreach(lambda a: torch._foreach_div(a, torch.tensor(4.0).to(a[0].device)), xs)
    _check_foreach(lambda a: torch._foreach_pow(2.0, a), xs)


@pytest.mark.parametrize("name", ["sqrt", "neg", "reciprocal", "abs", "exp", "sign"])
def test_unary(name):
    xs, _ = _lists(positive=True)
    _check_foreach(lambda a: getattr(torch, f"_foreach_{name}")(a), xs)


def test_zero_():
    xs, _ = _lists()
    _check_foreach(lambda a: (torch._foreach_zero_(a), a)[1], [x.clone() for x in xs])


def test_ternary():
    xs, ys = _lists()
    zs, _ = _lists(positive=True)
    _check_foreach(lambda a, b, c: torch._foreach_addcmul(a, b, c, value=0.7), xs, ys, zs)
    _check_foreach(lambda a, b, c: torch._foreach_addcdiv(a, b, c, value=-2), xs, ys, zs)
    _check_foreach(lambda a, b, c: torch._foreach_addcdiv(a, b, c, [0.1, 0.2, 0.3, 0.4]), xs, ys, zs)
    _check_foreach(lambda a, b: torch._foreach_lerp(a, b, 0.3), xs, ys)
    _check_foreach(lambda a, b, c: torch._foreach_lerp(a, b, c), xs, ys, [z * 0.5 for z in zs])


def test_inplace_one_program():
    xs, ys = _lists()
    a = [x.to(TPU) for x in xs]
    b = [y.to(TPU) for y in ys]
    views = [a[0][1:], a[1]]  # a view and its base stay consistent
    torch.tpu.synchronize()  # fused eager: run what is pending before counting
    execs = torch_tpu.metrics.counters().get("executions")
    fallbacks = sum(torch_tpu.metrics.fallback_counts().values())
    torch._foreach_add_(a, b, alpha=2)
    torch._foreach_mul_(a, 0.5)
    torch._foreach_maximum_(a, b)
    torch.tpu.synchronize()
    assert torch_tpu.metrics.counters()["executions"] - execs == (1 if torch_tpu.get_eager_mode() == "fused" else 3)
    exp = [torch.maximum((x + 2 * y) * 0.5, y) for x, y in zip(xs, ys)]
    for t, e in zip(a, exp):
        torch.testing.assert_close(t.cpu(), e)
    torch.testing.assert_close(views[0].cpu(), exp[0][1:])
    assert sum(torch_tpu.metrics.fallback_counts().values()) == fallbacks
