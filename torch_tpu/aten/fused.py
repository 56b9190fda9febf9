"""Fused eager: ops are recorded as they come, and each run of them becomes ONE program.

Each recorded op keeps its own program (built by the same lowering registry) as a private
function; a flush writes a @main that calls them in order, threading each storage's current value
from one op to the next, and returns the final value of every storage the run wrote that is still
in use. Storages that only held intermediates never leave the device program.

A run is flushed when the host reads device data (.item(), .cpu(), print, synchronize, the CPU
fallback: the runtime calls `flush` before any read) and at cut points. Cut points depend only on
the last two ops (a content-defined chunking of the op stream), so a training loop that repeats
the same ops is cut at the same places every step, and its fused programs hit the cache from the
second step on. A cap on the run length bounds the memory that pending values hold; a run that
reaches it is cut after the last occurrence of its smallest pair hash (content-defined too, so a
periodic op stream is still cut at the same phase every time), and the rest carries over.
"""
from __future__ import annotations

import itertools
import sys

import torch

from .. import _C, _state, runtime

MAX_OPS = 512        # hard cap on a run's length
CUT_MODULUS = 32     # a cut after op b following op a when hash((a, b)) % CUT_MODULUS == 0
MIN_OPS = 64         # no content-defined cut in a run shorter than this

_uids = itertools.count(1)
_programs: dict = {}  # run signature -> (executable, outputs as local storage indices)


class _Run:
    def __init__(self, device):
        self.device = device
        self.records = []     # (entry, wiring of inputs, local indices of sinks)
        self.local = {}       # storage key -> local index
        self.tensors = {}     # local index -> a tensor of that storage (keeps pending storages alive)
        self.operands = []    # host values (scalars, rng states, CPU tensors), in order of use
        self.written = set()
        self.keys = []        # local index -> storage key
        self.hashes = []      # per record: hash of (previous op, this op)
        self.prev_uid = 0

    def index(self, key, tensor):
        i = self.local.get(key)
        if i is None:
            i = self.local[key] = len(self.local)
            self.tensors[i] = tensor
            self.keys.append(key)
        return i

    def add(self, entry, wiring, out_idx, name, pair_hash):
        self.records.append((entry, wiring, out_idx, name))
        self.hashes.append(pair_hash)
        self.written.update(out_idx)

    def carry(self, records, hashes, source):
        """Re-records `records` of run `source` here (a split run's remainder)."""
        for (entry, wiring, out_idx, name), h in zip(records, hashes):
            w = []
            for kind, i in wiring:
                if kind == "c":
                    w.append(("c", self.index(source.keys[i], source.tensors[i])))
                else:
                    w.append(("h", len(self.operands)))
                    self.operands.append(source.operands[i])
            outs = tuple(self.index(source.keys[i], source.tensors[i]) for i in out_idx)
            self.add(entry, tuple(w), outs, name, h)
        self.prev_uid = records[-1][0].uid if records else 0


_run: _Run | None = None


def _uid(entry):
    u = getattr(entry, "uid", None)
    if u is None:
        u = entry.uid = next(_uids)
    return u


def record(entry, inputs, sinks, device, name):
    """Records one op; returns its new output tensors (their values are computed at the flush)."""
    global _run
    if _run is not None and _run.device != device:
        flush()
    if _run is None:
        _run = _Run(device)
    run = _run
    new = _C._empty_like_specs(entry.new_outputs, device) if entry.new_outputs else []
    for t in new:  # type each new storage now: a later op may read it as another dtype (view_as_real)
        _C._storage_spec(t)
    wiring = []
    for o in inputs:
        if o.__class__ is tuple:  # a scalar or rng operand
            wiring.append(("h", len(run.operands)))
            run.operands.append(o)
        elif not o.is_cpu:
            wiring.append(("c", run.index(_C._storage_key(o), o)))
        else:
            o = o.clone()  # the host tensor may change before the flush
            wiring.append(("h", len(run.operands)))
            run.operands.append(o)
    it = iter(new)
    out_idx = []
    for s in sinks:
        t = next(it) if s is None else s
        out_idx.append(run.index(_C._storage_key(t), t))
    uid = _uid(entry)
    pair = hash((run.prev_uid, uid))
    run.add(entry, tuple(wiring), tuple(out_idx), name, pair)
    run.prev_uid = uid
    _state.count("fused_ops")
    n = len(run.records)
    if n >= MIN_OPS and pair % CUT_MODULUS == 0:
        flush()
    elif n >= MAX_OPS:
        _split(run)
    return new


