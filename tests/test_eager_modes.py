"""The three eager modes: selection, and fused eager's meaning, caching and bounds."""
import copy
import os
import subprocess
import sys

import pytest
import torch

import torch_tpu
from torch_tpu.eager import fused


def test_select_modes():
    start = torch_tpu.get_eager_mode()
    with torch_tpu.eager_mode("debug"):
        assert torch_tpu.get_eager_mode() == "debug"
        with torch_tpu.eager_mode("fused"):
            assert torch_tpu.get_eager_mode() == "fused"
    assert torch_tpu.get_eager_mode() == start
    with pytest.raises(ValueError, match="unknown tpu eager mode"):
        torch_tpu.set_eager_mode("lazy")


@pytest.mark.parametrize("env,mode", [({"TPU_LAUNCH_BLOCKING": "1"}, "debug"),
                                      ({"TORCH_TPU_DEFER_AND_FUSE": "1"}, "fused"),
                                      ({"TORCH_TPU_EAGER_MODE": "fused"}, "fused"),
                                      ({}, "strict")])
@pytest.mark.multiprocess
def test_mode_from_environment(env, mode):
    clean = {k: v for k, v in os.environ.items()
             if k not in ("TPU_LAUNCH_BLOCKING", "TORCH_TPU_DEFER_AND_FUSE", "TORCH_TPU_EAGER_MODE")}
    r = subprocess.run([sys.executable, "-c", "import torch_tpu; print(torch_tpu.get_eager_mode())"],
                       capture_output=True, text=True, env={**clean, **env}, timeout=120)
    assert r.stdout.strip() == mode, r.stderr


def test_debug_waits_for_every_op():
    x = torch.ones(8, device="tpu")
    with torch_tpu.eager_mode("debug"):
        before = torch_tpu.metrics.counters()["host_syncs"]
        y = (x + 1) * 2
        assert torch_tpu.metrics.counters()["host_syncs"] - before >= 2
    torch.testing.assert_close(y.cpu(), torch.full((8,), 4.0))


def _train(mode, steps=5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(32, 6).to("tpu")
    y = torch.randint(0, 3, (32,)).to("tpu")
    losses = []
    with torch_tpu.eager_mode(mode):
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        losses = [l.item() for l in losses]
    return losses, [p.detach().cpu() for p in model.parameters()]


def test_fused_training_equals_strict():
    ls, ps = _train("strict")
    lf, pf = _train("fused")
    assert fused.pending() == 0
    torch.testing.assert_close(torch.tensor(lf), torch.tensor(ls), atol=1e-5, rtol=1e-5)
    for a, b in zip(pf, ps):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_fused_views_and_mutation_across_flushes():
    with torch_tpu.eager_mode("fused"):
        base = torch.zeros(4, 4, device="tpu")
        v = base[1:3, ::2]
        v.add_(1)
        base.t()[0].fill_(5)
        first = base.sum().item()           # a flush in the middle
        v.mul_(3)
        d = base.diagonal()
        d.sub_(1)
        out = base.clone()
    ref = torch.zeros(4, 4)
    rv = ref[1:3, ::2]
    rv.add_(1)
    ref.t()[0].fill_(5)
    assert first == ref.sum().item()
    rv.mul_(3)
    ref.diagonal().sub_(1)
    torch.testing.assert_close(out.cpu(), ref)
    torch.testing.assert_close(base.cpu(), ref)


_SHIFTS = {  # writes of part of a storage with a value computed from that storage in the same run
    "clone": lambda y: y.__setitem__(slice(1, 3), y[0:2].clone()),
    "plus": lambda y: y.__setitem__(slice(1, 3), y[:2] + 10),
    "shift": lambda y: y.__setitem__(slice(1, None), y[:-1] + 0),
    "add_": lambda y: y[1:].add_(y[:-1].clone()),
    "chain": lambda y: y.__setitem__(slice(1, None), torch.tanh(y[:-1] * 2) - 1),
    "strided": lambda y: y.__setitem__((slice(1, None), slice(None, None, 2)), y[:-1, ::2] + 0),
    "columns": lambda y: y.__setitem__((slice(None), slice(1, None)), y[:, :-1] * 2),
}


@pytest.mark.parametrize("width", [1, 2, 4])
@pytest.mark.parametrize("name", list(_SHIFTS))
def test_fused_write_of_a_value_computed_from_its_own_storage(name, width):
    """XLA:CPU ran y[1:3] = y[0:2].clone() inside one fused program as an in-place loop reading rows
    it had already written (rows 1 and 2 both became row 0): such a write starts a new run."""
    write = _SHIFTS[name]
    ref = torch.arange(4.0 * width).view(4, width)
    write(ref)
    with torch_tpu.eager_mode("fused"):
        y = torch.arange(4.0 * width).view(4, width).to("tpu")
        write(y)
        out = y * 1  # read in the same run as the write
    torch.testing.assert_close(out.cpu(), ref * 1)


def test_fused_frame_stack_loop_equals_cpu():
    """An RL frame stack: each step shifts the buffer down a row and writes the new frame on top."""
    torch.manual_seed(0)
    net = torch.nn.Linear(12, 3)
    obs = torch.randn(6, 3)
    results = {}
    for device in ("cpu", "tpu"):
        with torch_tpu.eager_mode("fused" if device == "tpu" else "strict"):
            m = copy.deepcopy(net).to(device)
            buf, o = torch.arange(12.0).view(4, 3).to(device), obs.to(device)
            outs = []
            for t in range(6):
                buf[1:] = buf[:-1].clone()
                buf[0] = o[t]
                outs.append(m(buf.flatten()))
            results[device] = torch.stack(outs).detach().cpu()
    torch.testing.assert_close(results["tpu"], results["cpu"])


@torch_tpu.eager_mode("strict")  # leaving fused mode for strict (also when the suite runs fused)
def test_fused_chain_is_one_program_without_intermediates():
    x = torch.randn(64, device="tpu")
    torch.tpu.synchronize()
    before = torch_tpu.metrics.counters()["executions"]
    with torch_tpu.eager_mode("fused"):
        y = x
        for i in range(20):
            y = y * 1.01 + 0.1 if i % 2 else torch.tanh(y)
    assert fused.pending() == 0  # leaving fused mode runs what was recorded
    assert torch_tpu.metrics.counters()["executions"] - before == 1
    ref = x.cpu()
    for i in range(20):
        ref = ref * 1.01 + 0.1 if i % 2 else torch.tanh(ref)
    torch.testing.assert_close(y.cpu(), ref)


def _fused_compiles():
    return torch_tpu.metrics.counters()["fused_compiles"]


def test_fused_loop_without_syncs_compiles_nothing_after_its_first_steps():
    # Cut points are content-defined over the op stream, so a loop with no host read inside is cut
    # at the same places every step and its programs repeat. This loop's period (3 ops) is shorter
    # than the cut window: its runs reach the length cap, each a whole number of periods.
    w = torch.randn(16, 16, device="tpu")
    x = torch.randn(8, 16, device="tpu")
    compiles = []
    with torch_tpu.eager_mode("fused"):
        for _ in range(40):
            for _ in range(30):  # a "step" of 90 ops with no host read inside
                x = torch.tanh(x @ w) + 0.5
            compiles.append(_fused_compiles())
        x.sum().item()
    assert compiles[-1] == compiles[19], compiles  # no new programs once the runs line up
    assert compiles[-1] - compiles[0] <= 3, compiles


def test_fused_training_loop_without_syncs_compiles_nothing_after_its_first_steps():
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.LayerNorm(32)]
    model = torch.nn.Sequential(*layers).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32, device="tpu"), torch.randn(16, 32, device="tpu")
    compiles, losses = [], []
    with torch_tpu.eager_mode("fused"):
        for _ in range(16):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            compiles.append(_fused_compiles())
        first, last = losses[0].item(), losses[-1].item()
    assert last < first
    assert compiles[-1] == compiles[5], compiles


