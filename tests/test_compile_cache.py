"""The persistent executable cache: reuse across processes, corrupt/foreign entries, concurrent
writers, the size cap, and the switch that turns the disk tier off."""
import json
import os
import subprocess
import sys

import pytest

PROGRAM = r"""
import json, sys, warnings
warnings.filterwarnings("ignore", message="No TPU here")
import torch, torch_tpu
x = torch.arange(12.0, device="tpu").reshape(3, 4)
y = (x * 2.5 + 1).sum(0)
ok = torch.equal(y.cpu(), (torch.arange(12.0).reshape(3, 4) * 2.5 + 1).sum(0))
print(json.dumps({"ok": ok, **torch_tpu.runtime.cache_stats()}))
"""


def run(cache_dir, extra_env=None, program=PROGRAM):
    env = {**os.environ, "TORCH_TPU_CACHE_DIR": str(cache_dir), **(extra_env or {})}
    r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def entries(d):
    return sorted(p for p in os.listdir(d) if p.endswith(".xla")) if os.path.isdir(d) else []


def test_second_process_loads_from_disk(tmp_path):
    first, _ = run(tmp_path)
    assert first["ok"] and first["misses"] > 0 and first["disk_hits"] == 0
    assert len(entries(tmp_path)) == first["disk_writes"] > 0
    second, _ = run(tmp_path)
    assert second["ok"] and second["misses"] == 0 and second["disk_hits"] == first["misses"]
    assert second["compile_seconds_saved"] > 0


def test_xla_flags_are_part_of_the_key(tmp_path):
    # The plugin compiles under XLA_FLAGS' DebugOptions: an executable built under other flags
    # must not be reused.
    env = {"XLA_FLAGS": ""}
    first, _ = run(tmp_path, env)
    again, _ = run(tmp_path, env)
    assert again["misses"] == 0 and again["disk_hits"] == first["misses"]
    other, _ = run(tmp_path, {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"})
    assert other["ok"] and other["disk_hits"] == 0 and other["misses"] == first["misses"]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip"])
def test_corrupt_or_foreign_entry_is_rebuilt(tmp_path, damage):
    first, _ = run(tmp_path)
    victim = os.path.join(tmp_path, entries(tmp_path)[0])
    data = open(victim, "rb").read()
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "garbage":
        data = os.urandom(256)
    else:
        data = data[:-20] + bytes(b ^ 0xFF for b in data[-20:-8]) + data[-8:]
    open(victim, "wb").write(data)
    second, err = run(tmp_path)
    assert second["ok"]
    assert second["disk_rejected"] == 1 and second["misses"] == 1
    assert "ignoring compilation cache entry" in err
    third, _ = run(tmp_path)  # rebuilt and stored again
    assert third["misses"] == 0 and third["disk_rejected"] == 0


def test_concurrent_writers(tmp_path):
    env = {**os.environ, "TORCH_TPU_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        assert json.loads(out.strip().splitlines()[-1])["ok"]
    assert not [f for f in os.listdir(tmp_path) if ".tmp." in f]
    again, _ = run(tmp_path)
    assert again["misses"] == 0 and again["disk_rejected"] == 0


def test_size_cap_evicts(tmp_path):
    stats, _ = run(tmp_path, {"TORCH_TPU_CACHE_MAX_BYTES": "1"})
    assert stats["ok"] and stats["evictions"] > 0
    assert len(entries(tmp_path)) <= 1


def test_disk_tier_off(tmp_path):
    stats, _ = run(tmp_path, {"TORCH_TPU_DISK_CACHE": "0"})
    assert stats["ok"] and stats["disk_writes"] == 0 and entries(tmp_path) == []
