"""Process-wide eager state: the last op program built (tests read it), the calling thread's eager
mode, run_as_is."""
from __future__ import annotations

from .. import _C

last_program_text: str | None = None

# The eager modes' names (csrc/eager/mode.h's, through the _C.eager.Mode enum).
MODES = tuple(_C.eager.Mode.__members__)


def eager_mode() -> str:
    """The calling thread's eager mode: "debug", "strict" or "fused" (eager/modes.py)."""
    return _C.eager.mode().name


def run_as_is(*fns) -> None:
    """Marks Python functions that PyTorch's dispatcher or our C++ call (kernels, their slow paths,
    fused eager's builders) so that torch.compile never traces them. Dynamo evaluates every Python
    frame that starts while a compiled function runs, whatever its backend, and so would trace the
    kernels that the eager code between graphs (after a graph break) calls into graphs of their own,
    guarded on our internals: extra graphs and breaks that CPU does not have. Each function's code
    gets a recursive SKIP frame strategy (torch._C._dynamo's, which needs no Dynamo import), so it and
    everything it calls run as they are. `fns`: functions, bound methods or callable objects."""
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    skip = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    for fn in fns:
        fn = getattr(fn, "__func__", fn)
        code = getattr(fn, "__code__", None) or type(fn).__call__.__code__
        set_code_exec_strategy(code, skip)
