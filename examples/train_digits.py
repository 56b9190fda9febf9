"""Train a small CNN on scikit-learn's handwritten digits (1797 8x8 images, bundled: no download).

    python examples/train_digits.py                 # on the tpu device (XLA CPU plugin without a TPU)
    python examples/train_digits.py --device cpu    # the same run on PyTorch's CPU, for comparison

Prints the PJRT platform, the loss per epoch, the test accuracy and the time per epoch. The model
is initialised and the data shuffled on the host from --seed, so tpu and cpu runs start alike and
their losses agree to float tolerance.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from tqdm import tqdm


class DigitsCNN(nn.Module):
    """(N, 1, 8, 8) float32 images in [0, 1] -> (N, 10) logits."""

    def __init__(self):
        super().__init__()
        # No bias before a batch norm: it would have no gradient (exactly zero, so rounding noise),
        # which AdamW scales up to steps of +-lr that any change of summation order flips.
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)   # 16 x 4 x 4
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)             # 32 x 2 x 2
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def load_data(seed: int):
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    n_test = len(x) // 5
    return (x[n_test:], y[n_test:]), (x[:n_test], y[:n_test])


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The options shared with examples/train_digits_ddp.py (--batch-size: the global batch)."""
    p = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    p.add_argument("--device", default="tpu", help="tpu (default) or cpu")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    return p


def platform_line(device: str) -> str:
    """The "platform: ..." line the run starts with (starts the tpu device)."""
    if device.startswith("tpu"):
        import torch_tpu
        return f"platform: {torch_tpu.runtime.platform()} (PJRT plugin {torch_tpu.runtime.plugin_path()})"
    return "platform: PyTorch CPU"


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The training samples' order in `epoch` (int64 indices): the permutation DistributedSampler
    (shuffle=True, seed) draws, so that the DDP run sees the same global batches as this one."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))


def train_epoch(model, opt, x, y, batches, desc: str, show: bool = True) -> torch.Tensor:
    """One pass over `batches` (index tensors into x, y): AdamW steps on the mean cross-entropy of
    each batch. Returns the sum over samples of their batch's loss (a 0-dim tensor on x's device,
    not read back: the caller syncs once per epoch). show: draw the tqdm progress bar."""
    total = torch.zeros((), device=x.device)
    for idx in tqdm(batches, desc=desc, leave=False, disable=not show):
        idx = idx.to(x.device)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total += loss.detach() * len(idx)
    return total


def accuracy(model, x, y) -> float:
    """Fraction of x classified as y, in eval mode (BatchNorm's running statistics)."""
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def main(argv=None):
    args = build_parser().parse_args(argv)
    print(platform_line(args.device))
    device = torch.device(args.device)

    torch.manual_seed(args.seed)
    model = DigitsCNN().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    (xtr, ytr), (xte, yte) = load_data(args.seed)
    xtr, ytr, xte, yte = xtr.to(device), ytr.to(device), xte.to(device), yte.to(device)

    losses, times = [], []
    for epoch in range(args.epochs):
        model.train()
        start = time.perf_counter()
        order = epoch_order(len(xtr), args.seed, epoch)
        total = train_epoch(model, opt, xtr, ytr, order.split(args.batch_size), f"epoch {epoch + 1}/{args.epochs}")
        epoch_loss = (total / len(xtr)).item()  # the one host sync per epoch
        times.append(time.perf_counter() - start)
        losses.append(epoch_loss)
        print(f"epoch {epoch + 1:2d}  loss {epoch_loss:.4f}  time {times[-1]:.2f}s")

    acc = accuracy(model, xte, yte)
    print(f"final loss: {losses[-1]:.6f}  test accuracy: {acc:.4f}")
    first = "with compiles" if device.type == "tpu" else "first"
    print(f"time per epoch: {sum(times[1:]) / max(len(times) - 1, 1):.3f}s (first epoch, {first}: {times[0]:.2f}s)")
    return {"losses": losses, "accuracy": acc, "epoch_times": times}


if __name__ == "__main__":
    main()
