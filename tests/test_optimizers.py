import copy

import pytest
import torch

import torch_tpu

TPU = torch.device("tpu")

CONFIGS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("SGD", dict(lr=0.1, momentum=0.5, dampening=0.1)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.01, weight_decay=0.1, amsgrad=True)),
    ("AdamW", dict(lr=0.01, weight_decay=0.1)),
    ("AdamW", dict(lr=0.01, amsgrad=True)),
]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _train(model, opt, x, y, steps=5):
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
    return loss


@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("name,kw", CONFIGS)
def test_optimizer_matches_cpu(name, kw, foreach):
    cpu = _model()
    tpu = copy.deepcopy(cpu).to(TPU)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 4, generator=g), torch.randn(16, 2, generator=g)
    opt_c = getattr(torch.optim, name)(cpu.parameters(), foreach=foreach, **kw)
    opt_t = getattr(torch.optim, name)(tpu.parameters(), foreach=foreach, **kw)
    before = sum(torch_tpu.metrics.fallback_counts().values())
    lc = _train(cpu, opt_c, x, y)
    lt = _train(tpu, opt_t, x.to(TPU), y.to(TPU))
    assert sum(torch_tpu.metrics.fallback_counts().values()) == before, torch_tpu.metrics.fallback_counts()
    torch.testing.assert_close(lt.detach().cpu(), lc.detach(), atol=1e-5, rtol=1e-5)
    for pc, pt in zip(cpu.parameters(), tpu.parameters()):
        assert pt.device.type == "tpu"
        torch.testing.assert_close(pt.detach().cpu(), pc.detach(), atol=1e-5, rtol=1e-5)
    # optimizer state lives on the device too (except Adam's step counters, on CPU by design)
    for st in opt_t.state.values():
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and k != "step":
                assert v.device.type == "tpu"
