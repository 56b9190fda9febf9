"""Warm start (csrc/runtime/warm_start.h): a process writes, at exit, the keys of the programs it used
into a manifest named by its command line; the next process with the same command line loads those
executables from the disk cache as soon as its client starts, before its ops ask for them, and
computes what a cold process computes. Another command line, TORCH_TPU_WARM_START=0, a damaged
manifest or a manifest naming programs that are gone cost only what a start without it costs."""
import json
import os
import subprocess
import sys

import pytest

PROGRAM = r"""
import json, sys, warnings
warnings.filterwarnings("ignore", message="No TPU here")
import torch, torch_tpu
from torch_tpu import _C

torch_tpu.runtime.start()
_C.runtime.wait_compiles()              # the warm start's loads, if any, are done
before = _C.runtime.cache_stats()
torch.manual_seed(0)
w = torch.randn(16, 8)
x = torch.randn(4, 16)
y = torch.relu(x.to("tpu") @ w.to("tpu")).sum(0).softmax(0)
ok = torch.allclose(y.cpu(), torch.relu(x @ w).sum(0).softmax(0), atol=1e-6)
after = _C.runtime.cache_stats()
print(json.dumps({"ok": bool(ok), "used": _C.runtime.used_program_keys(),
                  "prefetched": before["disk_hits"], "memory_hits": after["memory_hits"] - before["memory_hits"],
                  "disk_hits": after["disk_hits"] - before["disk_hits"], "compiles": after["misses"]}))
"""


def run(cache_dir, program=PROGRAM, **env):
    e = dict(os.environ, TORCH_TPU_CACHE_DIR=str(cache_dir), **env)
    r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=e, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def manifests(cache_dir):
    return sorted(p for p in os.listdir(cache_dir) if p.startswith("warm-") and p.endswith(".keys"))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_warm_process_loads_its_programs_before_its_ops_ask(tmp_path):
    cold = run(tmp_path)
    assert cold["ok"] and cold["prefetched"] == 0 and cold["compiles"] == len(cold["used"]) > 0
    [name] = manifests(tmp_path)
    lines = (tmp_path / name).read_text().splitlines()
    assert lines == ["torch_tpu warm start v1"] + cold["used"]  # in the order they were first used

    warm = run(tmp_path)
    assert warm["ok"] and warm["used"] == cold["used"]
    # Every program was on disk and loaded before the first op: the ops found them in memory.
    assert warm["prefetched"] == len(cold["used"])
    assert warm["compiles"] == 0 and warm["disk_hits"] == 0
    assert warm["memory_hits"] == len(cold["used"])


@pytest.mark.multiprocess
@pytest.mark.slow
def test_another_command_line_prefetches_nothing(tmp_path):
    run(tmp_path)
    other = run(tmp_path, program=PROGRAM + "\n# another script\n")
    assert other["ok"] and other["prefetched"] == 0
    assert other["disk_hits"] == len(other["used"])  # its programs still come from disk, when asked for
    assert len(manifests(tmp_path)) == 2


@pytest.mark.multiprocess
@pytest.mark.slow
def test_off_writes_and_reads_no_manifest(tmp_path):
    run(tmp_path, TORCH_TPU_WARM_START="0")
    assert manifests(tmp_path) == []
    run(tmp_path)
    off = run(tmp_path, TORCH_TPU_WARM_START="0")
    assert off["ok"] and off["prefetched"] == 0 and off["disk_hits"] == len(off["used"])


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_damaged_manifest_prefetches_nothing_and_is_rewritten(tmp_path):
    cold = run(tmp_path)
    [name] = manifests(tmp_path)
    path = tmp_path / name
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:2] + ["not a key"] + lines[2:]) + "\n")
    damaged = run(tmp_path)
    assert damaged["ok"] and damaged["prefetched"] == 0 and damaged["disk_hits"] == len(cold["used"])
    assert path.read_text().splitlines() == lines


@pytest.mark.multiprocess
@pytest.mark.slow
def test_programs_gone_from_disk_are_compiled_when_asked_for(tmp_path):
    cold = run(tmp_path)
    gone = cold["used"][0]
    os.remove(tmp_path / (gone + ".xla"))
    warm = run(tmp_path)
    assert warm["ok"] and warm["prefetched"] == len(cold["used"]) - 1
    assert warm["compiles"] == 1 and warm["used"] == cold["used"]