def _split(run):
    """Flushes `run` up to the last occurrence of its smallest pair hash; the rest carries over."""
    global _run
    low = min(run.hashes[MIN_OPS - 1:])
    k = max(i for i in range(MIN_OPS - 1, len(run.hashes)) if run.hashes[i] == low)
    rest, rest_hashes = run.records[k + 1:], run.hashes[k + 1:]
    del run.records[k + 1:], run.hashes[k + 1:]
    run.written = {i for _, _, outs, _ in run.records for i in outs}
    nxt = _Run(run.device)
    nxt.carry(rest, rest_hashes, run)  # holds what the rest needs, so the prefix outputs it
    _run = run
    flush()
    _run = nxt


def _alive(run, i) -> bool:
    # Our dict holds one reference and getrefcount's argument one more: anything else is the user's.
    return sys.getrefcount(run.tensors[i]) > 2 or not _C._sole_owner(run.tensors[i])


def _build(run, outputs):
    """The fused module: @main calls each op's function in order."""
    funcs = {}
    for entry, _, _, _ in run.records:
        if entry.uid not in funcs:
            funcs[entry.uid] = entry.fn_text.replace("@__OP__", f"@op{entry.uid}", 1)
    args, arg_types, lines = [], [], []
    current = {}   # local storage index -> SSA name, type
    ext = []       # what each @main argument is: ("c", local) or ("h", operand index)
    for k, (entry, wiring, out_idx, _) in enumerate(run.records):
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
    for n, (a, t, (kind, i)) in enumerate(zip(args, arg_types, ext)):
        attr = ""
        if kind == "c" and i in outputs and results[outputs.index(i)][1] == t:
            attr = f" {{tf.aliasing_output = {outputs.index(i)} : i32}}"  # donate the old buffer
        params.append(f"{a}: {t}{attr}")
    rtypes = ", ".join(str(t) for _, t in results)
    main = (f"func.func public @main({', '.join(params)}) -> ({rtypes}) {{\n    " + "\n    ".join(lines) +
            f'\n    "func.return"({", ".join(n for n, _ in results)}) : ({rtypes}) -> ()\n  }}')
    return "module @torch_tpu_fused {\n  " + main + "\n  " + "\n  ".join(funcs.values()) + "\n}\n", ext


def flush():
    """Runs the recorded ops (if any) as one program."""
    global _run
    run, _run = _run, None
    if run is None or not run.records:
        return
    outputs = tuple(sorted(i for i in run.written if _alive(run, i)))
    signature = (tuple((e.uid, w, o) for e, w, o, _ in run.records), outputs)
    got = _programs.get(signature)
    if got is None:
        text, ext = _build(run, list(outputs))
        try:
            exe = runtime.compile(text)
        except RuntimeError:
            _replay(run)  # should not happen: each op compiled alone; keep going op by op
            raise
        got = _programs[signature] = (exe, ext)
        _state.count("fused_compiles")
    exe, ext = got
    inputs = [run.tensors[i] if kind == "c" else run.operands[i] for kind, i in ext]
    sinks = [run.tensors[i] for i in outputs]
    names = ", ".join(dict.fromkeys(n for _, _, _, n in run.records))
    _C._launch(exe, inputs, sinks, [], run.device, f"fused program of [{names}]")
    _state.count("fused_flushes")


def _replay(run):
    from .kernel import executable
    for entry, wiring, out_idx, name in run.records:
        inputs = [run.tensors[i] if kind == "c" else run.operands[i] for kind, i in wiring]
        _C._launch(executable(entry), inputs, [run.tensors[i] for i in out_idx], [], run.device, name)


def pending() -> int:
    """Number of recorded ops not yet run."""
    return len(_run.records) if _run is not None else 0
