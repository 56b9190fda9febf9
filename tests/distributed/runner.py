"""Runs a test scenario in N processes, one per tpu device, as torchrun would.

`run_world(n, "tests.distributed.scenarios:name", tmp_path)` starts `python -m
tests.distributed.runner`, once per rank, with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE) and a FileStore rendezvous in tmp_path; each rank calls init_process_group and
then the scenario function. The scenario asserts; a rank passes by exiting 0. Every run has a
short timeout: a hang kills the ranks (this process's own children, by pid) and fails the test.
"""
from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _descendants(pid: int) -> list[int]:
    """The pids of every process below `pid` (from /proc): torchrun starts each worker in a session of
    its own, so killing torchrun's process group leaves them."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        out += kids
        todo += kids
    return out


def run_torchrun(args: list[str], timeout: float) -> str:
    """Output (stdout and stderr) of `torchrun --standalone <args>`; fails on a non-zero exit or on
    `timeout` s, after ending torchrun and its workers (this test's own descendants, by pid)."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun] if os.path.exists(torchrun) else [sys.executable, "-m", "torch.distributed.run"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.Popen(cmd + ["--standalone"] + args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        workers = _descendants(p.pid)
        p.send_signal(signal.SIGTERM)  # torchrun passes it on to its workers
        deadline = time.monotonic() + 10
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in [p.pid] + workers:
            try:
                os.killpg(pid, signal.SIGKILL)  # each is the leader of its own session
            except (ProcessLookupError, PermissionError):
                pass
        out, _ = p.communicate()
        raise AssertionError(f"torchrun {' '.join(args)}: still running after {timeout:.0f} s (killed)\n{out[-6000:]}")
    assert p.returncode == 0, f"torchrun {' '.join(args)} exited {p.returncode}\n{out[-6000:]}"
    return out


def scenario(fn) -> str:
    """The name runner workers import `fn` by (tests.distributed.<module>:<function>)."""
    return f"tests.distributed.{fn.__module__.rsplit('.', 1)[-1]}:{fn.__name__}"


def run_world(nprocs: int, scenario: str, tmp_path, *, timeout: float = 120.0, env: dict | None = None,
              expect_rc: dict | None = None, no_leftovers: bool = False) -> list[str]:
    """Runs `scenario` ("module:function") in `nprocs` ranks; returns each rank's output.

    Fails (AssertionError with every rank's output) when a rank exits non-zero (or, for the ranks
    in `expect_rc`, with another code) or when the ranks are not all done within `timeout` s.
    no_leftovers: also fails when a process a rank started is still running 5 s after the ranks
    exited (each rank leads its own session; the leftovers are killed)."""
    store = os.path.join(str(tmp_path), "store")
    base = dict(os.environ)
    base.update({
        "WORLD_SIZE": str(nprocs), "LOCAL_WORLD_SIZE": str(nprocs), "MASTER_ADDR": "127.0.0.1",
        "TORCH_TPU_TEST_STORE": store, "PYTHONPATH": REPO + os.pathsep + base.get("PYTHONPATH", ""),
        "PYTHONUNBUFFERED": "1",
    })
    base.update(env or {})
    procs, logs = [], []
    for rank in range(nprocs):
        log = open(os.path.join(str(tmp_path), f"rank{rank}.log"), "w+")
        e = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.distributed.runner", scenario], env=e,
                                      stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True))
        logs.append(log)
    deadline = time.monotonic() + timeout
    timed_out = False
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    if timed_out:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # our own child's session: it and what it started
                p.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    report = "\n".join(f"--- rank {r} (rc={p.returncode}) ---\n{out[-6000:]}" for r, (p, out) in
                       enumerate(zip(procs, outputs)))
    assert not timed_out, f"{scenario}: ranks still running after {timeout:.0f} s (killed)\n{report}"
    if no_leftovers:
        left = _leftovers([p.pid for p in procs], grace=5.0)
        assert not left, f"{scenario}: processes left behind in the ranks' sessions: {left}\n{report}"
    for r, p in enumerate(procs):
        want = (expect_rc or {}).get(r, 0)
        assert p.returncode == want, f"{scenario}: rank {r} exited {p.returncode}, expected {want}\n{report}"
    return outputs


def _leftovers(sessions: list[int], grace: float) -> list[int]:
    """The process groups among `sessions` that still have a process after `grace` s (then killed)."""
    deadline = time.monotonic() + grace
    while True:
        alive = []
        for pgid in sessions:
            try:
                os.killpg(pgid, 0)
                alive.append(pgid)
            except ProcessLookupError:
                pass
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for pgid in alive:
        os.killpg(pgid, signal.SIGKILL)
    return alive


def _main(scenario: str) -> None:
    import torch.distributed as dist
    from datetime import timedelta

    import torch_tpu  # noqa: F401  (registers tpu_dist)

    module, _, name = scenario.partition(":")
    fn = getattr(importlib.import_module(module), name)
    backend = getattr(fn, "backend", "tpu_dist")
    timeout = timedelta(seconds=float(getattr(fn, "timeout", 30)))
    if backend is not None:
        import torch
        device_id = torch.device("tpu", 0) if getattr(fn, "bind_device", False) else None
        dist.init_process_group(backend, init_method="file://" + os.environ["TORCH_TPU_TEST_STORE"],
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                                timeout=timeout, device_id=device_id)
    fn()
    if backend is not None and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    _main(sys.argv[1])
