"""The meta memo (torch_tpu/eager/meta_memo.py): a new process with a warm disk cache runs no Python
meta kernel for a call key an earlier process ran, so it imports neither sympy nor torch._dynamo;
its results, errors and warnings are those of a cold process; a damaged memo file costs only meta
runs."""
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

from torch_tpu.eager import kernel, meta_memo

PROGRAM = r"""
import json, sys, warnings
warnings.filterwarnings("ignore", message="No TPU here")
import torch, torch_tpu
import torch.nn.functional as F
torch.manual_seed(0)
emb = torch.nn.Embedding(10, 4)
idx = torch.tensor([[1, 2, 3], [4, 5, 9]])
w = torch.randn(4, 6, requires_grad=True)

def step(dev):
    e = emb.to(dev)
    wd = w.detach().to(dev).requires_grad_()
    y = F.gelu(e(idx.to(dev)) @ wd).softmax(-1)
    loss = y.max(-1).values.sum()
    loss.backward()
    return loss.detach().cpu(), wd.grad.cpu()

got, want = step("tpu"), step("cpu")
ok = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, want))
heavy = [m for m in ("sympy", "torch._dynamo", "torch.fx.experimental.symbolic_shapes") if m in sys.modules]
try:
    torch.mm(torch.ones(2, 3, device="tpu"), torch.ones(2, 3, device="tpu"))
    err = None
except RuntimeError as e:
    err = str(e)  # (meta runs again: a call whose meta raised is not kept)
print(json.dumps({"ok": ok, "err": err, "heavy": heavy}))
"""


def run(cache_dir, env=None):
    env = {**os.environ, "TORCH_TPU_CACHE_DIR": str(cache_dir), **(env or {})}
    r = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def memo_files(d):
    return [os.path.join(d, n) for n in os.listdir(d) if n.startswith("meta-") and n.endswith(".jsonl")]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_warm_process_runs_no_python_meta_kernel(tmp_path):
    cold = run(tmp_path)
    assert cold["ok"] and "torch.fx.experimental.symbolic_shapes" in cold["heavy"]  # embedding's meta is Python
    assert cold["err"]
    (memo,) = memo_files(tmp_path)
    lines = open(memo).read().splitlines()
    assert any(json.loads(x)[0].startswith("aten::embedding:") for x in lines)
    warm = run(tmp_path)
    assert warm["ok"] and warm["heavy"] == []
    assert warm["err"] == cold["err"]  # a call whose meta raised is not kept: it raises again
    assert open(memo).read().splitlines() == lines  # nothing new to keep


@pytest.mark.multiprocess
@pytest.mark.slow
def test_damaged_memo_lines_are_skipped(tmp_path):
    run(tmp_path)
    (memo,) = memo_files(tmp_path)
    lines = open(memo).read().splitlines()
    # A torn line, a foreign line, and every record replaced by one that does not decode.
    bad = ["{\"torn", "[1, 2]"] + [json.dumps([json.loads(x)[0], [0, [[[1], "not_a_dtype", [1]]]]]) for x in lines]
    with open(memo, "w") as f:
        f.write("\n".join(bad) + "\n")
    for n in os.listdir(tmp_path):  # without kept plans (plan_memo.py), so that meta runs are what is tested
        if n.startswith("plans-"):
            os.unlink(tmp_path / n)
    again = run(tmp_path)
    assert again["ok"] and again["err"] is not None


@pytest.mark.multiprocess
def test_memo_off_with_the_disk_tier(tmp_path):
    out = run(tmp_path, {"TORCH_TPU_DISK_CACHE": "0"})
    assert out["ok"] and not (os.path.isdir(tmp_path) and memo_files(tmp_path))


def test_meta_warnings_are_shown_and_such_calls_are_not_kept():
    def warns(x):
        warnings.warn("from a meta kernel", UserWarning)
        return x

    with pytest.warns(UserWarning, match="from a meta kernel"):
        assert kernel._meta_call(warns, 3) == (3, True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernel._meta_call(lambda x: x, 4) == (4, False)

    def raises(x):
        warnings.warn("before the error", UserWarning)
        raise RuntimeError("meta refused")

    with pytest.warns(UserWarning, match="before the error"), pytest.raises(RuntimeError, match="meta refused"):
        kernel._meta_call(raises, 1)


def test_records_round_trip():
    t = torch.empty_strided((2, 3), (1, 2), dtype=torch.bfloat16, device="meta")
    rec = meta_memo.tensor_record(t)
    assert rec == [[2, 3], "bfloat16", [1, 2]]
    m = meta_memo._tensor_of(rec)
    assert (m.shape, m.stride(), m.dtype, m.device.type) == ((2, 3), (1, 2), torch.bfloat16, "meta")
    assert meta_memo._tensor_of(None) is None
    with pytest.raises(ValueError):
        meta_memo._tensor_of([[1], "Tensor", [1]])
