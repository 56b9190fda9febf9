"""Builds and runs the GoogleTest suites of the C++ core (CI and the README's test command call it
before pytest; pytest does not build C++):

- pjrt_test (tests/cpp/pjrt_test.cc): the PJRT layer alone (csrc/pjrt), against the CPU plugin;
- runtime_test (tests/cpp/runtime_test.cc): the runtime, executable cache, eager plan cache and eager
  mode, the dispatcher's op entry, fused eager's recorder and compiled graphs' runner, driven from
  several threads, built with ThreadSanitizer (any report fails it; tests/cpp/tsan.supp lists the
  suppressions).

    python tests/cpp/run.py [--only pjrt|runtime] [--build-dir build/cpp_tests] [-j N]

Objects are kept in the build directory and rebuilt only when their source or a header they include
changed (g++'s -MMD dependency files), so a second run after an edit recompiles what the edit touched.
Needs GoogleTest (Debian's libgtest-dev, which .ci/run installs): without it, says so and exits 0, as
a skipped test would. Exits 1 when a build or a suite fails (its output is printed), else 0.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import glob
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SUITES = ("pjrt", "runtime")


def gtest_dir() -> str | None:
    """The directory holding libgtest (None: GoogleTest is not installed)."""
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib", "/usr/local/lib"):
        if os.path.exists(os.path.join(d, "libgtest.a")) or os.path.exists(os.path.join(d, "libgtest.so")):
            return d
    return None


def plugin_dir() -> str:
    """The installed CPU PJRT plugin's package directory (its include/ has the PJRT C API header)."""
    spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    if spec is None:
        sys.exit("tests/cpp/run.py: the CPU PJRT plugin (xla-cpu-pjrt) is not installed: run the README's setup first")
    return list(spec.submodule_search_locations)[0]


def _stale(obj: str, src: str) -> bool:
    """Whether obj must be rebuilt: missing, or older than its source or any header its .d file lists."""
    if not os.path.exists(obj) or not os.path.exists(obj + ".d"):
        return True
    t = os.path.getmtime(obj)
    with open(obj + ".d") as f:
        deps = f.read().replace("\\\n", " ").split(":", 1)[-1].split()
    return any(not os.path.exists(d) or os.path.getmtime(d) > t for d in deps + [src])


def _compile(flags: list[str], src: str, obj: str) -> None:
    if _stale(obj, src):
        r = subprocess.run(["g++", *flags, "-MMD", "-MF", obj + ".d", "-c", src, "-o", obj],
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"compiling {os.path.relpath(src, ROOT)} failed:\n{r.stderr[-6000:]}")


def _link(args: list[str]) -> None:
    r = subprocess.run(["g++", *args], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"linking failed:\n{r.stderr[-6000:]}")


def build(suite: str, out: str, jobs: int) -> str:
    """Builds suite `suite` in directory `out`; returns its executable's path."""
    pkg, gtest = plugin_dir(), gtest_dir()
    os.makedirs(out, exist_ok=True)
    exe = os.path.join(out, suite + "_test")
    libs = [f"-L{gtest}", "-lgtest", "-lgtest_main", "-lpthread", "-ldl"]
    if suite == "pjrt":
        flags = ["-std=c++17", "-O1", f"-I{ROOT}/csrc", f"-I{pkg}/include"]
        sources = [os.path.join(HERE, "pjrt_test.cc"), os.path.join(ROOT, "csrc", "pjrt", "pjrt.cc")]
        extra = []
    else:
        import torch
        torch_dir = os.path.dirname(torch.__file__)
        flags = ["-std=c++17", "-O1", "-g", "-fsanitize=thread", "-fPIC",
                 f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
                 f"-I{ROOT}/csrc", f"-I{pkg}/include", f"-I{torch_dir}/include",
                 f"-I{torch_dir}/include/torch/csrc/api/include"]
        sources = [os.path.join(HERE, "runtime_test.cc")] + sorted(
            p for d in ("aten", "eager", "graph", "pjrt", "runtime")
            for p in glob.glob(os.path.join(ROOT, "csrc", d, "*.cc")))
        lib = os.path.join(torch_dir, "lib")
        extra = ["-fsanitize=thread", f"-L{lib}", f"-Wl,-rpath,{lib}", "-ltorch_cpu", "-lc10"]
    objects = [os.path.join(out, suite + "-" + os.path.relpath(s, ROOT).replace(os.sep, "_") + ".o") for s in sources]
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda so: _compile(flags, *so), zip(sources, objects)))
    if not os.path.exists(exe) or any(os.path.getmtime(o) > os.path.getmtime(exe) for o in objects):
        _link([*extra, *objects, *libs, "-o", exe])
    return exe


def declared_tests(suite: str) -> int:
    """How many TEST / TEST_F cases the suite's source declares."""
    with open(os.path.join(HERE, suite + "_test.cc")) as f:
        return len(re.findall(r"^TEST(?:_F)?\(", f.read(), flags=re.M))


def run(suite: str, exe: str) -> subprocess.CompletedProcess:
    """Runs a built suite against the CPU plugin (runtime_test with a cache directory of its own,
    empty: its tests count tier hits, and ThreadSanitizer halting on the first report)."""
    env = {**os.environ, "TORCH_TPU_TEST_PLUGIN": os.path.join(plugin_dir(), "xla_cpu_pjrt.so")}
    with tempfile.TemporaryDirectory(prefix="torch_tpu_cpp_tests-") as scratch:
        if suite == "runtime":
            env["TORCH_TPU_TEST_DIR"] = scratch
            env["TSAN_OPTIONS"] = f"halt_on_error=1 second_deadlock_stack=1 suppressions={os.path.join(HERE, 'tsan.supp')}"
        return subprocess.run([exe], capture_output=True, text=True, timeout=600, env=env)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=SUITES, action="append", help="a suite to run (repeatable; default: both)")
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build", "cpp_tests"))
    p.add_argument("-j", "--jobs", type=int, default=len(os.sched_getaffinity(0)))
    a = p.parse_args()
    if gtest_dir() is None:
        print("tests/cpp/run.py: skipped: GoogleTest is not installed (apt-get install libgtest-dev)")
        return 0
    failed = False
    for suite in a.only or SUITES:
        t0 = time.perf_counter()
        try:
            exe = build(suite, a.build_dir, max(1, a.jobs))
        except RuntimeError as e:
            print(f"{suite}_test: {e}")
            failed = True
            continue
        t1 = time.perf_counter()
        r = run(suite, exe)
        # A ThreadSanitizer report fails the suite even where the tests themselves passed.
        ok = r.returncode == 0 and "WARNING: ThreadSanitizer" not in r.stderr and "[  FAILED  ]" not in r.stdout
        # Every test the source declares ran and passed (a suite that silently ran fewer fails).
        ok = ok and f"[  PASSED  ] {declared_tests(suite)} test" in r.stdout
        summary = [ln for ln in r.stdout.splitlines() if ln.startswith("[  PASSED  ]") or ln.startswith("[  FAILED  ]")]
        print(f"{suite}_test: {'passed' if ok else 'FAILED'} (build {t1 - t0:.0f} s, run {time.perf_counter() - t1:.0f} s) "
              + " ".join(summary))
        if not ok:
            print(r.stdout[-4000:] + r.stderr[-6000:])
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
