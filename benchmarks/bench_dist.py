"""tpu_dist against Gloo, and DDP's scaling, side by side in one run (ratios, not asserts).

    python benchmarks/bench_dist.py [--rounds 9] [--steps 5]

Starts its own processes: 2 ranks with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE; a FileStore rendezvous), so that each sees one device as tpu:0 and runs on its
share of the cores, and 1 plain process (no torchrun variables: all the cores). Prints:

1. all_reduce (SUM) of 1 MiB and 64 MiB of float32 (and 4 KiB: the per-call latency), median
   milliseconds per call: tpu tensors
   through tpu_dist against CPU tensors through a Gloo group of the same ranks
   (dist.new_group(backend="gloo")), in alternating rounds; the ratio tpu_dist/Gloo (target <= 1.25);
   and the same through a tpu_dist group made with TORCH_TPU_DIST_VERIFY=0 (no shape agreement);
2. a DDP training step (forward, backward with the gradients' all-reduce, AdamW) of the GPT-style
   decoder block (examples/tiny_models.py TinyGPT), at two widths, on 2 ranks with half the global
   batch each, against one process on the whole global batch, in alternating rounds: milliseconds
   per step, the ratio and the speed-up; and the ranks' step without the gradients' all-reduce
   (DDP.no_sync), which shows what the all-reduce costs.
On a machine without a TPU, "tpu" is OpenXLA's CPU plugin, and tpu_dist stages every collective
through host memory on Gloo (one device -> host and one host -> device copy per call).

The parent process only launches, asks and prints (it imports no torch); children read one JSON
request a line on stdin and answer one JSON line. Every child is killed (its process group) when
the parent is done, fails or runs past --timeout, and kills itself if the parent dies.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")
WORLD = 2
# TinyGPT's sizes and the global batch for the DDP step. One process on 2 cores (CPU plugin): ~55 ms
# per step for the first, where the per-op host cost weighs; ~240 ms for the second, mostly work.
GPTS = {"dim 128, ctx 64": {"vocab": 512, "dim": 128, "ctx": 64},
        "dim 256, ctx 128": {"vocab": 512, "dim": 256, "ctx": 128}}
GLOBAL_BATCH = 32


# --------------------------------------------------------------------------------------------
# Children

def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the parent dies (Linux's PR_SET_PDEATHSIG), so that a killed
    benchmark leaves no ranks behind."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before prctl
        os._exit(1)


def _sync():
    import torch
    torch.tpu.synchronize()


class _Trainer:
    """TinyGPT(**cfg) training steps on tpu over this process's share of a seeded global batch
    (GLOBAL_BATCH sequences of cfg["ctx"] tokens): rows [rank * B/world, (rank+1) * B/world),
    wrapped in DDP when world > 1."""

    def __init__(self, cfg: dict, rank: int, world: int):
        import torch
        import torch.nn.functional as F
        from tiny_models import TinyGPT

        g = torch.Generator().manual_seed(0)
        idx = torch.randint(0, cfg["vocab"], (GLOBAL_BATCH, cfg["ctx"]), generator=g)
        tgt = torch.randint(0, cfg["vocab"], (GLOBAL_BATCH, cfg["ctx"]), generator=g)
        per = GLOBAL_BATCH // world
        self.idx = idx[rank * per:(rank + 1) * per].to("tpu")
        self.tgt = tgt[rank * per:(rank + 1) * per].flatten().to("tpu")
        torch.manual_seed(0)
        model = TinyGPT(**cfg).to("tpu")
        self.params = sum(p.numel() for p in model.parameters())
        if world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model)
        self.model, self.F, self.world = model, F, world
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.steps(3)  # warm: compiles every op's program

    def _step(self):
        self.opt.zero_grad(set_to_none=True)
        loss = self.F.cross_entropy(self.model(self.idx).flatten(0, 1), self.tgt)
        loss.backward()
        self.opt.step()
        return loss

    def steps(self, n: int, sync_grads: bool = True) -> float:
        """Seconds per step over n steps, ending with a host read of the loss. sync_grads=False:
        under DDP.no_sync (no gradient all-reduce)."""
        import contextlib
        import torch.distributed as dist

        ctx = contextlib.nullcontext() if sync_grads or self.world == 1 else self.model.no_sync()
        if self.world > 1:
            dist.barrier(group=_GLOO[0])
        with ctx:
            t0 = time.perf_counter()
            for _ in range(n):
                loss = self._step()
            loss.item()
            return (time.perf_counter() - t0) / n


_GLOO: list = []  # the ranks' Gloo group (barriers and the CPU reference)


def _all_reduce(sizes_kib, rounds: int, calls: int) -> dict:
    """{"<KiB>": {case: median seconds per call}} for the cases "tpu_dist", "tpu_dist, no verify"
    and "gloo". Each round makes `calls` calls of each case in turn, each call timed on its own
    (barrier, all_reduce, device sync), so that a slow spell of the shared machine hits all alike."""
    import statistics

    import torch
    import torch.distributed as dist

    os.environ["TORCH_TPU_DIST_VERIFY"] = "0"  # read when a tpu_dist group is made
    no_verify = dist.new_group(backend="tpu_dist")
    del os.environ["TORCH_TPU_DIST_VERIFY"]
    gloo = _GLOO[0]
    out = {}
    for kib in sizes_kib:
        n = kib * 2 ** 10 // 4
        cpu = torch.ones(n)
        tpu = cpu.to("tpu")
        cases = {"tpu_dist": (tpu, None), "tpu_dist, no verify": (tpu, no_verify), "gloo": (cpu, gloo)}
        times = {k: [] for k in cases}
        for r in range(rounds + 1):  # round 0 warms (compiles, allocates) and is not counted
            for k, (t, group) in cases.items():
                t.fill_(1.0)  # SUM doubles the values each call: keep them finite
                if t.device.type == "tpu":
                    _sync()
                for _ in range(calls):
                    dist.barrier(group=gloo)
                    t0 = time.perf_counter()
                    dist.all_reduce(t, group=group)
                    if t.device.type == "tpu":
                        _sync()
                    if r:
                        times[k].append(time.perf_counter() - t0)
        out[str(kib)] = {k: statistics.median(v) for k, v in times.items()}
    return out


def _child(role: str, store: str, parent: int) -> None:
    """A rank ("rank": tpu_dist world of WORLD processes) or the single process ("single"),
    answering the parent's requests until {"op": "quit"}."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed goes to the log, not into the answers
    _die_with_parent(parent)
    sys.path.insert(0, EXAMPLES)
    import warnings
    warnings.filterwarnings("ignore")
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch_tpu

    rank, world = 0, 1
    if role == "rank":
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group("tpu_dist", init_method="file://" + store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
        _GLOO.append(dist.new_group(backend="gloo"))
    trainers = {}
    for line in sys.stdin:
        req = json.loads(line)
        op = req.pop("op")
        if op == "quit":
            break
        if op == "info":
            ans = {"platform": torch_tpu.runtime.platform(), "devices": torch.tpu.device_count(),
                   "cores": len(os.sched_getaffinity(0)), "torch": torch.__version__}
        elif op == "all_reduce":
            ans = _all_reduce(**req)
        elif op == "train_setup":
            trainers[req["name"]] = _Trainer(GPTS[req["name"]], rank, world)
            ans = {"params": trainers[req["name"]].params}
        elif op == "steps":
            ans = {"s": trainers[req.pop("name")].steps(**req)}
        else:
            raise ValueError(f"unknown request {op!r}")
        proto.write(json.dumps(ans) + "\n")
    if dist.is_initialized():
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------------
# Parent

class _Children:
    """The child processes, each in its own session (killed with its process group), answering
    one JSON line per request; a reader thread per child queues its lines."""

    def __init__(self, workdir: str, deadline: float):
        self.workdir, self.deadline = workdir, deadline
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, str] = {}
        self.lines: dict[str, queue.Queue] = {}

    def start(self, name: str, role: str, env: dict) -> None:
        log = os.path.join(self.workdir, f"{name}.log")
        self.logs[name] = log
        cmd = [sys.executable, os.path.abspath(__file__), "--child", role,
               "--store", os.path.join(self.workdir, "store"), "--parent", str(os.getpid())]
        with open(log, "w") as f:
            p = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=f,
                                 text=True, bufsize=1, start_new_session=True)
        self.procs[name], self.lines[name] = p, queue.Queue()
        threading.Thread(target=self._read, args=(name,), daemon=True).start()

    def _read(self, name):
        for line in self.procs[name].stdout:
            self.lines[name].put(line)
        self.lines[name].put(None)  # EOF: the child ended

    def ask(self, names, **req) -> dict:
        """Sends req to each child in names (all first, then waits): {name: answer}."""
        for n in names:
            self.procs[n].stdin.write(json.dumps(req) + "\n")
            self.procs[n].stdin.flush()
        out = {}
        for n in names:
            try:
                line = self.lines[n].get(timeout=max(0.1, self.deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"{n}: no answer to {req['op']!r} before the timeout\n{self.tail(n)}") from None
            if line is None:
                raise RuntimeError(f"{n} exited (rc={self.procs[n].wait()}) during {req['op']!r}\n{self.tail(n)}")
            out[n] = json.loads(line)
        return out

    def tail(self, name, chars=4000) -> str:
        with open(self.logs[name]) as f:
            return f"--- {name} log ---\n" + f.read()[-chars:]

    def close(self) -> None:
        """Asks each child to quit, then kills whatever of its process group is left."""
        for p in self.procs.values():
            try:
                p.stdin.write('{"op": "quit"}\n')
                p.stdin.close()
            except (OSError, ValueError):
                pass
        for p in self.procs.values():
            try:
                p.wait(timeout=max(1.0, min(15.0, self.deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)  # our own child's session: it and what it started
            except ProcessLookupError:
                pass
            p.wait()


def _env(rank: int | None) -> dict:
    """The children's environment: torchrun's variables for a rank, none of them for the single
    process (which then exposes the CPU plugin's usual devices on all the cores)."""
    env = {k: v for k, v in os.environ.items() if k not in
           ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "TORCH_TPU_DIST_VERIFY")}
    env["PYTHONUNBUFFERED"] = "1"
    if rank is not None:
        env.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD),
                   GROUP_RANK="0", MASTER_ADDR="127.0.0.1")
    return env


