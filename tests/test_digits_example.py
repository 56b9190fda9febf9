"""The main job: the digits CNN trains on tpu, and a seeded run follows the CPU run's losses."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
pytest.importorskip("sklearn")


def test_digits_tpu_matches_cpu_and_learns(capsys):
    import torch_tpu
    import train_digits
    before = sum(torch_tpu.metrics.fallback_counts().values())
    tpu = train_digits.main(["--device", "tpu", "--epochs", "3"])
    cpu = train_digits.main(["--device", "cpu", "--epochs", "3"])
    assert sum(torch_tpu.metrics.fallback_counts().values()) == before, torch_tpu.metrics.fallback_counts()
    for lt, lc in zip(tpu["losses"], cpu["losses"]):
        assert abs(lt - lc) <= 2e-3 * max(1.0, abs(lc)), (tpu["losses"], cpu["losses"])
    assert tpu["losses"][-1] < tpu["losses"][0]
    assert abs(tpu["accuracy"] - cpu["accuracy"]) <= 0.01
    out = capsys.readouterr().out
    assert "platform: cpu" in out and "test accuracy" in out and "time per epoch" in out
