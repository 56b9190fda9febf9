"""examples/train_digits.py with DistributedDataParallel: one process per tpu device, on tpu_dist.

    torchrun --nproc_per_node 2 examples/train_digits_ddp.py            # 2 processes, tpu:0 each
    torchrun --nproc_per_node 2 examples/train_digits_ddp.py --epochs 3

Each step trains on the same global batch (--batch-size, default 64) as the single-process run:
DistributedSampler draws the same permutation per epoch as train_digits.py, and each rank takes
--batch-size / world-size samples of every global batch. BatchNorm normalises with the global batch's
statistics (GlobalBatchNorm2d, below), as one process does, so the loss curve follows
`python examples/train_digits.py`'s (when the training set, 1438 samples, divides by the world
size; else DistributedSampler pads it with repeated samples). The math is the same, the float32
rounding not (two half-batch means, averaged, against one mean): on 2 processes the losses agree to
1e-6 for 3 epochs, and the difference then grows as training amplifies it (epoch 10: 0.0205 against
0.0164; run in float64, the two agree to 8 digits in every epoch). Rank 0 alone draws the progress
bar and prints: the loss per epoch, the test accuracy, the time per epoch.
"""
from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_digits  # noqa: E402
from train_digits import DigitsCNN  # noqa: E402


class _AllReduceSum(torch.autograd.Function):
    """Differentiable SUM all_reduce: every rank gets the sum, and each input's gradient is the sum
    of every rank's output gradient (every rank's loss depends on every rank's input)."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class GlobalBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics (mean, variance per channel) are those of every rank's
    samples together, like nn.SyncBatchNorm, so that a DDP step computes what one process does on
    the global batch. nn.SyncBatchNorm needs aten::batch_norm_stats and its companions, which tpu
    does not implement (nor does PyTorch on CPU, to fall back to). One differentiable all_reduce of
    (sum x, sum x^2, count) per forward, one of their gradients per backward. Outside training, or
    without a multi-process group, it is BatchNorm2d."""

    def forward(self, x):
        if not (self.training and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        c = x.shape[1]
        count = torch.full((1,), x.numel() // c, dtype=x.dtype, device=x.device)
        stats = _AllReduceSum.apply(torch.cat([x.sum((0, 2, 3)), (x * x).sum((0, 2, 3)), count]))
        n = stats[2 * c]
        mean = stats[:c] / n
        var = stats[c:2 * c] / n - mean * mean  # biased: what batch norm normalises with
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = self.momentum if self.momentum is not None else 1.0 / self.num_batches_tracked.item()
                self.running_mean.mul_(1 - m).add_(mean, alpha=m)
                self.running_var.mul_(1 - m).add_(var * n / (n - 1), alpha=m)  # unbiased, as BatchNorm2d
        shape = (1, c, 1, 1)
        y = (x - mean.view(shape)) * torch.rsqrt(var + self.eps).view(shape)
        return y * self.weight.view(shape) + self.bias.view(shape) if self.affine else y


def global_batch_norm(model: nn.Module) -> nn.Module:
    """Swaps every BatchNorm2d in `model` for a GlobalBatchNorm2d holding the same parameters and
    buffers (the same objects). Returns model."""
    for name, child in model.named_children():
        if type(child) is nn.BatchNorm2d:
            new = GlobalBatchNorm2d(child.num_features, child.eps, child.momentum, child.affine,
                                    child.track_running_stats, device=torch.device("meta"))
            new._parameters, new._buffers = child._parameters, child._buffers
            new.train(child.training)
            setattr(model, name, new)
        else:
            global_batch_norm(child)
    return model


def main(argv=None):
    args = train_digits.build_parser(__doc__.splitlines()[0]).parse_args(argv)
    if "RANK" not in os.environ:
        raise SystemExit("run under torchrun: torchrun --nproc_per_node 2 examples/train_digits_ddp.py")
    on_tpu = args.device.startswith("tpu")
    dist.init_process_group("tpu_dist" if on_tpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world:
        raise SystemExit(f"--batch-size {args.batch_size} does not split evenly over {world} ranks")
    per_rank = args.batch_size // world
    lead = rank == 0
    say = print if lead else (lambda *a, **k: None)
    say(train_digits.platform_line(args.device) + f", {world} processes (DDP on {dist.get_backend()}), "
        f"global batch {args.batch_size} = {world} x {per_rank}")
    device = torch.device(args.device)  # "tpu": this process's own device, tpu:0

    torch.manual_seed(args.seed)  # every rank starts from the same weights (DDP broadcasts rank 0's too)
    model = global_batch_norm(DigitsCNN()).to(device)
    # The global batch norm leaves the same running statistics on every rank: nothing to broadcast
    # before each forward.
    ddp = DDP(model, forward_sync_buffers=False)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    (xtr, ytr), (xte, yte) = train_digits.load_data(args.seed)
    xtr, ytr = xtr.to(device), ytr.to(device)
    sampler = DistributedSampler(range(len(xtr)), num_replicas=world, rank=rank, shuffle=True, seed=args.seed)

    losses, times = [], []
    for epoch in range(args.epochs):
        ddp.train()
        start = time.perf_counter()
        sampler.set_epoch(epoch)
        # Rank r's k-th batch: the samples r, r + world, ... of global batch k of train_digits.py's order.
        mine = torch.tensor(list(sampler)).split(per_rank)
        total = train_digits.train_epoch(ddp, opt, xtr, ytr, mine, f"epoch {epoch + 1}/{args.epochs}", show=lead)
        dist.all_reduce(total)  # every rank's sum of per-sample losses
        epoch_loss = (total / len(xtr)).item()
        times.append(time.perf_counter() - start)
        losses.append(epoch_loss)
        say(f"epoch {epoch + 1:2d}  loss {epoch_loss:.4f}  time {times[-1]:.2f}s")

    acc = None
    if lead:  # the ranks hold the same weights and statistics: one evaluates
        acc = train_digits.accuracy(model, xte.to(device), yte.to(device))
        say(f"final loss: {losses[-1]:.6f}  test accuracy: {acc:.4f}")
        say(f"time per epoch: {sum(times[1:]) / max(len(times) - 1, 1):.3f}s "
            f"(first epoch, with compiles: {times[0]:.2f}s)")
    dist.destroy_process_group()
    return {"losses": losses, "accuracy": acc, "epoch_times": times}


if __name__ == "__main__":
    main()
