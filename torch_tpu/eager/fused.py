"""Fused eager's program builder: a run of recorded ops becomes ONE program.

Recording, cut points, the run signatures and their executables live in C++ (csrc/eager/fused.h,
which explains when runs are cut): a steady loop records and runs its fused programs there with no
Python. This module is called on a run signature's first flush: each recorded op keeps its own
program (built by the same lowering registry) as a private function, and @main calls them in order,
threading each storage's current value from one op to the next, and returns the final value of
every storage the run wrote that is still in use. Storages that only held intermediates never leave
the device program.
"""
from __future__ import annotations

from .. import _C, runtime
from ..lowering.builder import Builder
from ..lowering.results import ProgramResults

MAX_OPS = _C.eager.fused_max_ops()  # a run reaching this many ops is cut (bounds pending memory)


def flush() -> None:
    """Runs the recorded ops (if any) as one program."""
    _C.eager.fused_flush()


def pending() -> int:
    """Number of recorded ops not yet run."""
    return _C.eager.fused_pending()


def _text(records, outputs):
    """The fused module, and what each @main argument is (_C.eager.FusedWire: a local storage or a host operand).
    Each op's program is a private function @op<uid>; @main calls them in order, each storage's
    current value threaded from one call to the next."""
    b = Builder()
    funcs = {}
    current = {}   # local storage index -> its current Value
    args = {}      # local storage index -> its @main parameter
    ext = []
    for entry, wiring, out_idx in records:
        if entry.uid not in funcs:
            funcs[entry.uid] = entry.fn_text.replace("@__OP__", f"@op{entry.uid}", 1)
            for f in entry.functions:  # what the op calls (a custom kernel's functions), once
                b.add_function(f, f)
        operands = []
        for w, t in zip(wiring, entry.arg_types):
            i = w.index
            if w.local and i in current:
                # The same storage's elements; the dims an op wrote it in may not be those the next
                # one was keyed with (a new tensor's allocation hint), so they are made to agree.
                operands.append(b.reshape(current[i], t.shape))
                continue
            a = b.arg(t)
            ext.append(w)
            if w.local:
                current[i] = args[i] = a
            operands.append(a)
        for i, r in zip(out_idx, b.call(f"op{entry.uid}", operands, entry.result_types)):
            current[i] = r
    res = ProgramResults(b)
    for i in outputs:
        if i in args:  # a storage the run read: its old buffer is donated, whose dims it keeps
            res.replace(args[i], b.reshape(current[i], args[i].shape))
        else:  # a storage the run made
            res.buffer(current[i])
    return res.module(list(funcs.values()), name="torch_tpu_fused"), ext, res.types


def _build(records, outputs):
    """C++ calls this on a run signature's first flush: (executable, @main argument sources). The
    executable is compiled by the compile pool (runtime.compile's `outputs`): the run is queued at
    once and Python goes on recording the next one while it compiles; a compile error is raised at
    the next sync, naming the run, as any failure of a queued op (an error building the text is
    raised here, and C++ then runs the recorded ops one by one first)."""
    text, ext, types = _text(records, list(outputs))
    return runtime.compile(text, f"fused run ({len(records)} ops)",
                           outputs=[(t.dtype, list(t.shape)) for t in types]), ext
