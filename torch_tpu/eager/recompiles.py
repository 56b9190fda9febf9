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
import threading
import warnings

from .. import settings

_lock = threading.Lock()
# op or graph name -> Counter of causes
causes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
# op or graph name -> the signatures it has programs for (dtypes, sizes, layouts)
_seen: dict[str, list] = collections.defaultdict(list)
_warned: set = set()


def _classify(seen: list, sig: tuple) -> str:
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


def note(name: str, dtypes: tuple, sizes: tuple, layouts: tuple, what: str = "op", stacklevel: int = 2) -> str:
    """Records a new program of op / graph `name` for arguments of these dtypes, sizes and layouts
    (tuples, one entry per tensor argument; a layout is layout_of's); returns its cause. When its
    "new shape" programs reach TORCH_TPU_RECOMPILE_WARN (default 8; 0: never), warns, once per
    process for eager ops (a step's ops all reach it together) and once per compiled graph;
    stacklevel: the warning's, counted from the caller of note."""
    sig = (dtypes, sizes, layouts)
    with _lock:
        cause = _classify(_seen[name], sig)
        if len(_seen[name]) < 64:  # a bounded memory of what was seen is enough to classify
            _seen[name].append(sig)
        causes[name][cause] += 1
        shapes = causes[name]["new shape"]
        threshold = int(settings.get("TORCH_TPU_RECOMPILE_WARN") or 0)
        once = name if what != "op" else what
        warn = cause == "new shape" and 0 < threshold <= shapes and once not in _warned
        if warn:
            _warned.add(once)
    if warn:
        recent = [s[1] for s in _seen[name][-3:]]
        warnings.warn(
            f"torch_tpu: {what} {name} has made programs for {shapes + 1} different input shapes (the last: "
            f"{', '.join(str(list(map(list, r))) for r in recent)}): each new shape compiles a new program. "
            "Pad inputs to a few fixed sizes (e.g. Hugging Face's DataCollatorWithPadding(pad_to_multiple_of=64), "
            "or batches bucketed by length). torch_tpu.metrics.program_causes() counts programs by cause; "
            "TORCH_TPU_RECOMPILE_WARN sets this warning's threshold (0: never).", UserWarning, stacklevel=stacklevel + 1)
    return cause


def layout_of(t) -> tuple:
    """A tensor's layout class: (contiguous, at offset 0). Strides alone change with every size."""
    return (t.is_contiguous(), t.storage_offset() == 0)


def reset() -> None:
    with _lock:
        causes.clear()
        _seen.clear()
        _warned.clear()
