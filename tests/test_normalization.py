import pytest
import torch
import torch.nn.functional as F
import torch_tpu

from helpers import check, to_tpu

FLOATS = [torch.float32, torch.bfloat16]


def _p(n, dtype):
    return torch.randn(n, dtype=dtype).requires_grad_()


@pytest.mark.parametrize("dtype", FLOATS)
def test_batch_norm_functional(dtype):
    x = torch.randn(4, 3, 5, 2, dtype=dtype).requires_grad_()
    w, b = _p(3, dtype), _p(3, dtype)
    check(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, w, b)
    check(lambda x: F.batch_norm(x, None, None, training=True), x)
    rm, rv = torch.randn(3, dtype=dtype), torch.rand(3, dtype=dtype) + 0.5
    # running statistics are updated in place while training
    check(lambda x, w, b, rm, rv: (F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3), rm, rv),
          x, w, b, rm, rv)
    check(lambda x, w, b, rm, rv: (F.batch_norm(x, rm, rv, w, b, training=False), rm, rv), x, w, b, rm, rv)
    # 2-d and 3-d inputs, non-contiguous
    check(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), torch.randn(6, 3, dtype=dtype), w, b)
    check(lambda x, w, b: F.batch_norm(x.transpose(1, 2), None, None, w, b, training=True),
          torch.randn(4, 7, 3, dtype=dtype).requires_grad_(), w, b)


def test_batch_norm_mixed_dtype():
    x = torch.randn(4, 3, 5, dtype=torch.bfloat16).requires_grad_()
    w, b = _p(3, torch.float32), _p(3, torch.float32)
    rm, rv = torch.zeros(3), torch.ones(3)
    check(lambda x, w, b, rm, rv: (F.batch_norm(x, rm, rv, w, b, training=True), rm, rv), x, w, b, rm, rv)
    check(lambda x, w, b: torch.ops.aten.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5), x, w, b)


@pytest.mark.parametrize("dtype", FLOATS)
def test_batch_norm_module(dtype):
    torch.manual_seed(0)
    m = torch.nn.BatchNorm2d(3).to(dtype)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-0.5, 0.5)
    mt = torch.nn.BatchNorm2d(3).to(dtype)
    mt.load_state_dict(m.state_dict())
    mt = mt.to("tpu")
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else {}
    before = dict(torch_tpu.metrics.fallback_counts())
    for _ in range(3):
        x = torch.randn(4, 3, 5, 5, dtype=dtype) * 2 + 1
        xt = to_tpu(x).requires_grad_()
        x.requires_grad_()
        y, yt = m(x), mt(xt)
        torch.testing.assert_close(yt.detach().cpu(), y.detach(), **tol)
        g = torch.randn_like(y)
        y.backward(g)
        yt.backward(to_tpu(g))
        torch.testing.assert_close(xt.grad.cpu(), x.grad, **tol)
        torch.testing.assert_close(mt.weight.grad.cpu(), m.weight.grad, **tol)
        torch.testing.assert_close(mt.bias.grad.cpu(), m.bias.grad, **tol)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(mt, name).cpu(), getattr(m, name), **tol)
    assert dict(torch_tpu.metrics.fallback_counts()) == before
    m.eval()
    mt.eval()
    x = torch.randn(2, 3, 4, 4, dtype=dtype).requires_grad_()
    check(lambda x: m(x) if x.device.type == "cpu" else mt(x), x)


@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_norm(dtype):
    x = torch.randn(3, 4, 5, dtype=dtype).requires_grad_()
    check(lambda x, w, b: F.layer_norm(x, (5,), w, b), x, _p(5, dtype), _p(5, dtype))
    check(lambda x, w: F.layer_norm(x, (4, 5), w), x, torch.randn(4, 5, dtype=dtype).requires_grad_())
    check(lambda x: F.layer_norm(x, (5,)), x)
    check(lambda x, w, b: F.layer_norm(x.transpose(0, 2), (3,), w, b), x, _p(3, dtype), _p(3, dtype))
    check(lambda x: F.layer_norm(x, (5,)), torch.randn(0, 5, dtype=dtype))


def test_layer_norm_module():
    torch.manual_seed(0)
    m = torch.nn.LayerNorm(6)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
    mt = torch.nn.LayerNorm(6)
    before = dict(torch_tpu.metrics.fallback_counts())
    mt.load_state_dict(m.state_dict())
    mt = mt.to("tpu")
    x = torch.randn(2, 3, 6)
    xt = to_tpu(x).requires_grad_()
    x.requires_grad_()
    m(x).pow(2).sum().backward()
    mt(xt).pow(2).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad)
    torch.testing.assert_close(mt.weight.grad.cpu(), m.weight.grad)
    torch.testing.assert_close(mt.bias.grad.cpu(), m.bias.grad)
    assert dict(torch_tpu.metrics.fallback_counts()) == before


@pytest.mark.parametrize("dtype", FLOATS)
def test_group_norm(dtype):
    x = torch.randn(2, 6, 3, 4, dtype=dtype).requires_grad_()
    check(lambda x, w, b: F.group_norm(x, 3, w, b), x, _p(6, dtype), _p(6, dtype))
    check(lambda x: F.group_norm(x, 2), x)
    check(lambda x, w, b: F.group_norm(x, 6, w, b), torch.randn(3, 6, 5, dtype=dtype).requires_grad_(),
          _p(6, dtype), _p(6, dtype))


def test_batch_norm_with_update_updates_running_stats():
    x = torch.randn(4, 3, 5)
    w, b = torch.randn(3), torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    args = [x, w, b, rm, rv]
    dev = [t.to("tpu") for t in args]
    want = torch.ops.aten._batch_norm_with_update(*args, 0.1, 1e-5)
    got = torch.ops.aten._batch_norm_with_update(*dev, 0.1, 1e-5)
    for g, c in zip(got, want):
        assert g.device.type == "tpu" and g.dtype == c.dtype
        torch.testing.assert_close(g.cpu(), c, atol=1e-5, rtol=1e-5)
    for g, c in zip(dev[3:], args[3:]):  # running stats updated in place, as on CPU
        torch.testing.assert_close(g.cpu(), c)
    check(lambda x, w, b, rm, rv: torch.ops.aten._batch_norm_with_update(x, w, b, rm, rv, 0.1, 1e-5)[0],
          x.requires_grad_(), w.requires_grad_(), b.requires_grad_(), rm.clone(), rv.clone())


@pytest.mark.parametrize("dim", [0, -1, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_norm_gradients_on_tpu(dim, dtype):
    """weight_norm's fused backward (_weight_norm_interface_backward, dim first or last; another dim
    takes PyTorch's differentiable path) runs on tpu, not on the CPU fallback: gradients of g, v and
    the bias equal CPU's (bfloat16: to its rounding)."""
    import copy
    import torch_tpu
    torch.manual_seed(0)
    nn = torch.nn
    base = nn.Conv1d(4, 6, 3).to(dtype)
    tpu = nn.utils.parametrizations.weight_norm(copy.deepcopy(base).to("tpu"), dim=dim)
    cpu = nn.utils.parametrizations.weight_norm(base, dim=dim)
    x = torch.randn(2, 4, 9, dtype=dtype)
    torch_tpu.metrics.reset()
    (cpu(x).float() ** 2).sum().backward()
    (tpu(x.to("tpu")).float() ** 2).sum().backward()
    assert torch_tpu.metrics.fallback_counts() == {}
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.02, "rtol": 0.016}
    for pc, pt in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(pt.grad.cpu(), pc.grad, **tol)
