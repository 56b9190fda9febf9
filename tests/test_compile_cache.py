"""The persistent executable cache: reuse across processes, corrupt/foreign entries, concurrent
writers, a writer killed mid-entry, a full disk, the size cap, the switch that turns the disk tier
off, and the per-host (tier 2) and shared (tier 3) tiers around the disk tier: search order,
promotion, rejection, unusable directories."""
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time

import pytest

import torch_tpu
from tests.helpers import strict_env

PROGRAM = r"""
import json, sys, warnings
warnings.filterwarnings("ignore", message="No TPU here")
import torch, torch_tpu
x = torch.arange(12.0, device="tpu").reshape(3, 4)
y = (x * 2.5 + 1).sum(0)
ok = torch.equal(y.cpu(), (torch.arange(12.0).reshape(3, 4) * 2.5 + 1).sum(0))
print(json.dumps({"ok": ok, **torch_tpu.compile_cache.stats()}))
"""


def run(cache_dir, extra_env=None, program=PROGRAM):
    # strict eager: the counts below are per-op programs
    env = strict_env({**os.environ, "TORCH_TPU_CACHE_DIR": str(cache_dir), **(extra_env or {})})
    r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def entries(d):
    return sorted(p for p in os.listdir(d) if p.endswith(".xla")) if os.path.isdir(d) else []


@pytest.mark.multiprocess
@pytest.mark.slow
def test_second_process_loads_from_disk(tmp_path):
    first, _ = run(tmp_path)
    assert first["ok"] and first["misses"] > 0 and first["disk_hits"] == 0
    assert len(entries(tmp_path)) == first["disk_writes"] > 0
    second, _ = run(tmp_path)
    assert second["ok"] and second["misses"] == 0 and second["disk_hits"] == first["misses"]
    assert second["compile_seconds_saved"] > 0


@pytest.mark.multiprocess
@pytest.mark.slow
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
@pytest.mark.multiprocess
@pytest.mark.slow
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