def test_fused_memory_is_bounded():
    x = torch.zeros(16, device="tpu")
    longest = 0
    with torch_tpu.eager_mode("fused"):
        for _ in range(3 * fused.MAX_OPS):
            x.add_(1)
            longest = max(longest, fused.pending())
    assert longest < fused.MAX_OPS
    torch.testing.assert_close(x.cpu(), torch.full((16,), 3.0 * fused.MAX_OPS))


def test_fused_run_reads_a_new_storage_as_another_dtype():
    """A complex result recorded in a fused run, then read through view_as_real in the same run."""
    a = torch.randn(3, 2, dtype=torch.complex64)
    with torch_tpu.eager_mode("fused"):
        z = a.to("tpu") * (1 + 2j)
        r = torch.view_as_real(z) * 2
        got = r.cpu()
    torch.testing.assert_close(got, torch.view_as_real(a * (1 + 2j)) * 2)


def test_two_threads_in_different_modes():
    """Each thread's eager_mode block is its own: one thread records (fused) while the other runs
    strict and debug ops; both get CPU's results, and their backward passes run in their modes."""
    import threading
    results, errors = {}, []

    def work(mode, seed):
        try:
            torch.manual_seed(seed)
            w = torch.randn(8, 8, requires_grad=True)
            x = torch.randn(4, 8)
            wt = w.detach().to("tpu").requires_grad_()
            with torch_tpu.eager_mode(mode):
                assert torch_tpu.get_eager_mode() == mode
                outs = []
                for _ in range(40):
                    y = torch.tanh(x.to("tpu") @ wt).sum()
                    y.backward()
                    outs.append(y.detach())
                got = [o.item() for o in outs]
            ref = torch.tanh(x @ w).sum()
            ref.backward()
            results[mode] = (got, ref.item(), wt.grad.cpu(), w.grad * 40)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    before = torch_tpu.get_eager_mode()
    threads = [threading.Thread(target=work, args=(m, s)) for m, s in (("fused", 1), ("strict", 2), ("debug", 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for mode, (got, ref, grad, ref_grad) in results.items():
        assert all(abs(g - ref) < 1e-4 for g in got), mode
        torch.testing.assert_close(grad, ref_grad, atol=1e-4, rtol=1e-4)
    assert torch_tpu.get_eager_mode() == before
