"""Shadow mode: every program compiled here is also compiled for a TPU topology, off the hot path.

TORCH_TPU_SHADOW_TOPOLOGY=v5e:1x1 (read when torch_tpu is imported; enable() does the same) hooks
runtime.compile, the one door of every program (eager ops, fused runs, compiled graphs, kernels): each
program, the first time this process builds it, is queued for one background thread that compiles
it with libtpu for the topology. The program the local plugin runs is compiled as it is (Pallas
kernels in it are in interpret mode; torch_tpu.aot.compile lowers them for Mosaic). shadow_report()
says how many compiled, which TPU refuses (tpu_refusals.py: op and dtype named) and which failed
with libtpu's message. With TORCH_TPU_SHADOW_REPORT=<file>, each process appends its report to the
file as one JSON line at exit (a test suite runs in several processes) and leaves the programs still
queued then in <file>.pending/ (exit is not delayed); `python -m torch_tpu.aot <file>`
(aot/__main__.py) compiles those, once each, and sums everything up.
"""
from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import os
import queue
import re
import threading
import warnings

from .. import runtime, settings
from .target import Topology, topology

ENV = "TORCH_TPU_SHADOW_TOPOLOGY"
REPORT_ENV = "TORCH_TPU_SHADOW_REPORT"


@dataclasses.dataclass
class Failure:
    """A program that does not compile for the shadow topology: `program` (its name: an op overload,
    "fused run (N ops)", "forward graph [0/0]"), `op` (the op named by the refusal or the compiler's
    message, where one is), `message`, `refused` (True: torch_tpu refuses it on TPU with that message,
    before libtpu sees it)."""
    program: str
    op: str | None
    message: str
    refused: bool = False


@dataclasses.dataclass
class ShadowReport:
    """compiled: programs that compiled for `topology`; failures: those that did not (Failure);
    pending: programs still queued when the report was taken (0 when it waited); after_exit (from
    summarize): programs left queued at their process's exit and compiled by summarize, once each."""
    topology: str
    compiled: int = 0
    failures: list[Failure] = dataclasses.field(default_factory=list)
    pending: int = 0
    after_exit: int = 0

    @property
    def refused(self) -> list[Failure]:
        return [f for f in self.failures if f.refused]

    def __str__(self):
        lines = [f"shadow {self.topology}: {self.compiled} program(s) compiled, {len(self.refused)} refused on TPU, "
                 f"{len(self.failures) - len(self.refused)} failed" + (f", {self.pending} pending" if self.pending else "")
                 + (f" ({self.after_exit} of them queued at their process's exit, compiled by summarize)"
                    if self.after_exit else "")]
        lines += [f"  {'refused' if f.refused else 'FAILED'}: {f.program}: {f.message.splitlines()[0][:300]}"
                  for f in self.failures]
        return "\n".join(lines)


class _Shadow:
    def __init__(self, topo: Topology):
        self.topology = topo
        self.report = ShadowReport(topo.name)
        self.seen: set[str] = set()
        self.queue: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.busy = 0  # queued or compiling
        self.stopped = False
        self.thread = threading.Thread(target=self._work, name="torch_tpu shadow compiler", daemon=True)
        self.thread.start()

    def __call__(self, program: str, name: str) -> None:
        """runtime.compile's hook: queues `program` the first time it is seen. Never raises."""
        digest = hashlib.sha256(program.encode()).digest()
        with self.lock:
            if digest in self.seen or self.stopped:
                return
            self.seen.add(digest)
            self.busy += 1
        self.queue.put((program, name))

    def _work(self):
        while True:
            item = self.queue.get()
            if item is None:
                return
            program, name = item
            failure = _compile(self.topology, program, name)
            with self.lock:
                if failure is None:
                    self.report.compiled += 1
                else:
                    self.report.failures.append(failure)
                self.busy -= 1
                self.idle.notify_all()

    def snapshot(self, wait: bool) -> ShadowReport:
        with self.lock:
            if wait:
                self.idle.wait_for(lambda: self.busy == 0)
            return dataclasses.replace(self.report, failures=list(self.report.failures), pending=self.busy)

    def stop(self) -> list[tuple[str, str]]:
        """At exit: takes what is queued off the queue and waits for the compile in progress (its
        worker's reply), so that the report taken afterwards counts it. Returns the (program, name)
        pairs taken off, not compiled."""
        with self.lock:
            self.stopped = True
        dropped = []
        try:
            while True:
                item = self.queue.get_nowait()
                if item is not None:
                    dropped.append(item)
                    with self.lock:
                        self.busy -= 1
        except queue.Empty:
            pass
        self.queue.put(None)
        self.thread.join()
        return dropped


