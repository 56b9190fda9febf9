"""Hugging Face accelerate and Trainer, unchanged, on the tpu device (torch_tpu/integrations/
accelerate.py): accelerate picks tpu, Trainer trains with the CPU run's losses, mixed precision is
autocast on tpu, gradient accumulation and clipping follow accelerate's code (a multi-process launch:
tests/distributed/test_accelerate_ranks.py)."""
import os

import pytest
import torch

accelerate = pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")
from accelerate.state import AcceleratorState, PartialState  # noqa: E402

VOCAB, SEQ = 128, 16


@pytest.fixture(autouse=True)
def fresh_state():
    """accelerate keeps one process-wide state; each test starts and ends without it."""
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # same function on both devices
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n=16):
        g = torch.Generator().manual_seed(3)
        self.ids = [torch.randint(0, VOCAB, (SEQ,), generator=g) for _ in range(n)]

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _bert():
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=SEQ, num_labels=3,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(cfg)


class _Labelled(_Tokens):
    """Token ids with a padded-out attention mask and one of 3 classes (BERT sequence classification)."""

    def __getitem__(self, i):
        mask = torch.ones(SEQ, dtype=torch.long)
        mask[SEQ - i % 4:] = 0
        return {"input_ids": self.ids[i], "attention_mask": mask, "labels": torch.tensor(int(self.ids[i].sum()) % 3)}


def _trainer_losses(tmp_path, use_cpu: bool, bf16: bool = False, model=_gpt2, data=_Tokens):
    AcceleratorState._reset_state(reset_partial_state=True)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=4, logging_steps=1, report_to=[],
        save_strategy="no", use_cpu=use_cpu, bf16=bf16, max_grad_norm=1.0, gradient_accumulation_steps=2,
        dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model(), args=args, train_dataset=data())
    trainer.train()
    device = next(trainer.model.parameters()).device
    return [h["loss"] for h in trainer.state.log_history if "loss" in h], device


def test_accelerate_picks_the_tpu_and_cpu_true_still_wins():
    assert PartialState().device.type == "tpu"  # tpu:0 (accelerate 1.15, through the integration) or tpu (1.16+)
    AcceleratorState._reset_state(reset_partial_state=True)
    assert PartialState(cpu=True).device == torch.device("cpu")


@pytest.mark.parametrize("model,data", [(_gpt2, _Tokens), (_bert, _Labelled)], ids=["gpt2-lm", "bert-classifier"])
@pytest.mark.slow
def test_trainer_trains_on_tpu_with_the_cpu_runs_losses(tmp_path, model, data):
    tpu, device = _trainer_losses(tmp_path, use_cpu=False, model=model, data=data)
    cpu, cpu_device = _trainer_losses(tmp_path, use_cpu=True, model=model, data=data)
    assert device.type == "tpu" and cpu_device.type == "cpu"
    assert len(tpu) == 4
    torch.testing.assert_close(torch.tensor(tpu), torch.tensor(cpu), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_accelerator_bf16_accumulation_and_clipping_on_tpu():
    acc = accelerate.Accelerator(mixed_precision="bf16", gradient_accumulation_steps=2)
    model = _gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(_Tokens(8), batch_size=2)
    model, opt, loader = acc.prepare(model, opt, loader)
    assert next(model.parameters()).device.type == "tpu"
    before = [p.detach().cpu().clone() for p in model.parameters()]
    updates = 0
    for batch in loader:
        assert batch["input_ids"].device.type == "tpu"
        with acc.accumulate(model):
            with acc.autocast():
                assert torch.get_autocast_dtype("tpu") == torch.bfloat16 and torch.is_autocast_enabled("tpu")
                loss = model(**batch).loss
            acc.backward(loss)
            if acc.sync_gradients:
                norm = acc.clip_grad_norm_(model.parameters(), 0.5)
                assert torch.isfinite(norm.cpu())
                updates += 1
            opt.step()
            opt.zero_grad()
    assert updates == 2  # 4 batches, 2 accumulated per update
    assert any(not torch.equal(b, p.detach().cpu()) for b, p in zip(before, model.parameters()))


@pytest.mark.slow
def test_find_executable_batch_size_shrinks_the_batch_on_a_tpu_out_of_memory():
    # A batch too large for the device raises torch.OutOfMemoryError worded as CUDA's (" out of
    # memory."), which accelerate recognises: it frees memory, shrinks the batch (by half, or by 10%
    # in newer accelerate) and calls again, until one fits.
    from accelerate.utils import find_executable_batch_size
    tried = []

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size):
        tried.append(batch_size)
        x = torch.ones(batch_size, 4, device="tpu")
        if batch_size > 16:  # stands for a step whose activations do not fit: 1 TiB
            torch.empty(2 ** 38, device="tpu").fill_(1.0)
        torch.tpu.synchronize()
        return float(x.sum())

    result = train()
    assert tried[0] == 64 and tried[-1] <= 16 and all(b > 16 for b in tried[:-1]), tried
    assert tried == sorted(tried, reverse=True) and result == tried[-1] * 4
