"""accelerate launched as several processes on tpu (torch_tpu/integrations/accelerate.py): an
unchanged accelerate script trains DDP over tpu_dist, one tpu device per rank."""
import ast
import re

import pytest
import torch

from .runner import run_torchrun

accelerate = pytest.importorskip("accelerate")
from .accelerate_ranks import train  # noqa: E402

pytestmark = pytest.mark.multiprocess  # every test here starts processes


@pytest.mark.slow
def test_a_two_process_launch_trains_ddp_on_tpu_as_one_process_on_the_whole_batch():
    # torchrun --nproc_per_node 2 of an unchanged accelerate script: each rank on its own tpu device,
    # the model wrapped in DDP over tpu_dist, batches sharded; the weights equal one process's
    # training on the global batch (2 x 4) on CPU.
    out = run_torchrun(["--nproc_per_node", "2", "tests/distributed/accelerate_ranks.py"], timeout=240)
    ranks = dict(re.findall(r"rank (\d)/2 on tpu:0: losses \[.*?\] weights (\[.*?\])", out))
    assert set(ranks) == {"0", "1"}, out[-6000:]
    assert ranks["0"] == ranks["1"]
    one = accelerate.Accelerator(cpu=True)
    model, _ = train(one, batch_size=8)
    want = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.testing.assert_close(torch.tensor(ast.literal_eval(ranks["0"])), want, rtol=1e-5, atol=1e-5)
