"""nn.SyncBatchNorm under DDP on tpu_dist, 2 ranks: a small conv net converted with
convert_sync_batchnorm, each rank training on its half of every global batch, against the same net
with nn.BatchNorm2d trained on CPU on the whole batch (which every rank also runs, so each checks
itself). Synchronized batch statistics make the two the same computation: after a few SGD steps
parameters and running statistics agree."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .runner import run_world, scenario

pytestmark = pytest.mark.multiprocess  # every test here starts processes

STEPS = 4
PER_RANK = 3


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(4, momentum=0.3)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean((2, 3)))


def ddp_sync_batchnorm():
    from torch.nn.parallel import DistributedDataParallel as DDP
    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    ref = ConvNet()
    model = ConvNet()
    model.load_state_dict(ref.state_dict())
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(model.bn1, nn.SyncBatchNorm)
    ddp = DDP(model.to("tpu"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randn(PER_RANK * n, 3, 6, 6, generator=g) * 2 + 0.5
        y = torch.randn(PER_RANK * n, 2, generator=g)
        mine = slice(r * PER_RANK, (r + 1) * PER_RANK)
        # equal shares: DDP's average of the ranks' mean losses is the mean loss of the whole batch
        F.mse_loss(ddp(x[mine].to("tpu")), y[mine].to("tpu")).backward()
        opt.step()
        opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ropt.step()
        ropt.zero_grad()
    got = dict(model.named_parameters()) | dict(model.named_buffers())
    want = dict(ref.named_parameters()) | dict(ref.named_buffers())
    assert got.keys() == want.keys()
    for name, q in want.items():
        torch.testing.assert_close(got[name].detach().cpu(), q.detach(), rtol=1e-4, atol=1e-4,
                                   msg=lambda m: f"rank {r}: {name}: {m}")
    # eval mode normalizes with the (synchronized) running statistics, without communication
    ddp.eval()
    ref.eval()
    x = torch.randn(2, 3, 6, 6, generator=g)
    torch.testing.assert_close(ddp(x.to("tpu")).detach().cpu(), ref(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.slow
def test_ddp_sync_batchnorm_matches_single_process_batchnorm(tmp_path, mode):
    run_world(2, scenario(ddp_sync_batchnorm), tmp_path, env={"TORCH_TPU_EAGER_MODE": mode}, timeout=180)
