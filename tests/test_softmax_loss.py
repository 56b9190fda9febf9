import pytest
import torch
import torch.nn.functional as F
import torch_tpu

from helpers import check, to_tpu

FLOATS = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax(dtype, dim):
    x = torch.randn(3, 4, 5, dtype=dtype).requires_grad_()
    check(lambda x: F.softmax(x, dim), x)
    check(lambda x: F.log_softmax(x, dim), x)


def test_softmax_half_to_float_and_dtype():
    x = torch.randn(3, 4, dtype=torch.bfloat16).requires_grad_()
    check(lambda x: F.softmax(x, 1, dtype=torch.float32), x)
    check(lambda x: F.log_softmax(x, 0, dtype=torch.float32), x)


def test_softmax_edge_cases():
    check(lambda x: F.softmax(x, 0), torch.tensor(3.0).requires_grad_())
    check(lambda x: F.log_softmax(x, -1), torch.tensor(3.0).requires_grad_())
    check(lambda x: F.softmax(x, 1), torch.randn(0, 4))
    check(lambda x: F.log_softmax(x, 0), torch.randn(0, 4))
    x = torch.tensor([[0., float("-inf"), 1.], [float("-inf")] * 3, [float("inf"), 0., 1.]])
    check(lambda x: F.softmax(x, 1), x)
    check(lambda x: F.log_softmax(x, 1), x)
    check(lambda x: F.softmax(x.t(), 0), torch.randn(5, 3).requires_grad_())  # non-contiguous


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_nll_loss(dtype, reduction):
    x = torch.randn(6, 5, dtype=dtype).log_softmax(1).detach().requires_grad_()
    t = torch.tensor([0, 4, 2, 2, 1, 3])
    w = torch.rand(5, dtype=dtype)
    check(lambda x, t: F.nll_loss(x, t, reduction=reduction), x, t)
    check(lambda x, t, w: F.nll_loss(x, t, weight=w, reduction=reduction), x, t, w)
    check(lambda x, t, w: F.nll_loss(x, t, weight=w, ignore_index=2, reduction=reduction), x, t, w)
    check(lambda x, t: F.nll_loss(x, t, ignore_index=-1, reduction=reduction), x, torch.tensor([0, -1, 2, -1, 1, 3]))
    check(lambda x, t: F.nll_loss(x.t()[:, :5:2].t(), t[:3], reduction=reduction), x, t)  # non-contiguous
    # no batch dim
    check(lambda x, t: F.nll_loss(x[0], t, reduction=reduction), x, torch.tensor(3))


def test_nll_loss_all_ignored_and_empty():
    x = torch.randn(3, 4).requires_grad_()
    check(lambda x, t: F.nll_loss(x, t), x, torch.tensor([-100, -100, -100]))
    check(lambda x, t: F.nll_loss(x, t, reduction="sum"), torch.randn(0, 4).requires_grad_(),
          torch.zeros(0, dtype=torch.long))


def test_nll_loss_every_target_ignored_by_a_class_index():
    """A batch whose targets are all the ignore_index, a valid class (padding as class 0): the mean's
    total weight is 0 and the loss NaN on CPU too, but CPU's gradient is 0 (its kernel skips ignored
    targets); tpu's was NaN in the ignored class's column, and a training step then wrote NaN into
    every weight (a silent difference: the logged loss is NaN on both)."""
    x = torch.randn(4, 6).requires_grad_()
    pad = torch.zeros(4, dtype=torch.long)
    check(lambda x, t: F.nll_loss(x.log_softmax(1), t, ignore_index=0), x, pad)
    check(lambda x, t: F.cross_entropy(x, t, ignore_index=0), x, pad)
    check(lambda x, t: F.cross_entropy(x, t, ignore_index=0, label_smoothing=0.1), x, pad)
    check(lambda x, t, w: F.cross_entropy(x, t, weight=w, ignore_index=0), x, pad, torch.rand(6))
    check(lambda x, t: F.cross_entropy(x, t, ignore_index=2), torch.randn(2, 3, 4, 5).requires_grad_(),
          torch.full((2, 4, 5), 2))  # nll_loss2d
    check(lambda x, t: F.nll_loss(x, t, ignore_index=3), torch.randn(6).log_softmax(0).requires_grad_(),
          torch.tensor(3))  # no batch dim
    # a training step on such a batch leaves the weights as they were, as on CPU
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 3)
    lin_t = torch.nn.Linear(6, 3).to("tpu")
    lin_t.load_state_dict(lin.state_dict())
    for m, dev in ((lin, "cpu"), (lin_t, "tpu")):
        F.cross_entropy(m(x.detach().to(dev)), pad.to(dev), ignore_index=0).backward()
        torch.optim.SGD(m.parameters(), lr=0.1).step()
    torch.testing.assert_close(lin_t.weight.detach().cpu(), lin.weight.detach())
    assert not lin_t.weight.detach().isnan().any().item()

    @torch.compile(backend="tpu")
    def loss_grad(x, t):
        return torch.autograd.grad(F.cross_entropy(x, t, ignore_index=0), x)[0]
    xt = x.detach().to("tpu").requires_grad_()
    assert torch.equal(loss_grad(xt, pad.to("tpu")).cpu(), torch.zeros(4, 6))


