"""What training scripts use around the ops: activation checkpointing (both modes, eager and
compiled), torch.save / torch.load(map_location="tpu"), tpu Generators, gradient clipping without a
host sync, pinned DataLoader batches. CPU is the reference for values."""
import io

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import torch_tpu

TPU = "tpu"


def _model(dev):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2)).to(dev)


@pytest.mark.parametrize("reentrant", [True, False])
@pytest.mark.parametrize("compiled", [False, True])
def test_activation_checkpointing(reentrant, compiled):
    if compiled and reentrant:
        pytest.skip("torch.compile traces only the non-reentrant checkpoint (as on every device)")
    x = torch.randn(4, 8)
    grads = {}
    for dev in ("cpu", TPU):
        m = _model(dev)
        xd = x.clone().to(dev).requires_grad_()

        def f(inp):
            return checkpoint(m, inp, use_reentrant=reentrant).pow(2).sum()
        run = torch.compile(f, backend="tpu") if compiled and dev == TPU else f
        run(xd).backward()
        grads[dev] = (xd.grad.cpu(), m[0].weight.grad.cpu())
    for a, b in zip(grads[TPU], grads["cpu"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_save_and_load_model_and_optimizer_state_to_tpu():
    m = _model(TPU)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    m(torch.randn(4, 8, device=TPU)).sum().backward()
    opt.step()
    buf = io.BytesIO()
    torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    buf.seek(0)
    back = torch.load(buf, map_location=TPU)
    assert back["model"]["0.weight"].device.type == "tpu"
    assert back["opt"]["state"][0]["exp_avg"].device.type == "tpu"
    torch.testing.assert_close(back["model"]["0.weight"].cpu(), on_cpu["model"]["0.weight"])
    m2 = _model(TPU)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-2)
    m2.load_state_dict(back["model"])
    opt2.load_state_dict(back["opt"])
    torch.testing.assert_close(m2[0].weight.cpu(), m[0].weight.cpu())


def test_tpu_generator_reproduces_its_stream():
    g = torch.Generator(device=TPU)
    g.manual_seed(7)
    a = torch.randn(5, device=TPU, generator=g)
    g.manual_seed(7)
    b = torch.randn(5, device=TPU, generator=g)
    assert a.device.type == "tpu" and torch.equal(a.cpu(), b.cpu())


@torch_tpu.eager_mode("strict")  # counts host syncs
def test_clip_grad_norm_foreach_has_no_host_sync():
    m, mc = _model(TPU), _model("cpu")
    for p, pc in zip(m.parameters(), mc.parameters()):
        g = torch.randn_like(pc) * 10
        p.grad, pc.grad = g.to(TPU), g
    before = torch_tpu.metrics.counters()["host_syncs"]
    norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0, foreach=True)
    assert torch_tpu.metrics.counters()["host_syncs"] == before
    ref = torch.nn.utils.clip_grad_norm_(mc.parameters(), 1.0, foreach=True)
    torch.testing.assert_close(norm.cpu(), ref)
    for p, pc in zip(m.parameters(), mc.parameters()):
        torch.testing.assert_close(p.grad.cpu(), pc.grad)


def test_dataloader_pins_for_the_tpu():
    data = torch.utils.data.TensorDataset(torch.arange(8.0).reshape(8, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True, pin_memory_device=TPU)
    (batch,) = next(iter(loader))
    assert batch.is_pinned()
    torch.testing.assert_close(batch.to(TPU, non_blocking=True).cpu(), torch.arange(4.0).reshape(4, 1))
