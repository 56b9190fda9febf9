"""Real models trained for several optimizer steps on tpu and on CPU from identical weights and
batches: every step's loss and, after every step, every parameter must agree (issue 50: a matrix
product read its operand as it was before the optimizer's in-place update, which only a multi-step
comparison at real layer sizes shows). Sizes are those of pytorch/examples' models (MNIST's 784
inputs, a 400-wide hidden layer)."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu

TPU = torch.device("tpu")


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(784, 400), nn.Linear(400, 10)

    def forward(self, x, y):
        return F.cross_entropy(self.fc2(F.relu(self.fc1(x))), y)


class VAE(nn.Module):
    """pytorch/examples' VAE: the reparameterization noise comes with the batch, so both devices
    draw the same."""
    def __init__(self):
        super().__init__()
        self.fc1, self.fc21, self.fc22 = nn.Linear(784, 400), nn.Linear(400, 20), nn.Linear(400, 20)
        self.fc3, self.fc4 = nn.Linear(20, 400), nn.Linear(400, 784)

    def forward(self, x, eps):
        h = F.relu(self.fc1(x))
        mu, logvar = self.fc21(h), self.fc22(h)
        z = mu + eps * torch.exp(0.5 * logvar)
        recon = torch.sigmoid(self.fc4(F.relu(self.fc3(z))))
        bce = F.binary_cross_entropy(recon, x, reduction="sum")
        return (bce - 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())) / x.shape[0]


class RNNLM(nn.Module):
    """pytorch/examples' word language model: embedding, a recurrent layer, an nn.Linear decoder."""
    def __init__(self, cell: str, vocab=1000, width=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn = getattr(nn, cell)(width, width, num_layers=2)
        self.decoder = nn.Linear(width, vocab)

    def forward(self, tokens, targets):
        out, _ = self.rnn(self.embed(tokens))
        return F.cross_entropy(self.decoder(out).flatten(0, 1), targets.flatten())


def _batches(name, steps, g):
    for _ in range(steps):
        if name == "mlp":
            yield torch.rand(128, 784, generator=g), torch.randint(0, 10, (128,), generator=g)
        elif name == "vae":
            yield torch.rand(128, 784, generator=g), torch.randn(128, 20, generator=g)
        else:
            yield torch.randint(0, 1000, (12, 8), generator=g), torch.randint(0, 1000, (12, 8), generator=g)


MODELS = {"mlp": (MLP, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
          "vae": (VAE, lambda ps: torch.optim.Adam(ps, lr=1e-3)),
          "lstm_lm": (lambda: RNNLM("LSTM"), lambda ps: torch.optim.SGD(ps, lr=1.0)),
          "gru_lm": (lambda: RNNLM("GRU"), lambda ps: torch.optim.AdamW(ps, lr=1e-3))}


def _train_side_by_side(name, steps=4):
    make, make_opt = MODELS[name]
    torch.manual_seed(0)
    cpu = make()
    tpu = copy.deepcopy(cpu).to(TPU)
    opt_c, opt_t = make_opt(cpu.parameters()), make_opt(tpu.parameters())
    for step, batch in enumerate(_batches(name, steps, torch.Generator().manual_seed(1))):
        losses = []
        for model, opt, dev in ((cpu, opt_c, "cpu"), (tpu, opt_t, TPU)):
            opt.zero_grad()
            loss = model(*[t.to(dev) for t in batch])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-4, abs=1e-5), f"{name} step {step}: loss {losses}"
        for (pname, pc), pt in zip(cpu.named_parameters(), tpu.parameters()):
            err = (pt.detach().cpu().double() - pc.detach().double()).norm() / max(pc.detach().norm().item(), 1e-12)
            assert err < 1e-4, f"{name} step {step}: {pname} differs from CPU's (relative error {err:.2e})"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_matches_cpu_step_by_step(name):
    _train_side_by_side(name)


@pytest.mark.parametrize("mode", ["debug", "fused"])
def test_training_matches_cpu_in_other_eager_modes(mode):
    with torch_tpu.eager_mode(mode):
        _train_side_by_side("mlp", steps=3)