def test_nll_loss_out_of_range():
    x = to_tpu(torch.randn(3, 4))
    for t in ([0, 4, 1], [0, -2, 1]):
        with pytest.raises(IndexError, match="out of bounds"):
            F.nll_loss(x, to_tpu(torch.tensor(t))).item()  # checked on the device: raised at the read
    with pytest.raises(IndexError, match="out of bounds"):
        F.cross_entropy(to_tpu(torch.randn(2, 3, 4, 4)), to_tpu(torch.full((2, 4, 4), 3))).item()
    assert F.nll_loss(x, to_tpu(torch.tensor([0, 3, -100]))).isfinite().item()  # ignore_index is never out of range


@pytest.mark.parametrize("dtype", FLOATS)
def test_cross_entropy(dtype):
    x = torch.randn(4, 5, dtype=dtype).requires_grad_()
    t = torch.tensor([1, 0, 4, 2])
    check(lambda x, t: F.cross_entropy(x, t), x, t)
    check(lambda x, t, w: F.cross_entropy(x, t, weight=w, reduction="sum"), x, t, torch.rand(5, dtype=dtype))
    check(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), x, t)
    # class-index targets over spatial dims (nll_loss2d) and probabilities as targets
    x4 = torch.randn(2, 3, 4, 5, dtype=dtype).requires_grad_()
    t4 = torch.randint(0, 3, (2, 4, 5))
    check(lambda x, t: F.cross_entropy(x, t), x4, t4)
    check(lambda x, t: F.cross_entropy(x, t, reduction="none", ignore_index=1), x4, t4)
    check(lambda x, p: F.cross_entropy(x, p), x, torch.randn(4, 5, dtype=dtype).softmax(1))


def test_cross_entropy_module_backward():
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 4)
    x, t = torch.randn(5, 6), torch.tensor([0, 3, 1, 1, 2])
    loss_c = F.cross_entropy(lin(x), t)
    loss_c.backward()
    lin_t = torch.nn.Linear(6, 4)
    before = dict(torch_tpu.metrics.fallback_counts())
    lin_t.load_state_dict(lin.state_dict())
    lin_t = lin_t.to("tpu")
    loss_t = F.cross_entropy(lin_t(to_tpu(x)), to_tpu(t))
    loss_t.backward()
    torch.testing.assert_close(loss_t.cpu(), loss_c)
    torch.testing.assert_close(lin_t.weight.grad.cpu(), lin.weight.grad)
    assert dict(torch_tpu.metrics.fallback_counts()) == before


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_mse_loss(dtype, reduction):
    x = torch.randn(3, 4, dtype=dtype).requires_grad_()
    y = torch.randn(3, 4, dtype=dtype).requires_grad_()
    check(lambda x, y: F.mse_loss(x, y, reduction=reduction), x, y)
    check(lambda x: F.mse_loss(x, torch.zeros_like(x), reduction=reduction), torch.tensor(2.0).requires_grad_())
    check(lambda x, y: F.mse_loss(x.t(), y.t(), reduction=reduction), x, y)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_binary_cross_entropy(dtype, reduction):
    p = torch.rand(3, 4, dtype=dtype).clamp(0.05, 0.95).requires_grad_()
    y = torch.rand(3, 4, dtype=dtype)
    check(lambda p, y: F.binary_cross_entropy(p, y, reduction=reduction), p, y)
    check(lambda p, y, w: F.binary_cross_entropy(p, y, weight=w, reduction=reduction), p, y,
          torch.rand(4, dtype=dtype))
    # log clamped at -100 at exact 0 / 1
    check(lambda p, y: F.binary_cross_entropy(p, y, reduction=reduction),
          torch.tensor([0., 1., 0.5]), torch.tensor([1., 0., 1.]), grad=False)


def test_binary_cross_entropy_range_error():
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(to_tpu(torch.tensor([1.5, 0.2])), to_tpu(torch.tensor([1., 0.])))