def _file_size_limit(limit):
    """preexec_fn: files past `limit` bytes cannot be written (EFBIG, and SIGXFSZ, which Python
    ignores unless the program restores it); no core file for a kill."""
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _limited(cache_dir, program, limit=1000):
    env = strict_env({**os.environ, "TORCH_TPU_CACHE_DIR": str(cache_dir), "PYTHONDONTWRITEBYTECODE": "1",
                      "PYTHONWARNINGS": "always"})
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=300,
                          preexec_fn=_file_size_limit(limit))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_writer_killed_mid_entry_leaves_nothing_that_is_used(tmp_path):
    # SIGXFSZ kills the writer once its first entry passes 1000 bytes (entries are ~3.5 KB): the
    # partial file is a temporary one, never read; the next process compiles, and removes it (its
    # writer, on this host, is gone). Another host's temporary file is removed only after a day.
    fresh, stale = tmp_path / "k1.tmp.otherhost.example.7.1", tmp_path / "k2.tmp.otherhost.example.8.2"
    fresh.write_bytes(b"partial")
    stale.write_bytes(b"partial")
    two_days_ago = time.time() - 2 * 86400
    os.utime(stale, (two_days_ago, two_days_ago))
    killed = _limited(tmp_path, "import signal; signal.signal(signal.SIGXFSZ, signal.SIG_DFL)\n" + PROGRAM)
    assert killed.returncode == -signal.SIGXFSZ, killed.stderr[-2000:]
    partial = [n for n in os.listdir(tmp_path) if f".tmp.{socket.gethostname()}." in n]
    assert entries(tmp_path) == [] and len(partial) == 1
    assert os.path.getsize(tmp_path / partial[0]) == 1000
    stats, _ = run(tmp_path)
    assert stats["ok"] and stats["disk_hits"] == stats["disk_rejected"] == 0
    assert len(entries(tmp_path)) == stats["disk_writes"] == stats["misses"] > 0
    assert sorted(n for n in os.listdir(tmp_path) if ".tmp." in n) == [fresh.name]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_full_disk_stops_writing_with_one_warning(tmp_path):
    # EFBIG past the file size limit stands in for ENOSPC (the same failed write): one warning, no
    # entry and no temporary file left, the job goes on; the next process compiles and writes.
    full = _limited(tmp_path, PROGRAM)
    assert full.returncode == 0, full.stderr[-2000:]
    stats = json.loads(full.stdout.strip().splitlines()[-1])
    assert stats["ok"] and stats["misses"] > 1 and stats["disk_writes"] == 0
    assert full.stderr.count("cannot write into the disk compilation cache") == 1, full.stderr[-2000:]
    assert "File too large" in full.stderr
    # (the meta memo's few small lines fit under the limit, as does the warm-start manifest; the plan
    # memo's first line is cut short and it stops appending: eager/meta_memo.py)
    assert [n for n in os.listdir(tmp_path) if not n.startswith(("meta-", "plans-", "warm-"))] == []
    again, _ = run(tmp_path)
    assert again["ok"] and again["disk_writes"] == again["misses"] == stats["misses"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_concurrent_writers(tmp_path):
    env = strict_env({**os.environ, "TORCH_TPU_CACHE_DIR": str(tmp_path)})
    procs = [subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        assert json.loads(out.strip().splitlines()[-1])["ok"]
    assert not [f for f in os.listdir(tmp_path) if ".tmp." in f]
    again, _ = run(tmp_path)
    assert again["misses"] == 0 and again["disk_rejected"] == 0


@pytest.mark.multiprocess
def test_size_cap_evicts(tmp_path):
    stats, _ = run(tmp_path, {"TORCH_TPU_CACHE_MAX_BYTES": "1"})
    assert stats["ok"] and stats["evictions"] > 0
    assert len(entries(tmp_path)) <= 1


@pytest.mark.multiprocess
def test_size_cap_counts_what_other_processes_wrote(tmp_path):
    # The tier is listed at a process's first write (not at every write: that made each compile wait
    # on a listing of the whole directory), so entries others wrote past the cap go then, oldest first.
    old = time.time() - 3600
    for i in range(40):
        p = tmp_path / f"{i:064x}.xla"
        p.write_bytes(b"x" * 10_000)
        os.utime(p, (old + i, old + i))
    stats, _ = run(tmp_path, {"TORCH_TPU_CACHE_MAX_BYTES": "200000"})
    assert stats["ok"] and stats["disk_writes"] > 0 and stats["evictions"] > 0
    left = entries(tmp_path)
    assert sum(os.path.getsize(tmp_path / e) for e in left) <= 200_000
    fakes = [e for e in left if e.startswith("0" * 60)]
    assert fakes == [f"{i:064x}.xla" for i in range(40 - len(fakes), 40)]  # the newest of them stay


@pytest.mark.multiprocess
def test_disk_tier_off(tmp_path):
    stats, _ = run(tmp_path, {"TORCH_TPU_DISK_CACHE": "0"})
    assert stats["ok"] and stats["disk_writes"] == 0 and entries(tmp_path) == []


# -- tier 2 (per host) and tier 3 (shared): TORCH_TPU_TIER2_COMPILATION_CACHE,
#    TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT

@pytest.mark.multiprocess
@pytest.mark.slow
def test_tier3_serves_another_host_and_is_promoted_into_its_disk(tmp_path):
    shared = tmp_path / "shared"
    env = {"TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": str(shared)}
    first, _ = run(tmp_path / "host1", env)
    n = first["misses"]
    assert first["ok"] and n > 0 and first["tier3_writes"] == first["disk_writes"] == n
    assert entries(shared) == entries(tmp_path / "host1") and len(entries(shared)) == n
    # A second host: its own empty disk directory, the same shared root.
    second, _ = run(tmp_path / "host2", env)
    assert second["ok"] and second["misses"] == 0 and second["tier3_hits"] == n and second["disk_hits"] == 0
    assert second["disk_writes"] == n and entries(tmp_path / "host2") == entries(shared)
    assert second["tier3_writes"] == 0 and second["compile_seconds_saved"] > 0
    third, _ = run(tmp_path / "host2", env)  # now served by the faster tier
    assert third["ok"] and third["disk_hits"] == n and third["tier3_hits"] == 0 and third["misses"] == 0


@pytest.mark.multiprocess
@pytest.mark.slow
def test_tier2_path_is_searched_before_the_disk_directory(tmp_path):
    tier2 = tmp_path / "shm" / "cache"
    env = {"TORCH_TPU_TIER2_COMPILATION_CACHE": str(tier2)}
    first, _ = run(tmp_path / "disk1", env)
    n = first["misses"]
    assert first["ok"] and n > 0 and first["tier2_writes"] == first["disk_writes"] == n
    # Another process of the host with a fresh disk directory: tier 2 serves it, nothing to promote.
    second, _ = run(tmp_path / "disk2", env)
    assert second["ok"] and second["misses"] == 0 and second["tier2_hits"] == n
    assert second["disk_writes"] == 0 and entries(tmp_path / "disk2") == []
    # Tier 2 emptied (a reboot clears /dev/shm): the disk hit is copied back into it.
    for f in entries(tier2):
        os.remove(tier2 / f)
    third, _ = run(tmp_path / "disk1", env)
    assert third["ok"] and third["misses"] == 0 and third["disk_hits"] == n and third["tier2_writes"] == n
    assert entries(tier2) == entries(tmp_path / "disk1")


@pytest.mark.parametrize("damage", ["truncate", "flip"])
@pytest.mark.multiprocess
@pytest.mark.slow
def test_corrupt_tier3_entry_is_a_miss_and_rewritten(tmp_path, damage):
    shared = tmp_path / "shared"
    env = {"TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": str(shared)}
    first, _ = run(tmp_path / "host1", env)
    victim = shared / entries(shared)[0]
    data = victim.read_bytes()
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data = data[:-20] + bytes(b ^ 0xFF for b in data[-20:-8]) + data[-8:]
    victim.write_bytes(data)
    second, err = run(tmp_path / "host2", env)
    assert second["ok"]  # the recompiled program computes the right values
    assert second["tier3_rejected"] == 1 and second["misses"] == 1
    assert second["tier3_hits"] == first["misses"] - 1
    assert second["tier3_writes"] == 1 and "ignoring compilation cache entry" in err
    third, _ = run(tmp_path / "host3", env)  # the shared entry was rewritten whole
    assert third["ok"] and third["misses"] == 0 and third["tier3_rejected"] == 0
    assert third["tier3_hits"] == first["misses"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_tier3_that_others_can_write_is_off_unless_trusted(tmp_path):
    # Whoever can write a shared root decides what this process loads and runs: group- or
    # world-writable, tier 3 is off with one warning; TORCH_TPU_TIER3_TRUSTED=1 uses it anyway.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    env = {"TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": str(shared), "PYTHONWARNINGS": "always"}
    stats, err = run(tmp_path / "host1", env)
    assert stats["ok"] and stats["misses"] > 0 and stats["tier3_writes"] == 0 and entries(shared) == []
    assert err.count("the tier3 compilation cache at") == 1 and "users other than its owner can write" in err
    stats, _ = run(tmp_path / "host2", {**env, "TORCH_TPU_TIER3_TRUSTED": "1"})
    assert stats["ok"] and stats["tier3_writes"] == stats["misses"] > 0 and len(entries(shared)) == stats["misses"]
    shared.chmod(0o755)  # only its owner writes: used without being told
    stats, _ = run(tmp_path / "host3", env)
    assert stats["ok"] and stats["tier3_hits"] > 0


@pytest.mark.multiprocess
def test_unusable_tier_directory_is_off_with_one_warning(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    env = {"TORCH_TPU_TIER2_COMPILATION_CACHE": str(blocker / "tier2"),
           "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": str(blocker / "tier3"),
           "PYTHONWARNINGS": "always"}  # a warning repeated per lookup would show each time
    stats, err = run(tmp_path / "disk", env)
    assert stats["ok"] and stats["misses"] > 1 and stats["disk_writes"] == stats["misses"]
    assert stats["tier2_writes"] == stats["tier3_writes"] == 0
    assert err.count("the tier2 compilation cache at") == 1
    assert err.count("the tier3 compilation cache at") == 1


PRIVATE_TIER = r"""
import json, os, sys, warnings
warnings.filterwarnings("ignore", message="No TPU here")
import torch, torch_tpu
torch_tpu._C.runtime.cache_configure([("tier2", sys.argv[1], 1 << 30, True, False)])
y = (torch.arange(4.0, device="tpu") * 3).cpu()
print(json.dumps({"ok": torch.equal(y, torch.arange(4.0) * 3), **torch_tpu.compile_cache.stats()}))
"""


@pytest.mark.multiprocess
@pytest.mark.slow
def test_private_tier_writable_by_others_is_not_used(tmp_path):
    # What guards /dev/shm/torch_tpu_cache-<user>: a directory others can write to may hold
    # planted entries.
    d = tmp_path / "shm_cache"
    d.mkdir()
    os.chmod(d, 0o777)
    r = subprocess.run([sys.executable, "-c", PRIVATE_TIER, str(d)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    stats = json.loads(r.stdout.strip().splitlines()[-1])
    assert stats["ok"] and stats["tier2_writes"] == 0 and entries(d) == []
    assert "other users can write to it" in r.stderr
    fresh = tmp_path / "fresh"  # created by the cache itself: 0700, and used
    r = subprocess.run([sys.executable, "-c", PRIVATE_TIER, str(fresh)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    stats = json.loads(r.stdout.strip().splitlines()[-1])
    assert stats["ok"] and stats["tier2_writes"] > 0 and os.stat(fresh).st_mode & 0o777 == 0o700


def test_tier2_values():
    import pwd
    user = pwd.getpwuid(os.geteuid()).pw_name
    assert torch_tpu.compile_cache._tier2_dir("1") == (f"/dev/shm/torch_tpu_cache-{user}", True)
    assert torch_tpu.compile_cache._tier2_dir("default") == (f"/dev/shm/torch_tpu_cache-{user}", True)
    assert torch_tpu.compile_cache._tier2_dir("job7") == (f"/dev/shm/torch_tpu_cache-{user}-job7", True)
    for off in ("", "0", "disabled"):
        assert torch_tpu.compile_cache._tier2_dir(off) == ("", False)
    assert torch_tpu.compile_cache._tier2_dir("/mnt/fast/cache") == ("/mnt/fast/cache", False)


def test_object_store_tier3_root_is_refused_with_a_warning():
    try:
        with pytest.warns(UserWarning, match="tier3 compilation cache is off"):
            torch_tpu.compile_cache.configure(tier3_root="gs://bucket/cache")
    finally:
        torch_tpu.compile_cache.configure()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_one_op_programs_compile_at_their_own_level(tmp_path):
    """TORCH_TPU_OP_OPT_LEVEL reaches XLA's compiler for eager op programs (CompileOptionsProto's
    env_option_overrides): the same programs compiled at level 0 and at level 3 are different
    executables under different keys (their code differs in size), while the same level gives
    executables of the same sizes (the bytes themselves differ from compile to compile)."""
    def sizes(d, level):
        run(d, {"TORCH_TPU_OP_OPT_LEVEL": level})
        out = {}
        for p in entries(d):  # magic (8) | u32 key length | key | f64 seconds | u64 payload length | ...
            data = (d / p).read_bytes()
            at = 12 + int.from_bytes(data[8:12], "little") + 8
            out[p] = int.from_bytes(data[at:at + 8], "little")
        return out
    a, b, c = sizes(tmp_path / "a", "0"), sizes(tmp_path / "b", "0"), sizes(tmp_path / "c", "3")
    assert a and a == b
    assert not set(a) & set(c) and sorted(a.values()) != sorted(c.values())


def test_op_opt_level_setting():
    from torch_tpu import runtime
    assert runtime._one_op_level("tpu") is None  # TPU's compiler keeps its defaults
    os.environ["TORCH_TPU_OP_OPT_LEVEL"] = "fast"
    try:
        with pytest.raises(ValueError, match="TORCH_TPU_OP_OPT_LEVEL='fast'"):
            runtime._one_op_level("cpu")
    finally:
        del os.environ["TORCH_TPU_OP_OPT_LEVEL"]
    assert runtime._one_op_level("cpu") == 1
