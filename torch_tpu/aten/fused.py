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

MAX_OPS = _C._fused_max_ops()  # a run reaching this many ops is cut (bounds pending memory)


def record(entry, inputs, sinks, device, name):
    """Records one op (kernel.py's entry; inputs and sinks as for _C._launch); returns its new output
    tensors (their values are computed at the flush)."""
    return _C._fused_record(entry, inputs, sinks, entry.new_outputs, device)


def flush() -> None:
    """Runs the recorded ops (if any) as one program."""
    _C._fused_flush()


def pending() -> int:
    """Number of recorded ops not yet run."""
    return _C._fused_pending()


def _text(records, outputs):
    """The fused module, and what each @main argument is: ("c", local storage) or ("h", host operand)."""
    funcs = {}
    for entry, _, _ in records:
        if entry.uid not in funcs:
            funcs[entry.uid] = entry.fn_text.replace("@__OP__", f"@op{entry.uid}", 1)
    args, arg_types, lines = [], [], []
    current = {}   # local storage index -> SSA name, type
    ext = []
    for k, (entry, wiring, out_idx) in enumerate(records):
        names = []
        for (kind, i), t in zip(wiring, entry.arg_types):
            if kind == "c" and i in current:
                names.append(current[i][0])
                continue
            a = f"%arg{len(args)}"
            args.append(a)
            arg_types.append(t)
            ext.append((kind, i))
            if kind == "c":
                current[i] = (a, t)
            names.append(a)
        rtypes = entry.result_types
        sig = f"({', '.join(str(t) for t in entry.arg_types)}) -> ({', '.join(str(t) for t in rtypes)})"
        lhs = f"%r{k}" if len(rtypes) == 1 else f"%r{k}:{len(rtypes)}"
        lines.append(f'{lhs} = "func.call"({", ".join(names)}) {{callee = @op{entry.uid}}} : {sig}')
        for j, (i, t) in enumerate(zip(out_idx, rtypes)):
            current[i] = (f"%r{k}" if len(rtypes) == 1 else f"%r{k}#{j}", t)
    results = [current[i] for i in outputs]
    params = []
    for a, t, (kind, i) in zip(args, arg_types, ext):
        attr = ""
        if kind == "c" and i in outputs and results[outputs.index(i)][1] == t:
            attr = f" {{tf.aliasing_output = {outputs.index(i)} : i32}}"  # donate the old buffer
        params.append(f"{a}: {t}{attr}")
    rtypes = ", ".join(str(t) for _, t in results)
    main = (f"func.func public @main({', '.join(params)}) -> ({rtypes}) {{\n    " + "\n    ".join(lines) +
            f'\n    "func.return"({", ".join(n for n, _ in results)}) : ({rtypes}) -> ()\n  }}')
    return "module @torch_tpu_fused {\n  " + main + "\n  " + "\n  ".join(funcs.values()) + "\n}\n", ext


def _build(records, outputs):
    """C++ calls this on a run signature's first flush: (executable, @main argument sources)."""
    text, ext = _text(records, list(outputs))
    return runtime.compile(text), ext


def _op_executable(entry):
    from .kernel import executable
    return executable(entry)


_C._fused_install(_build, _op_executable)
