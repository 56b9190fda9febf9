"""An accelerate training script as people write it, launched as several processes (torchrun or
`accelerate launch`) on tpu: each rank trains DDP on its shard of every batch; rank 0 prints the
final weights. Used by test_accelerate_ranks.py."""
import torch

import torch_tpu  # noqa: F401  (the tpu device, and accelerate's integration)
import accelerate


def train(acc, batch_size):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch_size)
    model, opt, loader = acc.prepare(model, opt, loader)
    for xb, yb in loader:
        assert xb.device == acc.device
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    return acc.unwrap_model(model), acc.gather(loss.detach()[None])


if __name__ == "__main__":
    acc = accelerate.Accelerator()
    model, losses = train(acc, batch_size=4)
    w = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
    print(f"rank {acc.process_index}/{acc.num_processes} on {acc.device}: losses {losses.cpu().tolist()} "
          f"weights {w.tolist()}", flush=True)
    acc.wait_for_everyone()
    acc.end_training()
