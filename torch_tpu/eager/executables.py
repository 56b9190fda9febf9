"""An op program's executable, and what the three eager modes need from Python around its run.
C++ runs every op program (csrc/eager/op_kernel.h; csrc/eager/plan.h run_plan):

- strict (default): queued asynchronously, like CUDA; errors surface at the next host read,
  naming the op that produced the failing value.
- debug (TPU_LAUNCH_BLOCKING=1): queued, then waited for here (debug_synchronize), so an error is
  raised by the op that caused it, with the op overload, its input shapes and dtypes, and the
  user's line.
- fused (TORCH_TPU_DEFER_AND_FUSE=1): recorded; runs of recorded ops become one program
  (eager/fused.py), flushed at every host read and at deterministic cut points.
"""
from __future__ import annotations

import os
import traceback

import torch

from .. import _C, runtime
from . import state as _state
from . import fused


def compile_entry_text(name: str, text: str, result_types=None):
    """The executable of op `name`'s program `text`; a compile error names the op and shows it.
    With `result_types` (the program's result TensorTypes) in strict eager, a pending executable
    compiled by the compile pool (runtime.compile's `outputs`): the op is queued without waiting, and
    a compile error surfaces at the next sync, as any failure of a strict-mode op does."""
    outputs = None
    if result_types is not None and _state.eager_mode() == "strict":
        outputs = [(t.dtype, list(t.shape)) for t in result_types]
    try:
        return runtime.compile(text, name, one_op=True, outputs=outputs)
    except RuntimeError as e:
        raise RuntimeError(f"tpu: compiling {name} failed: {e}\n--- program ---\n{text}") from None


def executable(entry):
    """The entry's own executable (kernel.py's _Entry), compiled on first use."""
    if entry.exe is None:
        entry.exe = compile_entry_text(entry.name, entry.text)
    return entry.exe


def _user_line() -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    torch_dir = os.path.dirname(os.path.abspath(__import__("torch").__file__))
    for frame in reversed(traceback.extract_stack()[:-2]):
        f = os.path.abspath(frame.filename)
        if not f.startswith(here) and not f.startswith(torch_dir):
            return f"{frame.filename}:{frame.lineno}: {frame.line}"
    return "<unknown>"


def debug_synchronize(name: str, operands, device: int) -> None:
    """Debug eager, after C++ queued op `name`'s program (csrc/eager/op_kernel.cc OpKernel::slow): waits
    for tpu:`device`; a failure is raised here, naming the op, its operands' shapes and dtypes and the
    user's line. torch.OutOfMemoryError and an IndexError found on the device keep their type (callers
    catch them; the IndexError's first line is CPU's message); anything else is a RuntimeError."""
    try:
        _C.runtime.synchronize(device)
    except (RuntimeError, IndexError) as e:
        shapes = ", ".join(f"{tuple(t.shape)}:{t.dtype}" for t in operands if isinstance(t, torch.Tensor))
        if isinstance(e, IndexError):
            raise IndexError(f"{e}\n(inputs: {shapes}; at {_user_line()})") from None
        kind = type(e) if isinstance(e, torch.OutOfMemoryError) else RuntimeError  # what callers catch
        raise kind(f"tpu op {name} failed (inputs: {shapes}) at {_user_line()}:\n{e}") from None


def install_fused() -> None:
    """Hands C++'s fused recorder what it calls at a flush (torch_tpu's import calls this once):
    fused.py's builder of a new run's program and, where such a program cannot be built, each op's
    own executable to replay the run op by op. Neither is ever traced by Dynamo (run_as_is)."""
    _C.eager.fused_install(fused._build, executable)
    _state.run_as_is(fused._build, executable)
