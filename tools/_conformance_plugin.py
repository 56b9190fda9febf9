"""pytest plugin of tools/device_conformance.py: per-test outcomes as JSON lines, and per-test timeouts.

Loaded with `-p _conformance_plugin` (tools/ on PYTHONPATH). Environment:
  CONFORMANCE_OUT      file to append one JSON object per test to: {"id", "outcome", "kind", "seconds"}
  CONFORMANCE_TIMEOUT  seconds one test may take (default 60): past it a SIGALRM raises TimeoutError in
                       the test; a test stuck where Python cannot interrupt it (inside a C++ call) is
                       recorded as "timeout" by a watchdog at twice the limit, which ends the process
                       (the runner then starts pytest again for the tests not yet recorded).
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time

_OUT = os.environ.get("CONFORMANCE_OUT")
_LIMIT = float(os.environ.get("CONFORMANCE_TIMEOUT", "60"))


def _record(test_id: str, outcome: str, kind: str, seconds: float) -> None:
    if _OUT:
        with open(_OUT, "a") as f:
            f.write(json.dumps({"id": test_id, "outcome": outcome, "kind": kind, "seconds": round(seconds, 3)}) + "\n")


def _kind(report) -> str:
    """The failure's exception type and the first line of its message."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.strip().splitlines()[0][:300] if crash.message.strip() else "?"
    return str(report.longrepr).strip().splitlines()[-1][:300] if report.longrepr else "?"


class _Watchdog:
    def __init__(self):
        self.current = None
        self.started = 0.0
        self.lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        while True:
            time.sleep(1.0)
            with self.lock:
                stuck = self.current is not None and time.monotonic() - self.started > 2 * _LIMIT
                test_id = self.current
            if stuck:
                _record(test_id, "timeout", f"timeout: over {2 * _LIMIT:.0f} s, not interruptible", 2 * _LIMIT)
                os._exit(3)


_watchdog = None


def _on_alarm(signum, frame):
    raise TimeoutError(f"conformance timeout: over {_LIMIT:.0f} s")


def pytest_configure(config):
    global _watchdog
    _watchdog = _Watchdog()
    signal.signal(signal.SIGALRM, _on_alarm)


def pytest_runtest_logstart(nodeid, location):
    with _watchdog.lock:
        _watchdog.current, _watchdog.started = nodeid, time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, _LIMIT)


_state: dict = {}


def pytest_runtest_logreport(report):
    st = _state.setdefault(report.nodeid, {"outcome": "passed", "kind": "", "seconds": 0.0})
    st["seconds"] += report.duration
    if report.failed and st["outcome"] != "failed":
        st["outcome"], st["kind"] = "failed", _kind(report)
        if "conformance timeout" in st["kind"]:
            st["outcome"] = "timeout"
    elif report.skipped and hasattr(report, "wasxfail") and st["outcome"] == "passed":
        st["outcome"], st["kind"] = "xfail", ""  # an expected failure (PyTorch's expectedFailure...)
    elif report.skipped and st["outcome"] == "passed":
        st["outcome"] = "skipped"
        st["kind"] = str(report.longrepr[2])[:300] if isinstance(report.longrepr, tuple) else ""


def pytest_runtest_logfinish(nodeid, location):
    signal.setitimer(signal.ITIMER_REAL, 0)
    with _watchdog.lock:
        _watchdog.current = None
    st = _state.pop(nodeid, {"outcome": "failed", "kind": "no report", "seconds": 0.0})
    _record(nodeid, st["outcome"], st["kind"], st["seconds"])
