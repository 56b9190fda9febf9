"""Why programs are made: each new eager op program and each per-shape program of a compiled graph,
counted by cause, and a warning when one op or graph keeps making programs for new shapes
(issue 49: a sentence length that changes every step made 51 programs per new length).

Causes, against the earlier programs of the same op (or graph): "first" (its first), "new shape"
(dtypes seen before, other sizes), "new dtype", "new layout" (the same sizes and dtypes, another
layout: contiguous or not, a view at offset 0 or elsewhere), "new arguments" (anything else:
non-tensor arguments, Scalar types, the default dtype or matmul precision). Read through
torch_tpu.metrics.program_causes(). A program loaded from the disk cache counts as made: the cause
is why the process needed it.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import warnings

import torch

from . import settings

_lock = threading.Lock()
# op or graph name -> Counter of causes
causes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
# op or graph name -> the signatures it has programs for (dtypes, sizes, layouts)
# (the latest 64: enough to classify, and a length that changes always finds its predecessor)
_seen: dict[str, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=64))
_warned: set = set()
# op or graph name -> {its sizes with the varying positions blanked: the sizes seen there}
# (_one_dimension_varies)
_varying: dict[str, dict] = collections.defaultdict(dict)
# compiled graph name -> why it is compiled per shape rather than per bucket (dynamo/buckets.py)
refusals: dict[str, str] = {}


def refused_bucketing(name: str, why: str) -> None:
    with _lock:
        refusals[name] = why


def _classify(seen, sig: tuple) -> str:
    dtypes, sizes, layouts = sig
    if not seen:
        return "first"
    same = [s for s in seen if s[0] == dtypes]
    if not same:
        return "new dtype"
    if any(s[1] == sizes and s[2] == layouts for s in same):
        return "new arguments"
    if any(s[1] == sizes for s in same):
        return "new layout"
    return "new shape"


def _one_dimension_varies(seen, sig: tuple):
    """The dimension `sig` varies when it is an earlier signature (same dtypes, layouts and ranks, a
    tensor of rank >= 2 among them) with one size value replaced by another wherever it differs: a batch
    size or a sequence length that changes (17 -> 23 in (8, 17, 64) and in attention's (8, 4, 17, 17)).
    Returns (the new sizes with those positions blanked, the old and new value), or None. The warning
    counts the values seen under one blanked key: a length that changes adds one per new length, while
    a model's layers rarely share all sizes but one (the most among torchvision's: densenet121's
    bottleneck convs, 30 input widths; mobilenet_v3 and efficientnet_b7's depthwise kernels, 8)."""
    dtypes, sizes, layouts = sig
    if not any(len(t) >= 2 for t in sizes):
        return None
    for s in seen:
        if s[0] != dtypes or s[2] != layouts or [len(t) for t in s[1]] != [len(t) for t in sizes]:
            continue
        swaps = {(a, b) for old, new in zip(s[1], sizes) for a, b in zip(old, new) if a != b}
        if len(swaps) == 1:
            key = tuple(tuple(None if a != b else b for a, b in zip(old, new)) for old, new in zip(s[1], sizes))
            return key, next(iter(swaps))
    return None


# Frames of these files are not the user's line a warning should name (Python 3.12's
# warnings.warn(skip_file_prefixes=...), by hand for 3.11).
_LIBRARY = (os.path.dirname(os.path.abspath(__file__)) + os.sep, os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)


def _warn_at_user_code(message: str) -> None:
    """warnings.warn(message, UserWarning) attributed to the innermost frame outside torch and
    torch_tpu (an op reached through autograd or Dynamo has no fixed stack depth: a fixed stacklevel
    named sys:1 or a torch file)."""
    f = sys._getframe(1)
    while f is not None and (f.f_code.co_filename.startswith(_LIBRARY) or f.f_code.co_filename.startswith("<")):
        f = f.f_back
    if f is None:
        warnings.warn(message, UserWarning, stacklevel=2)
        return
    warnings.warn_explicit(message, UserWarning, f.f_code.co_filename, f.f_lineno, module=f.f_globals.get("__name__"),
                           registry=f.f_globals.setdefault("__warningregistry__", {}), module_globals=f.f_globals)


def note(name: str, dtypes: tuple, sizes: tuple, layouts: tuple, what: str = "op") -> str:
    """Records a new program of op / graph `name` for arguments of these dtypes, sizes and layouts
    (tuples, one entry per tensor argument; a layout is layout_of's); returns its cause. When its
    programs cover TORCH_TPU_RECOMPILE_WARN sizes (default 32; 0: never) of one varying dimension, all its
    other sizes equal (a length or batch size that changes, not a model's differently shaped layers), warns, once per
    process for eager ops (a step's ops all reach it together) and once per compiled graph, naming
    the user's line that reached it."""
    sig = (dtypes, sizes, layouts)
    with _lock:
        cause = _classify(_seen[name], sig)
        if what == "compiled graph bucket" and cause == "new shape":
            cause = "new bucket"
        varying = _one_dimension_varies(_seen[name], sig) if cause == "new shape" else None
        _seen[name].append(sig)
        causes[name][cause] += 1
        shapes = 0
        if varying is not None:
            groups = _varying[name]
            values = groups.setdefault(varying[0], set()) if len(groups) < 256 else groups.get(varying[0], set())
            values.update(varying[1])
            shapes = len(values)
        threshold = _threshold()
        once = name if what != "op" else what
        warn = 0 < threshold <= shapes and once not in _warned
        if warn:
            _warned.add(once)
            where = _describe(varying[0], sorted(values))
    if warn:
        _warn_at_user_code(
            f"torch_tpu: {what} {name} has made programs for {shapes} sizes of a dimension that changes ({where}): "
            "each new shape compiles a new program. "
            "Pad inputs to a few fixed sizes (e.g. Hugging Face's DataCollatorWithPadding(pad_to_multiple_of=64), "
            "or batches bucketed by length). torch_tpu.metrics.program_causes() counts programs by cause; "
            "TORCH_TPU_RECOMPILE_WARN sets this warning's threshold (0: never).")
    return cause


def _threshold() -> int:
    raw = settings.get("TORCH_TPU_RECOMPILE_WARN") or "0"
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"TORCH_TPU_RECOMPILE_WARN={raw!r}: expected a number of sizes (0: never warn)") from None


def _describe(key: tuple, values: list) -> str:
    """Which dimension varies and its sizes: "dimension 1 of argument 0, sizes 17, 23, 31 (other sizes
    [8, *, 64])"; key is the blanked signature (None where the size varies)."""
    places = [f"dimension {d} of argument {a}" for a, dims in enumerate(key) for d, n in enumerate(dims) if n is None]
    shown = ", ".join(map(str, values[:8])) + (", ..." if len(values) > 8 else "")
    shapes = ", ".join("[" + ", ".join("*" if n is None else str(n) for n in dims) + "]" for dims in key)
    return f"{' and '.join(places[:3])}{' and more' if len(places) > 3 else ''}: sizes {shown}; shapes {shapes}"


def layout_of(t) -> tuple:
    """A tensor's layout class: (contiguous, at offset 0). Strides alone change with every size."""
    return (t.is_contiguous(), t.storage_offset() == 0)


def reset() -> None:
    with _lock:
        causes.clear()
        _seen.clear()
        _varying.clear()
        _warned.clear()
        refusals.clear()
