"""A DDP script written as for CUDA, with "cuda" replaced by "tpu" and nothing else changed: run by
tests/distributed/test_cuda_habits.py under torchrun. Each rank checks its gradients against the
same step on the CPU (the full batch's, averaged over the ranks as DDP does) and prints OK."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
# The start-up check of pytorch/examples' distributed scripts: every process sees the host's devices.
nproc = int(os.environ["LOCAL_WORLD_SIZE"])
if torch.accelerator.device_count() < nproc or torch.tpu.device_count() != nproc:
    raise SystemExit(f"Unable to locate sufficient {nproc} devices to run this example "
                     f"({torch.accelerator.device_count()}, {torch.tpu.device_count()})")
torch.tpu.set_device(local_rank)
device = torch.device(f"tpu:{local_rank}")
dist.init_process_group("tpu_dist")
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
reference = torch.nn.Linear(4, 2)
model = torch.nn.Linear(4, 2)
model.load_state_dict(reference.state_dict())
model = model.to(device)
ddp = DDP(model, device_ids=[local_rank], output_device=local_rank)

batch = torch.randn(4 * world, 4, generator=torch.Generator().manual_seed(1))
mine = batch[4 * rank:4 * (rank + 1)].to(device)
assert mine.device.type == "tpu" and mine.device.index == 0, mine.device  # tpu:LOCAL_RANK is this process's tpu:0
ddp(mine).square().sum().backward()
torch.tpu.synchronize(local_rank)

reference(batch).square().sum().backward()
for p, r in zip(model.parameters(), reference.parameters()):
    torch.testing.assert_close(p.grad.cpu(), r.grad / world, rtol=1e-5, atol=1e-5)
assert torch.tpu.current_device() == 0 and torch.tpu.memory_allocated(local_rank) >= 0
assert torch.randn(3, device=device, generator=torch.Generator(device=device).manual_seed(2)).device == torch.device("tpu", 0)
# Another local rank's device is not this process's: a clear error, not a silent alias.
other = (local_rank + 1) % nproc
if other != 0:
    try:
        torch.zeros(1, device=f"tpu:{other}")
        raise AssertionError(f"tpu:{other} made a tensor in local rank {local_rank}'s process")
    except IndexError as e:
        assert f"is the device of local rank {other}" in str(e), e
print(f"OK rank {rank}")
dist.destroy_process_group()
