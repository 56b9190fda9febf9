"""Result types of eager calls, remembered across processes beside the executables.

A plan-cache miss asks PyTorch's meta kernel for the call's result types (kernel.py's _build). Many
meta kernels are Python (torch._meta_registrations, torch._refs), and their first call imports
torch.fx.experimental.symbolic_shapes (sympy) and torch._dynamo: about a second that a CPU process
running the same model never spends. The executables are on disk already (the compile cache), so a
warm process would spend most of its first step importing. This memo keeps what meta said of each
call key, so that a key seen by an earlier process runs no meta kernel.

What is kept, per (overload, call key words): the result structure and each result's shape, dtype
and strides, or, for an in-place op, only that meta accepted the call. Only calls whose meta kernel
succeeded and warned nothing are kept (errors and warnings are raised anew by the meta kernel). A
key determines the meta result as it determines the plan (csrc/eager/call.h: dtypes, sizes,
strides, storages, Scalar types, other arguments by value), so the memo holds what the in-memory
plan cache would; it is keyed besides by torch's version and a fingerprint of torch_tpu's files
(the key encoding and our meta overrides live there), so an upgrade or an edit starts a new memo.

Storage: one append-only file, <disk cache dir>/meta-<fingerprint>.jsonl, one JSON record per line,
each line written with one write(2) on an O_APPEND descriptor (processes of one host append
concurrently; a torn or foreign line is skipped). Off when the disk tier is off; a file past
_MAX_BYTES is not appended to. Memo files unused for _STALE_DAYS are removed when a new one starts.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time

import torch

from .. import compile_cache

_MAX_BYTES = 32 << 20
_STALE_DAYS = 14
_PREFIX, _SUFFIX = "meta-", ".jsonl"


def _fingerprint() -> str:
    """torch's version and every torch_tpu file's name, size and modification time, hashed."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256(torch.__version__.encode())
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith((".py", ".so")):
                st = os.stat(os.path.join(d, f))
                h.update(f"{os.path.relpath(os.path.join(d, f), root)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:32]


class MetaMemo:
    """The memo of one process: loaded from its file on first use; lookups and additions are
    thread-safe. `prefix` names its files (<disk cache dir>/<prefix><fingerprint>.jsonl): the plan
    memo (plan_memo.py) keeps its records in a store of this kind too."""

    def __init__(self, prefix: str = _PREFIX):
        self._prefix = prefix
        self._lock = threading.Lock()
        self._records: dict[str, object] | None = None
        self._dir = ""  # the disk tier's directory the records were loaded for
        self._path = ""

    def _ensure_loaded(self) -> None:
        d = compile_cache.disk_dir()
        if self._records is None or d != self._dir:  # first use, or the tiers were configured anew
            self._load(d)

    def _load(self, d: str) -> None:
        self._records, self._dir, self._path = {}, d, ""
        if not d:
            return
        self._path = os.path.join(d, self._prefix + _fingerprint() + _SUFFIX)
        try:
            with open(self._path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            self._remove_stale(d)
            return
        except OSError:
            self._path = ""
            return
        for line in data.splitlines():
            try:
                k, rec = json.loads(line)
            except ValueError:
                continue  # torn by a crash, or not ours: that key's meta runs again
            if isinstance(k, str):
                self._records[k] = rec

    def _remove_stale(self, d: str) -> None:
        cutoff = time.time() - _STALE_DAYS * 86400
        try:
            names = [n for n in os.listdir(d) if n.startswith(self._prefix) and n.endswith(_SUFFIX)]
            for n in names:
                p = os.path.join(d, n)
                if os.stat(p).st_mtime < cutoff:
                    os.unlink(p)
        except OSError:
            pass

    @staticmethod
    def key(name: str, words: bytes | None) -> str | None:
        """The memo key of overload `name`'s call with key words `words` (None: a call the plan
        cache does not keep, so neither does the memo)."""
        if words is None:
            return None
        return name + ":" + hashlib.blake2b(words, digest_size=16).hexdigest()

    def get(self, key: str | None):
        """The record kept for `key`, or None."""
        if key is None:
            return None
        with self._lock:
            self._ensure_loaded()
            return self._records.get(key)

    def discard(self, key: str) -> None:
        """Forgets the record of `key` (one that does not decode), so that put keeps a new one; a
        later process reads both lines and keeps the last."""
        with self._lock:
            if self._records is not None:
                self._records.pop(key, None)

    def put(self, key: str | None, record) -> None:
        """Keeps `record` (JSON-serialisable) for `key`, in memory and in the file."""
        if key is None:
            return
        line = (json.dumps([key, record], separators=(",", ":")) + "\n").encode()
        with self._lock:
            self._ensure_loaded()
            if key in self._records:
                return
            self._records[key] = record
            if not self._path:
                return
            try:
                os.makedirs(self._dir, mode=0o700, exist_ok=True)  # (the compile cache may not have made it yet)
                fd = os.open(self._path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    size = os.fstat(fd).st_size
                    if size < _MAX_BYTES:
                        if size and os.pread(fd, 1, size - 1) != b"\n":
                            line = b"\n" + line  # after a torn line: that one stays unreadable, not this one
                        if os.write(fd, line) < len(line):
                            self._path = ""  # a short write (a full disk, a file size limit): stop appending
                finally:
                    os.close(fd)
            except OSError:
                self._path = ""  # an unwritable directory: this process keeps its memo in memory


MEMO = MetaMemo()


def tensor_record(m) -> list | None:
    """A meta result as kept: [sizes, dtype name, strides], None for an undefined tensor."""
    return None if m is None else [list(m.shape), str(m.dtype).removeprefix("torch."), list(m.stride())]


def _tensor_of(rec):
    """The meta tensor a kept record describes (tensor_record's inverse)."""
    if rec is None:
        return None
    shape, dtype, strides = rec
    dtype = getattr(torch, dtype)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(dtype)
    return torch.empty_strided(shape, strides, dtype=dtype, device="meta")


def recall(key: str | None, written: bool):
    """What MEMO keeps for `key`, decoded: for an in-place op lowered as itself (`written`) "written";
    otherwise (structure as an int, [meta tensor or None per result]). None when nothing sound is
    kept (a record that does not decode is ignored: its meta runs again)."""
    rec = MEMO.get(key)
    if rec is None or written:
        return rec if rec == "written" else None
    try:
        structure, results = rec
        return int(structure), [_tensor_of(r) for r in results]
    except (TypeError, ValueError, AttributeError, RuntimeError):
        return None
