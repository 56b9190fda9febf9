"""The plan memo (torch_tpu/eager/plan_memo.py): a new process with a warm disk cache builds no eager
plan for a call key an earlier process built, and computes what a cold process computes (values,
errors, warnings); a damaged or cut memo file costs only builds."""
import json
import os
import subprocess
import sys

import pytest

PROGRAM = r"""
import json, sys, warnings
warnings.filterwarnings("ignore", message="No TPU here")
import torch, torch_tpu
import torch.nn.functional as F
from torch_tpu.eager import kernel

builds = [0]
_build = kernel.Kernel._build
def counting(self, *a):
    builds[0] += 1
    return _build(self, *a)
kernel.Kernel._build = counting

torch.manual_seed(0)
conv = torch.nn.Conv2d(3, 4, 3)
x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
idx = torch.tensor([[1, 0], [3, 2]])

def step(dev):
    c = conv.to(dev)
    xd = x.to(dev).requires_grad_()
    y = F.relu(c(xd))                             # channels_last results: fresh specs with strides
    m, i = y.flatten(2).max(-1)                   # a tuple of results
    z = torch.cat([m, i.float()], 1).sum() + y.gather(3, idx.to(dev).expand(2, 4, 2, 2)).mean()
    buf = torch.zeros(4, device=dev)
    buf[1:3].add_(m[0, :2])                       # an in-place write through a view at an offset
    drop = F.dropout(torch.ones(64, device=dev), 0.5) if dev != "cpu" else None
    z.backward()
    return [z.detach().cpu(), xd.grad.cpu(), buf.cpu()], drop

torch.manual_seed(1)
got, drop = step("tpu")
want, _ = step("cpu")
ok = all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))
ok = ok and got[1].stride() == want[1].stride()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    torch.ones(1, device="tpu").var().item()
warned = [str(m.message) for m in w]
try:
    torch.mm(torch.ones(2, 3, device="tpu"), torch.ones(2, 3, device="tpu"))
    err = None
except RuntimeError as e:
    err = str(e)
print(json.dumps({"ok": ok, "builds": builds[0], "drop": drop.tolist(), "warned": warned, "err": err}))
"""


def run(cache_dir, env=None):
    env = {**os.environ, "TORCH_TPU_CACHE_DIR": str(cache_dir), **(env or {})}
    r = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def memo_files(d):
    return [os.path.join(d, n) for n in os.listdir(d) if n.startswith("plans-") and n.endswith(".jsonl")]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_warm_process_builds_only_what_warned_or_failed(tmp_path):
    cold = run(tmp_path)
    assert cold["ok"] and cold["builds"] > 20 and cold["err"] and cold["warned"]
    (memo,) = memo_files(tmp_path)
    lines = open(memo).read().splitlines()
    assert any(json.loads(x)[0].startswith("cpu/aten::convolution") for x in lines)
    warm = run(tmp_path)
    assert warm["ok"] and warm == {**cold, "builds": warm["builds"]}  # same values, dropout mask, error, warning
    # Built again: only the call whose meta raised (mm) and the one that warned (var of one element).
    assert warm["builds"] == 2, warm
    assert open(memo).read().splitlines() == lines  # nothing new to keep


@pytest.mark.multiprocess
@pytest.mark.slow
def test_damaged_or_cut_memo_costs_only_builds(tmp_path):
    cold = run(tmp_path)
    (memo,) = memo_files(tmp_path)
    lines = open(memo).read().splitlines()
    # a torn last line (a short write), a foreign line, records that do not decode, then the rest
    bad = ["[1, 2]"] + [json.dumps([json.loads(x)[0], {"plan": "x"}]) for x in lines[:5]] + lines[5:]
    with open(memo, "w") as f:
        f.write("\n".join(bad) + "\n" + lines[0][:50])
    again = run(tmp_path)
    assert again["ok"] and again["drop"] == cold["drop"] and again["err"] == cold["err"]
    assert 2 < again["builds"] < cold["builds"]
    # the torn line stays unreadable; what was appended after it is read (it starts a line of its own)
    third = run(tmp_path)
    assert third["ok"] and third["builds"] == 2


@pytest.mark.multiprocess
def test_memo_off_with_the_disk_tier(tmp_path):
    out = run(tmp_path, {"TORCH_TPU_DISK_CACHE": "0"})
    assert out["ok"] and not (os.path.isdir(tmp_path) and memo_files(tmp_path))
