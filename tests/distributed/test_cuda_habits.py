"""CUDA-habit scripts run unchanged on tpu: under torchrun, `torch.tpu.set_device(local_rank)`,
`torch.device(f"tpu:{local_rank}")` and `DDP(model, device_ids=[local_rank])` name each process's own
device (tpu:0) on every rank, `torch.accelerator.device_count()` is the host's process count (the
examples' start-up check) and another rank's index is a clear error; `init_process_group("nccl")` where NCCL is not built in says to use
tpu_dist."""
import os
import subprocess
import sys

import pytest

from .runner import REPO, run_torchrun

pytestmark = pytest.mark.multiprocess  # every test here starts processes


@pytest.mark.slow
def test_cuda_habit_ddp_script_runs_on_every_rank():
    out = run_torchrun(["--nproc_per_node", "2", "tests/distributed/cuda_habit_ddp.py"], timeout=180)
    assert "OK rank 0" in out and "OK rank 1" in out, out[-6000:]


def test_nccl_where_it_is_not_built_in_names_tpu_dist(tmp_path):
    code = ("import torch, torch_tpu, torch.distributed as dist\n"
            "try:\n"
            f"    dist.init_process_group('nccl', init_method='file://{tmp_path}/store', rank=0, world_size=1)\n"
            "except RuntimeError as e:\n"
            "    print('RAISED', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                       env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")})
    assert "RAISED" in r.stdout and "NCCL built in" in r.stdout and "'tpu_dist'" in r.stdout, r.stdout + r.stderr
