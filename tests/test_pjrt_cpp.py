"""Builds and runs the GoogleTest suite of the C++ PJRT layer (tests/cpp/pjrt_test.cc).

Needs GoogleTest (Debian's libgtest-dev, which .ci/run installs); skipped with that reason without it.
"""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _gtest():
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib", "/usr/local/lib"):
        if os.path.exists(os.path.join(d, "libgtest.a")) or os.path.exists(os.path.join(d, "libgtest.so")):
            return d
    return None


@pytest.mark.skipif(_gtest() is None, reason="GoogleTest is not installed (apt-get install libgtest-dev)")
def test_pjrt_layer_googletest(tmp_path):
    sys.path.insert(0, ROOT)
    import importlib.util
    spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    pkg = list(spec.submodule_search_locations)[0]
    exe = tmp_path / "pjrt_test"
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{ROOT}/csrc", f"-I{pkg}/include",
                    os.path.join(HERE, "cpp", "pjrt_test.cc"), os.path.join(ROOT, "csrc", "pjrt", "pjrt.cc"),
                    f"-L{_gtest()}", "-lgtest", "-lgtest_main", "-lpthread", "-ldl", "-o", str(exe)],
                   check=True, timeout=300)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TORCH_TPU_TEST_PLUGIN": os.path.join(pkg, "xla_cpu_pjrt.so")})
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "[  PASSED  ] 7 tests" in r.stdout, r.stdout[-2000:]
