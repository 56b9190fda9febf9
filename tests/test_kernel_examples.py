"""The custom-kernel examples (examples/kernels) run from a fresh process and match PyTorch."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax", reason="the kernels extra (pip install 'torch_tpu[kernels]') is not installed")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
EXAMPLES = ["pallas_matmul", "flash_attention", "tokamax_layer_norm", "helion_kernel"]


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.multiprocess
@pytest.mark.slow
def test_kernel_example(name):
    if name == "tokamax_layer_norm":
        pytest.importorskip("tokamax")
    if name == "helion_kernel":
        pytest.importorskip("helion")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "kernels", name + ".py")],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "match:" in r.stdout
