"""Builds and runs the GoogleTest suites of the C++ core:

- tests/cpp/pjrt_test.cc: the PJRT layer alone (csrc/pjrt);
- tests/cpp/runtime_test.cc: the runtime, executable cache, eager plan cache and eager mode, the
  dispatcher's op entry, fused eager's recorder and compiled graphs' runner, driven
  from several threads, built with ThreadSanitizer (any report fails the test).

Needs GoogleTest (Debian's libgtest-dev, which .ci/run installs); skipped with that reason without it.
"""
import concurrent.futures
import glob
import importlib.util
import os
import subprocess

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _gtest():
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib", "/usr/local/lib"):
        if os.path.exists(os.path.join(d, "libgtest.a")) or os.path.exists(os.path.join(d, "libgtest.so")):
            return d
    return None


def _plugin_dir():
    spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    return list(spec.submodule_search_locations)[0]


needs_gtest = pytest.mark.skipif(_gtest() is None, reason="GoogleTest is not installed (apt-get install libgtest-dev)")


def _run(exe, expect_passed, env=None):
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TORCH_TPU_TEST_PLUGIN": os.path.join(_plugin_dir(), "xla_cpu_pjrt.so"),
                            **(env or {})})
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-6000:]
    assert f"[  PASSED  ] {expect_passed} tests" in r.stdout, r.stdout[-2000:]
    return r


@needs_gtest
@pytest.mark.multiprocess
def test_pjrt_layer_googletest(tmp_path):
    pkg = _plugin_dir()
    exe = tmp_path / "pjrt_test"
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{ROOT}/csrc", f"-I{pkg}/include",
                    os.path.join(HERE, "cpp", "pjrt_test.cc"), os.path.join(ROOT, "csrc", "pjrt", "pjrt.cc"),
                    f"-L{_gtest()}", "-lgtest", "-lgtest_main", "-lpthread", "-ldl", "-o", str(exe)],
                   check=True, timeout=300)
    _run(exe, 10)


@needs_gtest
@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.tsan
def test_runtime_googletest_under_thread_sanitizer(tmp_path):
    """The runtime's shared state (cells, launch queue, caches, profiler records, scalar buffers) used from
    4 threads."""
    torch_dir = os.path.dirname(torch.__file__)
    flags = ["-std=c++17", "-O1", "-g", "-fsanitize=thread", "-fPIC",
             f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
             f"-I{ROOT}/csrc", f"-I{_plugin_dir()}/include", f"-I{torch_dir}/include",
             f"-I{torch_dir}/include/torch/csrc/api/include"]
    sources = [os.path.join(HERE, "cpp", "runtime_test.cc")] + sorted(
        p for d in ("aten", "eager", "graph", "pjrt", "runtime") for p in glob.glob(os.path.join(ROOT, "csrc", d, "*.cc")))

    def compile_one(src):
        obj = tmp_path / (os.path.basename(os.path.dirname(src)) + "_" + os.path.basename(src) + ".o")
        subprocess.run(["g++", *flags, "-c", src, "-o", str(obj)], check=True, timeout=600)
        return str(obj)

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        objects = list(pool.map(compile_one, sources))
    exe = tmp_path / "runtime_test"
    lib = os.path.join(torch_dir, "lib")
    subprocess.run(["g++", "-fsanitize=thread", *objects, f"-L{lib}", f"-Wl,-rpath,{lib}", "-ltorch_cpu", "-lc10",
                    f"-L{_gtest()}", "-lgtest", "-lgtest_main", "-lpthread", "-ldl", "-o", str(exe)],
                   check=True, timeout=300)
    suppressions = os.path.join(HERE, "cpp", "tsan.supp")
    r = _run(exe, 27, env={"TORCH_TPU_TEST_DIR": str(tmp_path / "cache"),
                          "TSAN_OPTIONS": f"halt_on_error=1 second_deadlock_stack=1 suppressions={suppressions}"})
    assert "WARNING: ThreadSanitizer" not in r.stderr, r.stderr[-6000:]
