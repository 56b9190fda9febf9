"""An operand updated in place, then read again, gives the product of its new values (issue 50).

XLA:CPU's XNNPACK dot (xla-cpu-pjrt 0.0.1) packed a dot's right-hand parameter once and reused the
packing while the parameter's buffer had the same address; torch_tpu writes a donated input's result
where the input was, so `g @ w` after `w.add_(1)` returned the old product. torch_tpu turns XNNPACK
off for the CPU plugin (plugins.own_xla_flag); these tests fail with it on."""
import os

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import plugins, runtime

from helpers import run_python

TPU = torch.device("tpu")

# The shapes: stale for the first four with XNNPACK on, fine for the last three.
SHAPES = [(128, 784, 400), (100, 784, 400), (128, 1024, 256), (128, 400, 784), (64, 784, 400),
          (128, 256, 256), (128, 128, 9216)]


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("mode", ["strict", "debug", "fused"])
def test_matmul_after_in_place_update_reads_new_values(m, k, n, mode):
    g, w = torch.randn(m, k), torch.randn(k, n)
    with torch_tpu.eager_mode(mode):
        gt, wt = g.to(TPU), w.to(TPU)
        before = (gt @ wt).cpu()
        wt.add_(1.0)  # in place, as optimizer.step() does
        after = (gt @ wt).cpu()
    assert _rel(before, g @ w) < 1e-5
    assert _rel(after, g @ (w + 1)) < 1e-5, "the product read w as it was before add_"


@pytest.mark.parametrize("update", ["copy_", "view", "out", "sgd"])
def test_layers_read_their_updated_weights(update):
    """linear, bmm and conv2d after copy_, a write through a view, an out= write, an SGD step."""
    x, w, xb, wb = torch.randn(128, 784), torch.randn(400, 784), torch.randn(4, 128, 256), torch.randn(4, 256, 256)
    xi, wi = torch.randn(8, 16, 14, 14), torch.randn(32, 16, 3, 3)
    ops = [(F.linear, x, w), (torch.bmm, xb, wb), (lambda a, b: F.conv2d(a, b, padding=1), xi, wi)]
    for fn, a, b in ops:
        at, bt = a.to(TPU), b.to(TPU)
        fn(at, bt).cpu()
        new = b.clone()
        if update == "copy_":
            new = torch.randn_like(b)
            bt.copy_(new.to(TPU))
        elif update == "view":
            new[:1] *= 3
            bt[:1].mul_(3)
        elif update == "out":
            new = b + b
            torch.add(bt, bt, out=bt)
        else:
            p = torch.nn.Parameter(bt)
            p.grad = torch.ones_like(p)
            torch.optim.SGD([p], lr=0.5).step()
            new = b - 0.5
        assert _rel(fn(at, bt).cpu(), fn(a, new)) < 1e-5, f"{update} then {fn}: stale operand"


def test_compiled_step_reads_weights_its_previous_call_donated():
    """A compiled graph that updates its input in place (donated) and a matmul reading it next."""
    w0, g = torch.randn(784, 400), torch.randn(128, 784)

    @torch.compile(backend="tpu", dynamic=False)
    def step(g, w):
        y = g @ w
        w.add_(0.5)
        return y

    wt, gt = w0.to(TPU), g.to(TPU)
    for i in range(3):
        assert _rel(step(gt, wt).cpu(), g @ (w0 + 0.5 * i)) < 1e-5, f"call {i} read a stale w"


@pytest.mark.multiprocess
def test_xnnpack_is_off_for_the_cpu_plugin_and_a_users_setting_is_kept():
    torch.zeros(1, device=TPU).cpu()  # the runtime is configured
    if runtime._C.runtime.platform_name() != "cpu":
        pytest.skip("the flag is the CPU plugin's")
    assert plugins.NO_XNNPACK in os.environ["XLA_FLAGS"].split()
    # The key of a TPU program does not carry it (aot keys equal a TPU VM's).
    assert "xnnpack" not in plugins.keyed_xla_flags()
    out = run_python("import os, torch, torch_tpu\ntorch.zeros(1, device='tpu').cpu()\nprint(os.environ['XLA_FLAGS'])",
                     XLA_FLAGS="--xla_cpu_use_xnnpack=true")
    assert "--xla_cpu_use_xnnpack=true" in out and plugins.NO_XNNPACK not in out
