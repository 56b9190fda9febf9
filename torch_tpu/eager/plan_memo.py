"""Eager plans remembered across processes beside the executables they run.

A plan-cache miss builds the call's plan in Python (kernel.py's _build: result types, PyTorch's
checks, the lowering into a program, where its results go): about 1.5 ms per call key. A warm process
finds every executable on disk, yet it paid that for each key of its first step (~100 for the
README's digits CNN: a warm first epoch 2.6-3x a later one). This memo keeps each built plan so
that a later process, on its first call with the same key, takes it instead of building it anew.

What is kept, per (lowering platform, overload, call key words): the program text and what the
front end needs to run it (_Entry's fields, kernel.py). A key fixes every input of the build as it
fixes the in-memory plan cache's hit (csrc/eager/call.h: dtypes, sizes, strides, storages and
offsets, Scalar kinds, other arguments by value, the default dtype and matmul precision); the store's
file is named by torch's version and a fingerprint of torch_tpu's files (meta_memo.MetaMemo), so an
upgrade or an edit of a lowering starts a new memo. Kept only: aten overloads lowered by torch_tpu
(a custom kernel's program comes from the user's code, which no fingerprint covers), whose build
succeeded, warned nothing (a warning must be seen again) and resized nothing. Off when the disk tier
is off (as the meta memo).
"""
from __future__ import annotations

import torch

from .. import _C, runtime
from ..lowering.builder import TensorType
from .meta_memo import MetaMemo

PLANS = MetaMemo("plans-")


def _key(memo_key: str | None) -> str | None:
    # Pallas lowerings differ by platform; aot lowers for a TPU target inside a CPU process.
    return None if memo_key is None else runtime.lowering_platform() + "/" + memo_key


def _type(t: TensorType) -> list:
    return [list(t.shape), str(t.dtype).removeprefix("torch.")]


def _dtype(name: str) -> torch.dtype:
    d = getattr(torch, name)
    if not isinstance(d, torch.dtype):
        raise ValueError(name)
    return d


def keep(memo_key: str | None, overload, entry) -> None:
    """Keeps `entry` (kernel._Entry, just built for a call of `overload` that warned nothing)."""
    if memo_key is None or overload.namespace != "aten" or entry.resize or entry.functions or not entry.text:
        return
    if any(v is not None and not isinstance(v, int) for _, v in entry.fixed):
        return
    PLANS.put(_key(memo_key), {
        "plan": list(entry.order),
        "fresh": [[list(s.sizes), str(s.dtype).removeprefix("torch."), None if s.strides is None else list(s.strides)]
                  for s in entry.fresh],
        "sinks": [[bool(s.fresh), int(s.index)] for s in entry.sinks],
        "structure": int(entry.structure),
        "rng": int(entry.rng_draws),
        "fixed": [[int(i), v] for i, v in entry.fixed],
        "text": entry.text,
        "fn": entry.fn_text,
        "args": [_type(t) for t in entry.arg_types],
        "results": [_type(t) for t in entry.result_types],
    })


def recall(memo_key: str | None, name: str, entry_type):
    """The entry (an `entry_type`, kernel._Entry, with no executable yet) an earlier process kept
    for this key, or None (nothing kept, or a record that does not decode: the plan is built)."""
    key = _key(memo_key)
    rec = PLANS.get(key)
    if rec is None:
        return None
    try:
        fresh = [_C.eager.FreshSpec(tuple(sz), _dtype(dt), None if st is None else tuple(st))
                 for sz, dt, st in rec["fresh"]]
        return entry_type(
            None, [int(p) for p in rec["plan"]], fresh,
            [_C.eager.PlanSink(bool(f), int(i)) for f, i in rec["sinks"]],
            _C.eager.ResultStructure(int(rec["structure"])), rng_draws=int(rec["rng"]),
            fixed=tuple((int(i), v) for i, v in rec["fixed"]), text=rec["text"], name=name, fn_text=rec["fn"],
            arg_types=[TensorType(tuple(s), _dtype(d)) for s, d in rec["args"]],
            result_types=[TensorType(tuple(s), _dtype(d)) for s, d in rec["results"]])
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError):
        PLANS.discard(key)  # built anew, and kept anew
        return None
