"""Runs a test scenario as a tpu_dist job whose ranks are threads of one process, rank r driving
tpu:r with tpu_dist's device path on (TORCH_TPU_DIST_DEVICE_COLLECTIVES=1): what the processes of a
TPU VM run (each collective, and each compiled graph with collectives, as one program over the
ranks' devices), on the CPU plugin, whose collectives reach the devices of one process only.

`run_threads(n, "tests.distributed.<module>:<function>")` starts `python -m tests.distributed.threads`
(a process of its own: the thread-local c10d world below patches torch.distributed process-wide)
with a short timeout; every rank calls init_process_group and then the scenario. It returns the
process's counters (torch_tpu.metrics) after every rank is done. c10d keeps one world per thread
(PyTorch's ThreadLocalWorld); its group-name registry is process-wide, so each thread resolves a name
to its own group, and a name registered by one rank is not registered again by the others.
"""
from __future__ import annotations

import datetime
import importlib
import json
import os
import subprocess
import sys
import threading

from .runner import REPO

_MARK = "THREADS-COUNTERS "


def run_threads(n: int, scenario: str, *, timeout: float = 180.0, env: dict | None = None) -> dict:
    """torch_tpu.metrics.counters() after `scenario` ran on `n` ranks as threads; fails (with the
    output) when a rank raises or the process is not done within `timeout` s."""
    e = dict(os.environ, TORCH_TPU_CPU_DEVICE_COUNT=str(n), TORCH_TPU_DIST_DEVICE_COLLECTIVES="1",
             PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        e.pop(k, None)
    e.update(env or {})
    try:
        p = subprocess.run([sys.executable, "-m", "tests.distributed.threads", scenario, str(n)], cwd=REPO, env=e,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as t:  # subprocess.run kills its child
        raise AssertionError(f"{scenario}: ranks as threads still running after {timeout:.0f} s (killed)\n"
                             f"{(t.stdout or b'')[-6000:]!r}") from None
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"{scenario}: ranks as threads exited {p.returncode}\n{out[-8000:]}"
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith(_MARK))
    return json.loads(line[len(_MARK):])


def _thread_local_c10d() -> None:
    import torch.distributed.distributed_c10d as c10d
    from torch.testing._internal.distributed.multi_threaded_pg import _install_threaded_pg
    _install_threaded_pg()
    register, lock = c10d._register_process_group, threading.Lock()

    def register_once(name, pg):
        with lock:
            try:
                register(name, pg)
            except RuntimeError:  # another rank's group of this name (same ranks)
                pass
    c10d._register_process_group = register_once
    c10d._resolve_process_group = lambda name: next(pg for pg, n in c10d._world.pg_names.items() if n == name)


def _main(scenario: str, n: int) -> None:
    import torch
    import torch.distributed as dist

    import torch_tpu

    _thread_local_c10d()
    module, _, name = scenario.partition(":")
    fn = getattr(importlib.import_module(module), name)
    store, errors = dist.HashStore(), []

    def rank(r):
        try:
            torch.tpu.set_device(r)
            dist.init_process_group("tpu_dist", rank=r, world_size=n, store=store,
                                    timeout=datetime.timedelta(seconds=60))
            fn()
            torch.tpu.synchronize()
        except BaseException as e:  # noqa: BLE001  (reported below)
            import traceback
            traceback.print_exc()
            errors.append(e)
    torch_tpu.metrics.reset()
    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if any(t.is_alive() for t in threads):
        print("a rank hung", flush=True)
        os._exit(3)  # daemon threads stuck in a launch: end without waiting for them
    if errors:
        os._exit(2)
    print(_MARK + json.dumps(torch_tpu.metrics.counters()), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1], int(sys.argv[2]))
