"""torch.autocast("tpu") with CUDA's op policies (cross_entropy_loss in float32 as on CPU; csrc/aten/autocast.cc) and GradScaler's ops on the
device (lowering/amp.py). CPU's kernels are the reference for values."""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu

TPU = "tpu"


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_op_classes_follow_cudas_policy(low):
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    at, bt = a.to(TPU), b.to(TPU)
    img, w = torch.randn(1, 2, 6, 6, device=TPU), torch.randn(3, 2, 3, 3, device=TPU)
    with torch.autocast(TPU, dtype=low):
        lowered = {"mm": at @ bt, "linear": F.linear(at, bt), "conv2d": F.conv2d(img, w),
                   "baddbmm": torch.baddbmm(at[None], at[None], bt[None])}
        half = at.to(low)
        float32 = {"exp": torch.exp(half), "softmax": torch.softmax(half, -1), "log_softmax": F.log_softmax(half, -1),
                   "layer_norm": F.layer_norm(half, (8,)), "mse_loss": F.mse_loss(half, half),
                   "sum": half.sum(), "cumsum": half.cumsum(0)}
        promoted = torch.addcmul(half, at, at)   # promote: the widest input type
        untouched = at + bt                       # not on any list: as without autocast
    assert {k: v.dtype for k, v in lowered.items()} == dict.fromkeys(lowered, low)
    assert {k: v.dtype for k, v in float32.items()} == dict.fromkeys(float32, torch.float32)
    assert promoted.dtype == torch.float32 and untouched.dtype == torch.float32
    torch.testing.assert_close(lowered["mm"].cpu(), (a.to(low) @ b.to(low)), rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(float32["softmax"].cpu(), torch.softmax(a.to(low).float(), -1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kwargs", [{"reduction": "none"}, {"label_smoothing": 0.1, "ignore_index": 2}])
def test_cross_entropy_is_float32_as_on_cpu(low, kwargs):
    # CUDA's lists would leave its log_softmax at the logits' precision (a float32 loss rounded like
    # bfloat16); CPU's autocast and PyTorch/XLA's TPU autocast compute the loss in float32.
    torch.manual_seed(0)
    logits, y = torch.randn(6, 10).to(low), torch.randint(0, 10, (6,))
    with torch.autocast("cpu", dtype=low):
        want = F.cross_entropy(logits, y, **kwargs)
    with torch.autocast(TPU, dtype=low):
        got = F.cross_entropy(logits.to(TPU), y.to(TPU), **kwargs)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)


def test_autocast_trains_with_backward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(TPU)
    x, y = torch.randn(8, 16, device=TPU), torch.randint(0, 4, (8,), device=TPU)
    with torch.autocast(TPU, dtype=torch.bfloat16):
        logits = model(x)
        loss = F.cross_entropy(logits, y)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    assert torch.tpu.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]


def test_grad_scaler_ops_match_cpu_and_stay_on_the_device():
    grads = [torch.randn(5, dtype=torch.float16), torch.tensor([1.0, float("inf")], dtype=torch.float16),
             torch.randn(3, 2)]
    for case in (grads[:1] + grads[2:], grads):
        ref = [g.clone() for g in case]
        dev = [g.to(TPU) for g in case]
        found_r, found_d = torch.zeros(1), torch.zeros(1, device=TPU)
        inv = torch.full((1,), 0.25)
        before = dict(torch_tpu.metrics.fallback_counts())
        torch._amp_foreach_non_finite_check_and_unscale_(ref, found_r, inv)
        torch._amp_foreach_non_finite_check_and_unscale_(dev, found_d, inv.to(TPU))
        assert torch_tpu.metrics.fallback_counts() == before
        for r, d in zip(ref, dev):
            torch.testing.assert_close(d.cpu(), r, equal_nan=True)
        torch.testing.assert_close(found_d.cpu(), found_r)
    for found in (0.0, 1.0):
        for tracker in (0, 1):
            s_r, t_r = torch.full((1,), 1024.0), torch.full((1,), tracker, dtype=torch.int32)
            s_d, t_d = s_r.to(TPU), t_r.to(TPU)
            f = torch.full((1,), found)
            torch._amp_update_scale_(s_r, t_r, f, 2.0, 0.5, 2)
            torch._amp_update_scale_(s_d, t_d, f.to(TPU), 2.0, 0.5, 2)
            assert (s_d.item(), t_d.item()) == (s_r.item(), t_r.item())


def test_grad_scaler_training_loop_matches_cpu():
    def run(dev):
        torch.manual_seed(0)
        m = torch.nn.Linear(8, 4).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(dev, init_scale=2.0 ** 16, growth_interval=2)
        x = torch.randn(16, 8).to(dev)
        scales = []
        for i in range(5):
            loss = m(x).pow(2).mean() * (1e38 if i == 2 else 1.0)  # step 2 overflows: skipped, backed off
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            scales.append(scaler.get_scale())
        return scales, m.weight.detach().cpu()

    (s_t, w_t), (s_c, w_c) = run(TPU), run("cpu")
    assert s_t == s_c
    torch.testing.assert_close(w_t, w_c)


def test_bfloat16_is_the_default():
    # The TPU's low precision, as Google's TorchTPU defaults to (PyTorch's PrivateUse1 default is float16).
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    a = torch.randn(4, 4, device="tpu")
    with torch.autocast("tpu"):
        assert (a @ a).dtype == torch.bfloat16
    with torch.autocast("tpu", dtype=torch.float16):
        assert (a @ a).dtype == torch.float16
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
