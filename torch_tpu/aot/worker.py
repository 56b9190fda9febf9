"""libtpu's compiler in worker processes, so that a crash inside libtpu costs one program, not the job.

libtpu can abort or crash while compiling a program it should accept (libtpu 0.0.52: SIGSEGV in
TpuPriorityFusionQueue::OnFusingInstruction on a GPT block's forward). Compiled in the user's
process, that ends a training script or a test session with no word about which program did it.
Topology.compile sends each program to a worker process that holds its own libtpu topology; when the
worker dies, the program's compile raises CompilerCrash naming the signal, libtpu's last output and
a file holding the program for a bug report, and the next program gets a fresh worker.

Protocol (pickle over two pipes): the worker says ("ready", None) once its topology exists; then the
parent sends ("compile", program_text, options) and reads ("ok", dict as
_C.runtime.Topology.compile returns it) or ("error", message). The worker's stdout is its stderr (libtpu
prints there), so only replies travel on the channel. A worker ends when its channel closes or its
parent dies (polled each second): nothing outlives the job.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading

# Variables a worker must not inherit: it compiles; it must not shadow-compile itself.
_DROP = ("TORCH_TPU_SHADOW_TOPOLOGY", "TORCH_TPU_SHADOW_REPORT")


class CompilerCrash(RuntimeError):
    """libtpu died (a signal or an abort) compiling a program. Attributes: `signal` (its name, or the
    exit status), `program_file` (the program's StableHLO, kept for a bug report), `output` (the
    last lines libtpu printed)."""

    def __init__(self, message: str, signal_name: str, program_file: str, output: str):
        super().__init__(message)
        self.signal = signal_name
        self.program_file = program_file
        self.output = output


class _Worker:
    def __init__(self, plugin: str, env_var: str, name: str, num_slices: int):
        env = {k: v for k, v in os.environ.items() if k not in _DROP}
        self.log = tempfile.TemporaryFile()
        to_worker_r, self._send = os.pipe()
        self._recv, from_worker_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from torch_tpu.aot.worker import _serve; _serve(*sys.argv[1:])",
             plugin, env_var, name, str(num_slices), str(to_worker_r), str(from_worker_w)],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, env=env,
            pass_fds=(to_worker_r, from_worker_w))
        os.close(to_worker_r)
        os.close(from_worker_w)
        self.send = os.fdopen(self._send, "wb")
        self.recv = os.fdopen(self._recv, "rb")
        # The worker says when its topology is ready: a worker that cannot start (an import error in
        # its environment, libtpu refusing to load) is not mistaken for a compile that crashed.
        try:
            pickle.load(self.recv)
        except (EOFError, pickle.UnpicklingError):
            how, output = self.death()
            self.close()
            raise RuntimeError(f"the libtpu compile worker did not start ({how}); its output:\n{output}") from None

    def request(self, program: str, options: bytes):
        """Returns the worker's reply, or None when the worker died on the way."""
        try:
            pickle.dump(("compile", program, options), self.send)
            self.send.flush()
            return pickle.load(self.recv)
        except (EOFError, BrokenPipeError, pickle.UnpicklingError):
            return None

    def death(self) -> tuple[str, str]:
        """(signal name or exit status, libtpu's last output) of a worker that died."""
        code = self.proc.wait()
        if code < 0:
            try:
                how = signal.Signals(-code).name
            except ValueError:
                how = f"signal {-code}"
        else:
            how = f"exit status {code}"
        self.log.seek(0)
        # Without the crash reporter's own lines (coredump hooks, a symbolizer address).
        lines = [line for line in self.log.read().decode(errors="replace").strip().splitlines()
                 if "RAW:" not in line and "symbolize" not in line]
        return how, "\n".join(lines[-20:])

    def close(self):
        for f in (self.send, self.recv):
            try:
                f.close()
            except OSError:
                pass
        self.log.close()


class Pool:
    """Up to `size` worker processes compiling for one topology; Pool.compile is thread-safe (aot
    compiles a step's programs in parallel, shadow mode from its own thread)."""

    def __init__(self, plugin: str, env_var: str, name: str, num_slices: int, size: int):
        self._args = (plugin, env_var, name, num_slices)
        self._name = name
        self._size = max(1, size)
        self._idle: list[_Worker] = []
        self._count = 0
        self._cv = threading.Condition()

    def compile(self, program: str, options: bytes = b"") -> dict:
        """Compiles `program` in a worker, with `options` (a serialized xla.CompileOptionsProto;
        empty: the default). Returns _C.runtime.Topology.compile's dict. Raises RuntimeError with libtpu's
        message, CompilerCrash when libtpu died compiling it."""
        worker = self._take()
        reply = None
        try:
            reply = worker.request(program, options)
        finally:
            self._give(worker, alive=reply is not None)
        if reply is None:
            how, output = worker.death()
            worker.close()
            path = _keep(program)
            raise CompilerCrash(
                f"libtpu crashed ({how}) compiling this program for {self._name}: a defect of libtpu's compiler, "
                f"not of the program; it was compiled in a worker process, so only this program is lost. "
                f"The program is kept in {path} for a bug report. libtpu's last output:\n{output}",
                how, path, output)
        kind, value = reply
        if kind == "error":
            raise RuntimeError(value)
        return value

    def _take(self) -> _Worker:
        with self._cv:
            while not self._idle and self._count >= self._size:
                self._cv.wait()
            if self._idle:
                return self._idle.pop()
            self._count += 1
        try:
            return _Worker(*self._args)
        except BaseException:
            with self._cv:
                self._count -= 1
                self._cv.notify()
            raise

    def _give(self, worker: _Worker, alive: bool) -> None:
        with self._cv:
            if alive:
                self._idle.append(worker)
            else:
                self._count -= 1
            self._cv.notify()


def _keep(program: str) -> str:
    digest = hashlib.sha256(program.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"torch_tpu_libtpu_crash_{digest}.mlir")
    with open(path, "w") as f:
        f.write(program)
    return path


def _watch_parent(parent: int) -> None:
    import time
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _serve(plugin: str, env_var: str, name: str, num_slices: str, recv_fd: str, send_fd: str) -> None:
    """A worker's life (arguments as strings, from its command line): answers requests until its
    channel closes."""
    num_slices, recv_fd, send_fd = int(num_slices), int(recv_fd), int(send_fd)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file behind
    from .. import _C

    options = [("num_slices", num_slices)] if num_slices > 1 else []
    topo = _C.runtime.Topology(plugin, env_var, name, options)
    recv, send = os.fdopen(recv_fd, "rb"), os.fdopen(send_fd, "wb")
    pickle.dump(("ready", None), send)
    send.flush()
    while True:
        try:
            kind, program, options = pickle.load(recv)
        except EOFError:
            return
        try:
            reply = ("ok", topo.compile(program, options))
        except _C.runtime.PjrtError as e:
            reply = ("error", str(e))
        pickle.dump(reply, send)
        send.flush()

