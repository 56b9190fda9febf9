import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import torch_tpu  # noqa: E402,F401

warnings.filterwarnings("ignore", message="No TPU here")


@pytest.fixture
def no_fallback(monkeypatch):
    """Makes any CPU fallback an error for the test (TORCH_TPU_CPU_FALLBACK=0)."""
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "0")
    yield
