"""Train a small GPT-style language model with FSDP2 (and optionally tensor parallelism) on tpu_dist.

    torchrun --nproc_per_node 2 examples/train_gpt_fsdp.py            # FSDP2 over 2 processes
    torchrun --nproc_per_node 4 examples/train_gpt_fsdp.py --tp 2     # 2-D mesh: FSDP2 x TP (2 x 2)
    python examples/train_gpt_fsdp.py --single                        # the reference: one process

One process per tpu device (each sees its own as tpu:0). The model is a byte-level decoder (token
and position embeddings, pre-norm blocks of causal attention and a GELU MLP, a head tied to the
embedding), trained on text that ships with PyTorch (the source of torch.nn's modules), so nothing
is downloaded. Every rank starts from the same initial weights (seeded on the host) and the global
batch is split over the data-parallel ranks, so the loss curve follows the single-process run.
Rank 0 shows a progress bar and prints the loss.
"""
from __future__ import annotations

import argparse
import inspect
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

import torch_tpu  # noqa: F401  (the tpu device and tpu_dist)


class Block(nn.Module):
    """(B, T, dim) -> (B, T, dim): pre-norm causal self-attention and MLP. q, k, v are separate
    layers so that tensor parallelism can split them by heads (ColwiseParallel)."""

    def __init__(self, dim: int, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.ln1(x)
        # -1 heads: under TP each rank holds its share of the heads
        q, k, v = (f(h).reshape(b, t, -1, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    """(B, T) int64 byte ids -> (B, T, 256) logits."""

    def __init__(self, dim=64, layers=2, head_dim=16, ctx=32):
        super().__init__()
        self.emb = nn.Embedding(256, dim)
        self.pos = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(Block(dim, head_dim) for _ in range(layers))
        self.lnf = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 256, bias=False)
        self.head.weight = self.emb.weight
        for e in (self.emb, self.pos):
            nn.init.normal_(e.weight, std=0.02)  # GPT-2's: small logits at the start (loss ~ ln 256)

    def forward(self, idx):
        x = self.emb(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.lnf(x))


def corpus() -> torch.Tensor:
    """Bytes of PyTorch's own nn module sources: real text, on every machine, no download."""
    import torch.nn.modules.activation as a
    import torch.nn.modules.linear as lin
    text = (inspect.getsource(lin) + inspect.getsource(a)).encode()
    return torch.tensor(list(text), dtype=torch.int64)


def batches(data: torch.Tensor, steps: int, batch: int, ctx: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        start = torch.randint(0, len(data) - ctx - 1, (batch,), generator=g)
        x = torch.stack([data[s:s + ctx] for s in start.tolist()])
        y = torch.stack([data[s + 1:s + ctx + 1] for s in start.tolist()])
        yield x, y


def parallelize(model: GPT, tp: int):
    """FSDP2 over the data-parallel ranks; with tp > 1, a (dp, tp) mesh and each block's attention
    and MLP split column- then row-wise over "tp"."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    world = dist.get_world_size()
    if world % tp:
        raise SystemExit(f"--tp {tp} does not divide the {world} processes")
    if tp > 1:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        mesh = init_device_mesh("tpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
        plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
                "proj": RowwiseParallel(), "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
        for blk in model.blocks:
            parallelize_module(blk, mesh["tp"], plan)
        dp_mesh = mesh["dp"]
    else:
        dp_mesh = init_device_mesh("tpu", (world,), mesh_dim_names=("dp",))
    for blk in model.blocks:
        fully_shard(blk, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    return dp_mesh.get_local_rank(), dp_mesh.size()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=16, help="the global batch")
    p.add_argument("--ctx", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (the mesh is dp x tp)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--single", action="store_true", help="no process group: the one-process reference")
    args = p.parse_args()

    torch.manual_seed(args.seed)
    model = GPT(ctx=args.ctx)  # initialised on the host from the seed: identical on every rank
    if args.single:
        rank, dp_rank, dp_size = 0, 0, 1
        model.to("tpu")
    else:
        dist.init_process_group("tpu_dist")
        rank = dist.get_rank()
        model.to("tpu")
        dp_rank, dp_size = parallelize(model, args.tp)
    if args.batch_size % dp_size:
        raise SystemExit(f"--batch-size {args.batch_size} is not divisible by the {dp_size} data-parallel ranks")
    per = args.batch_size // dp_size
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = corpus()
    bar = tqdm(total=args.steps, disable=rank != 0, desc="gpt", unit="step")
    start, losses = time.perf_counter(), []
    for x, y in batches(data, args.steps, args.batch_size, args.ctx, args.seed + 1):
        x, y = x[dp_rank * per:(dp_rank + 1) * per].to("tpu"), y[dp_rank * per:(dp_rank + 1) * per].to("tpu")
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if not args.single:  # the global batch's loss: the mean over data-parallel ranks
            loss = loss.detach().clone()
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        bar.update()
    bar.close()
    if rank == 0:
        world = 1 if args.single else dist.get_world_size()
        print(f"processes {world} (dp {dp_size} x tp {args.tp if not args.single else 1}); "
              f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; "
              f"{(time.perf_counter() - start) / args.steps * 1e3:.1f} ms/step")
        print("final loss", f"{losses[-1]:.6f}")
    if not args.single:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
