import os
import sys
import tempfile
import warnings
import zlib

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
# The tests' executable cache lives in a fresh directory, not in the user's cache.
os.environ.setdefault("TORCH_TPU_CACHE_DIR", tempfile.mkdtemp(prefix="torch_tpu_test_cache_"))
# Nor in the user's per-host or shared tiers (tests that use them set them).
os.environ.pop("TORCH_TPU_TIER2_COMPILATION_CACHE", None)
os.environ.pop("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", None)
# The recompile warning fires once per process, in whichever test makes the 8th shape of an op:
# tests that check warnings would depend on the order. tests/test_recompiles.py turns it on.
os.environ["TORCH_TPU_RECOMPILE_WARN"] = "0"
import torch_tpu  # noqa: E402,F401

# `import torch` above already loaded torch_tpu (PyTorch's device-backend autoloading) and set its
# cache from the environment as it was then: set it again from the variables above.
torch_tpu.compile_cache.configure()

warnings.filterwarnings("ignore", message="No TPU here")

# Tests by kind, so a developer can run the fast part alone (docs/development.md); the README's
# command and CI run every test.
MARKERS = {
    "slow": "takes 5 s or more on a 2-core machine (measured with --durations)",
    "multiprocess": "starts processes: a fresh interpreter, a cold cache, torchrun ranks, a subprocess build",
    "libtpu": "compiles for a TPU topology with libtpu (skipped without it)",
}


def pytest_configure(config):
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")


@pytest.fixture(autouse=True)
def _seeded(request):
    """Every test draws its random data from its own fixed seed: a failure reproduces, whatever
    order pytest-xdist runs the tests in."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def no_fallback(monkeypatch):
    """Makes any CPU fallback an error for the test (TORCH_TPU_CPU_FALLBACK=0)."""
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "0")
    yield