def _compile(topo: Topology, program: str, name: str) -> Failure | None:
    """Compiles `program` for `topo`: None, or why not (refused by torch_tpu, or libtpu's error)."""
    try:
        topo.compile(program)
    except TypeError as e:  # refused by torch_tpu: TPU cannot run it
        return Failure(name, _op_of(name, str(e)), str(e), refused=True)
    except Exception as e:  # noqa: BLE001  (libtpu's error: recorded, never raised here)
        return Failure(name, _op_of(name, str(e)), str(e))
    return None


_OP = re.compile(r"\b(stablehlo\.\w+|aten::[\w.]+)")


def _op_of(name: str, message: str) -> str | None:
    if name.startswith("aten::"):
        return name
    m = _OP.search(message)
    return m.group(1) if m else None


_active: _Shadow | None = None


def enable(name: str) -> None:
    """Compiles every program this process builds from now on for TPU topology `name` too (see the
    module's doc). Raises ValueError / RuntimeError as topology() does."""
    global _active
    disable()
    _active = _Shadow(topology(name))
    runtime._SHADOW = _active


def disable() -> list[tuple[str, str]]:
    """Stops shadow mode (waits for the compile in progress); returns the queued (program, name)
    pairs it did not compile."""
    global _active
    runtime._SHADOW = None
    dropped = []
    if _active is not None:
        dropped = _active.stop()
        _active = None
    return dropped


def shadow_report(wait: bool = True) -> ShadowReport:
    """What shadow mode found so far: `.compiled` (a count) and `.failures` (program, op, message),
    after the queued programs are compiled (wait=True) or as it stands. Raises RuntimeError when
    shadow mode is off."""
    if _active is None:
        raise RuntimeError(f"shadow mode is off: set {ENV}=v5e:1x1 before importing torch_tpu, or call "
                           "torch_tpu.aot.shadow.enable('v5e:1x1')")
    return _active.snapshot(wait)


def from_environment() -> None:
    """torch_tpu's import: enables shadow mode when TORCH_TPU_SHADOW_TOPOLOGY is set (a warning, not an
    error, when it cannot: the job itself still runs)."""
    name = (settings.get(ENV) or "").strip()
    if not name:
        return
    try:
        enable(name)
    except (ValueError, RuntimeError) as e:
        warnings.warn(f"torch_tpu: {ENV}={name!r}: shadow mode is off: {e}", stacklevel=3)
        return
    atexit.register(_at_exit)


def _at_exit():
    if _active is None:
        return
    active = _active
    dropped = disable()  # after the compile in progress, which the report then counts
    report = dataclasses.replace(active.snapshot(wait=False), pending=len(dropped))
    path = settings.get(REPORT_ENV)
    if path:
        line = json.dumps({"topology": report.topology, "compiled": report.compiled, "pending": report.pending,
                           "failures": [dataclasses.asdict(f) for f in report.failures]})
        with open(path, "a") as f:  # one short write per process: lines from several processes stay whole
            f.write(line + "\n")
        # Programs still queued at exit are left for summarize() to compile (exit is not delayed):
        # one file per program, so that the many processes of a suite leave each program once.
        folder = path + ".pending"
        os.makedirs(folder, exist_ok=True)
        for program, name in dropped:
            out = os.path.join(folder, hashlib.sha256(program.encode()).hexdigest() + ".json")
            if not os.path.exists(out):
                tmp = f"{out}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    json.dump({"name": name, "program": program}, f)
                os.replace(tmp, out)


def summarize(path: str) -> ShadowReport:
    """The reports that processes appended to `path` (TORCH_TPU_SHADOW_REPORT), added up: failures
    of the same program and message counted once. Raises ValueError when the file holds none."""
    total, seen = None, set()
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            if total is None:
                total = ShadowReport(d["topology"])
            total.compiled += d["compiled"]
            total.pending += d["pending"]
            for fd in d["failures"]:
                k = (fd["program"], fd["message"])
                if k not in seen:
                    seen.add(k)
                    total.failures.append(Failure(**fd))
    if total is None:
        raise ValueError(f"{path} holds no shadow report")
    folder = path + ".pending"
    if os.path.isdir(folder):  # programs queued at their process's exit: compiled here, once each
        topo = topology(total.topology)
        for entry in sorted(os.listdir(folder)):
            if not entry.endswith(".json"):
                continue
            with open(os.path.join(folder, entry)) as f:
                d = json.load(f)
            failure = _compile(topo, d["program"], d["name"])
            if failure is None:
                total.compiled += 1
            elif (failure.program, failure.message) not in seen:
                seen.add((failure.program, failure.message))
                total.failures.append(failure)
            total.after_exit += 1
            os.remove(os.path.join(folder, entry))
        total.pending = 0
    return total

