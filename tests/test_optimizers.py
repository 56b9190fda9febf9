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
    ("Adagrad", dict(lr=0.1)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01, weight_decay=0.05, maximize=True)),
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


@pytest.mark.parametrize("foreach", [True, False, "fused"])
@pytest.mark.parametrize("name,kw", CONFIGS)
def test_optimizer_matches_cpu(name, kw, foreach):
    if foreach == "fused":  # torch.optim's fused step: _fused_adam(w)_ / sgd_ / adagrad_ (lowering/optimizers.py)
        kw, foreach = dict(kw, fused=True), None
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


@pytest.mark.parametrize("op", [torch._fused_adam_, torch._fused_adamw_])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_fused_adam_op_with_grad_scale_found_inf_tensor_lr_and_bf16(op, amsgrad):
    # The op as GradScaler and capturable optimizers call it: grads unscaled (and written back), a
    # step skipped where found_inf is 1, a tensor learning rate; bfloat16 state in float32 math.
    g = torch.Generator().manual_seed(2)
    for dtype in (torch.float32, torch.bfloat16):
        for found in (0.0, 1.0):
            lists = [[torch.randn(3, 4, generator=g).to(dtype) for _ in range(2)] for _ in range(4)]
            lists[3] = [t.abs() for t in lists[3]]  # exp_avg_sq >= 0
            mx = [t.abs() for t in lists[3]] if amsgrad else []
            steps = [torch.tensor(3.0), torch.tensor(7.0)]
            kw = dict(beta1=0.9, beta2=0.99, weight_decay=0.05, eps=1e-6, amsgrad=amsgrad, maximize=False)
            cpu = [[t.clone() for t in lst] for lst in lists + [mx]]
            op(*cpu, steps, lr=torch.tensor(0.01), grad_scale=torch.tensor(4.0), found_inf=torch.tensor(found), **kw)
            dev = [[t.to(TPU) for t in lst] for lst in lists + [mx]]
            op(*dev, [s.to(TPU) for s in steps], lr=torch.tensor(0.01).to(TPU), grad_scale=torch.tensor(4.0).to(TPU),
               found_inf=torch.tensor(found).to(TPU), **kw)
            for lc, lt in zip(cpu, dev):
                for c, t in zip(lc, lt):
                    torch.testing.assert_close(t.cpu(), c, atol=1e-5, rtol=1e-5)


def _fused_equal_to_cpu(op, lists, more_lists, tensors: dict, kw: dict) -> None:
    """op (a fused optimizer step, in place) on CPU copies of `lists` (+ `more_lists`, e.g. steps) and
    on tpu copies, with the tensor keyword arguments `tensors` moved too: no CPU fallback on tpu, and
    every list equal to CPU's after it."""
    cpu = [[t.clone() for t in lst] for lst in lists]
    op(*cpu, *[[t.clone() for t in lst] for lst in more_lists], **tensors, **kw)
    dev = [[t.to(TPU) for t in lst] for lst in lists]
    before = sum(torch_tpu.metrics.fallback_counts().values())
    op(*dev, *[[t.to(TPU) for t in lst] for lst in more_lists], **{k: v.to(TPU) for k, v in tensors.items()}, **kw)
    assert sum(torch_tpu.metrics.fallback_counts().values()) == before
    for lc, lt in zip(cpu, dev):
        for c, t in zip(lc, lt):
            torch.testing.assert_close(t.cpu(), c, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("momentum,nesterov,first", [(0.0, False, False), (0.9, False, True), (0.9, False, False),
                                                     (0.9, True, False)])
def test_fused_sgd_op_with_grad_scale_found_inf_tensor_lr_and_bf16(momentum, nesterov, first):
    """SGD(fused=True)'s op as GradScaler calls it (it took the CPU fallback): equal to CPU's kernel."""
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16):
        for found in (0.0, 1.0):
            lists = [[torch.randn(3, 4, generator=g).to(dtype) for _ in range(2)] for _ in range(3)]
            if momentum == 0:
                lists[2] = []
            kw = dict(weight_decay=0.05, momentum=momentum, dampening=0.1 if not nesterov else 0.0,
                      nesterov=nesterov, maximize=not nesterov, is_first_step=first)
            _fused_equal_to_cpu(torch._fused_sgd_, lists, [],
                                dict(lr=torch.tensor(0.1), grad_scale=torch.tensor(4.0), found_inf=torch.tensor(found)),
                                kw)


def test_fused_adagrad_op_with_grad_scale_found_inf_and_bf16():
    g = torch.Generator().manual_seed(4)
    for dtype in (torch.float32, torch.bfloat16):
        for found in (0.0, 1.0):
            lists = [[torch.randn(3, 4, generator=g).to(dtype) for _ in range(2)] for _ in range(3)]
            lists[2] = [t.abs() for t in lists[2]]  # state sums >= 0
            steps = [torch.tensor(3.0), torch.tensor(7.0)]
            kw = dict(lr=0.1, lr_decay=0.01, weight_decay=0.05, eps=1e-10, maximize=False)
            _fused_equal_to_cpu(torch._fused_adagrad_, lists, [steps],
                                dict(grad_scale=torch.tensor(4.0), found_inf=torch.tensor(found)), kw)


def test_a_learning_rate_schedule_compiles_nothing_new():
    # lr, betas, eps and weight decay are operands of the fused step (float_operands): a new learning
    # rate every step (Trainer's linear schedule) reuses the step's program.
    model = _model().to(TPU)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0 / (e + 1))
    x, y = torch.randn(16, 4).to(TPU), torch.randn(16, 2).to(TPU)
    _train(model, opt, x, y, steps=2)
    sched.step()
    before = torch_tpu.metrics.counters()["compiles"]
    for _ in range(3):
        _train(model, opt, x, y, steps=1)
        sched.step()
    assert torch_tpu.metrics.counters()["compiles"] == before