def _median(xs):
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9, help="alternating rounds per comparison")
    p.add_argument("--calls", type=int, default=4, help="all_reduce calls per case per round")
    p.add_argument("--steps", type=int, default=5, help="training steps per configuration per round")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole run; then all is killed")
    p.add_argument("--child", choices=("rank", "single"), help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--parent", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args.child, args.store, args.parent)
        return

    ranks = [f"rank{r}" for r in range(WORLD)]
    with tempfile.TemporaryDirectory(prefix="bench_dist_") as workdir:
        kids = _Children(workdir, time.monotonic() + args.timeout)
        try:
            for r, name in enumerate(ranks):
                kids.start(name, "rank", _env(r))
            kids.start("single", "single", _env(None))
            info = kids.ask(ranks + ["single"], op="info")
            i0, i1 = info["rank0"], info["single"]
            print(f"platform: {i0['platform']}, torch {i0['torch']}, {os.cpu_count()} CPUs; {WORLD} ranks with "
                  f"{i0['devices']} device and {i0['cores']} core(s) each; the single process: {i1['devices']} "
                  f"devices, {i1['cores']} cores; load average {os.getloadavg()[0]:.1f}")

            sizes = [4, 2 ** 10, 2 ** 16]  # KiB
            ar = kids.ask(ranks, op="all_reduce", sizes_kib=sizes, rounds=args.rounds, calls=args.calls)["rank0"]
            print(f"\nall_reduce SUM float32, {WORLD} ranks: median ms per call ({args.rounds} alternating rounds)")
            for kib in sizes:
                t = ar[str(kib)]
                g = t["gloo"]
                size = f"{kib} KiB" if kib < 1024 else f"{kib // 1024} MiB"
                target = "  (target <= 1.25)" if kib >= 1024 else " " * 18
                print(f"  {size:>6s}: tpu_dist {t['tpu_dist'] * 1e3:7.2f} ms  Gloo on CPU tensors {g * 1e3:7.2f} ms"
                      f"  ratio {t['tpu_dist'] / g:5.2f}{target}"
                      f"  | TORCH_TPU_DIST_VERIFY=0: {t['tpu_dist, no verify'] * 1e3:7.2f} ms,"
                      f" ratio {t['tpu_dist, no verify'] / g:5.2f}")

            per = GLOBAL_BATCH // WORLD
            for name, cfg in GPTS.items():
                params = kids.ask(ranks + ["single"], op="train_setup", name=name)["single"]["params"]
                runs = {"ddp": [], "nosync": [], "single": []}
                for _ in range(args.rounds):
                    runs["ddp"].append(kids.ask(ranks, op="steps", name=name, n=args.steps)["rank0"]["s"])
                    runs["nosync"].append(kids.ask(ranks, op="steps", name=name, n=args.steps,
                                                   sync_grads=False)["rank0"]["s"])
                    runs["single"].append(kids.ask(["single"], op="steps", name=name, n=args.steps)["single"]["s"])
                t = {k: _median(v) for k, v in runs.items()}
                print(f"\nDDP training step (forward, backward, AdamW) of the GPT-style decoder block, TinyGPT "
                      f"vocab {cfg['vocab']}, {name} ({params / 1e3:.0f}k params), global batch {GLOBAL_BATCH}: "
                      f"median ms per step ({args.rounds} alternating rounds of {args.steps} steps)")
                print(f"  1 process, batch {GLOBAL_BATCH}              {t['single'] * 1e3:8.2f} ms")
                print(f"  DDP, {WORLD} ranks, batch {per} each       {t['ddp'] * 1e3:8.2f} ms   ratio DDP/1 process "
                      f"{t['ddp'] / t['single']:5.2f}, speed-up {t['single'] / t['ddp']:4.2f}x (ideal {WORLD}x)")
                print(f"  the same under DDP.no_sync         {t['nosync'] * 1e3:8.2f} ms   (the gradients' all-reduce: "
                      f"{(t['ddp'] - t['nosync']) * 1e3:.2f} ms per step)")
            # Other work on the machine competes with the ranks: figures from a loaded machine swing.
            print(f"\nload average at the end: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
        finally:
            kids.close()


if __name__ == "__main__":
    main()
