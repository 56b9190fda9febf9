"""tools/device_conformance.py, end to end on a small device-type test file of our own: the tests both
devices have are paired, a failure on tpu alone is reported by kind, a hang is a timeout."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import device_conformance  # noqa: E402

SAMPLE = '''
import time
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase, run_tests


class TestSample(TestCase):
    def test_adds(self, device):
        self.assertEqual((torch.ones(3, device=device) + 1).cpu(), torch.full((3,), 2.0))

    def test_differs(self, device):
        if torch.device(device).type != "cpu":
            raise ValueError(f"not on {device}: 12 elements at 0x7f00")

    def test_hangs(self, device):
        if torch.device(device).type != "cpu":
            time.sleep(600)


instantiate_device_type_tests(TestSample, globals(), only_for=("cpu", "privateuse1"))

if __name__ == "__main__":
    run_tests()
'''


def test_names_and_kinds():
    free = device_conformance.device_free
    assert free("t.py::TestXTPU::test_a_tpu_float32") == free("t.py::TestXCPU::test_a_cpu_float32")
    assert free("t.py::TestXPRIVATEUSE1::test_a_tpu") == free("t.py::TestXCPU::test_a_cpu")
    assert free("t.py::TestX::test_a") is None  # not a device-type test
    kind = device_conformance.kind_of
    assert kind("ValueError: 3 elements at 0x7f01\nmore") == kind("ValueError: 12 elements at 0x7f00")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_file_on_tpu_and_cpu(tmp_path):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    out = tmp_path / "report.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "device_conformance.py"), str(tmp_path),
                        "--files", "test_sample.py", "--timeout", "20", "--json", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "test_sample.py: 3 tests" in r.stdout, r.stdout
    assert "tpu: 1 passed, 1 failed, 1 timeouts" in r.stdout, r.stdout
    assert "cpu: 3 passed, 0 failed, 0 timeouts" in r.stdout, r.stdout
    assert "tpu-only failures: 2" in r.stdout, r.stdout
    only = json.loads(out.read_text())["test_sample.py"]["tpu_only"]
    assert sorted(only) == ["TimeoutError: conformance timeout: over N s", "ValueError: not on tpu:N: N elements at ADDR"], only
