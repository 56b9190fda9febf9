"""Storage buffers in the shape of their tensors (runtime.h's Cell::dims): programs pass arrays to
each other as they compute them, so a TPU program never relayouts a 1-D buffer at its boundary."""
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu
from torch_tpu import _C, metrics

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from tiny_models import TinyGPT  # noqa: E402

TPU = torch.device("tpu")


def dims(t):
    return _C.device.storage_spec(t)[1]


def test_eager_buffers_keep_their_tensor_shape():
    x = torch.randn(3, 4, device=TPU)
    assert dims(x) == (3, 4)                            # an upload (copy from CPU)
    assert dims(x.t().contiguous()) == (4, 3)           # a new result
    assert dims((x + 1).sum(0)) == (4,)
    assert dims(x.sum()) == ()
    x.add_(1)
    assert dims(x) == (3, 4)                            # an in-place op keeps the storage's dims
    v = x.view(-1)
    v.mul_(2)                                           # through a view of another shape too
    assert dims(x) == (3, 4)
    torch.testing.assert_close(v.cpu(), x.cpu().view(-1))
    e = torch.empty(2, 5, device=TPU).uniform_()       # never written: the allocation's shape
    assert dims(e) == (2, 5)
    cl = torch.empty(2, 3, 4, 5, device=TPU, memory_format=torch.channels_last).fill_(1)
    assert dims(cl) == (2, 4, 5, 3)                     # dense permuted: its sizes in memory order
    b = torch.empty(6, device=TPU, dtype=torch.float32)
    assert dims(b.view(torch.int32)) == (6,)            # typed first as another dtype of its size
    u = torch.empty(8, device=TPU, dtype=torch.uint8)
    assert dims(u.view(torch.float32)) == (2,)          # ... or of another size: 1-D


def test_program_parameters_are_the_buffers_as_they_are():
    x = torch.randn(17, 31, device=TPU)
    y = x * 2.5
    text = torch_tpu.eager.state.last_program_text  # mul's program: shapes no other test uses, so built here
    assert "tensor<17x31xf32>" in text and "tensor<527xf32>" not in text and "stablehlo.reshape" not in text
    torch.testing.assert_close(y.cpu(), x.cpu() * 2.5)


@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.AdamW])
def test_a_compiled_training_loop_passes_every_buffer_as_it_is(opt_cls):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyGPT().to(TPU)
    opt = opt_cls(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (4, 16), device=TPU)

    @torch.compile(backend="tpu")
    def step(ids):
        logits = model(ids)
        loss = F.cross_entropy(logits.flatten(0, 1), ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    for _ in range(2):
        step(ids)
    before = metrics.counters()["graph_input_copies"]
    losses = [step(ids).item() for _ in range(3)]
    assert metrics.counters()["graph_input_copies"] == before  # parameters, state, activations as they are
    assert losses[-1] < losses[0]
    for p in model.parameters():
        assert dims(p) == tuple(p.shape)
    torch._dynamo.reset()


def test_compiled_graph_reads_a_buffer_of_other_dims_through_a_copy():
    torch._dynamo.reset()
    flat = torch.arange(12.0, device=TPU)        # a buffer of dims (12,)
    x = flat.view(3, 4)                           # whole storage, but the graph takes a 3x4 buffer
    f = torch.compile(lambda t: t * 2 + 1, backend="tpu")
    before = metrics.counters()["graph_input_copies"]
    torch.testing.assert_close(f(x).cpu(), x.cpu() * 2 + 1)
    assert metrics.counters()["graph_input_copies"] == before + 1
    torch._dynamo.reset()


def test_fused_eager_threads_values_of_other_dims():
    with torch_tpu.eager_mode("fused"):
        a = torch.empty(1, 3, 1, 4, device=TPU).fill_(2.0)
        b = a.view(3, 4).mul_(3)                  # another shape of the same storage
        c = (a.sum() + b.sum())
        out = c.cpu()
    assert out.item() == pytest.approx(144.0)
    assert dims(a) == (1, 3, 1, 4)


def test_a_channels_last_module_keeps_its_values():
    cpu = nn.Conv2d(4, 8, 3)
    m = nn.Conv2d(4, 8, 3)
    m.load_state_dict(cpu.state_dict())
    m = m.to(TPU).to(memory_format=torch.channels_last)
    assert dims(m.weight) == (8, 3, 3, 4)  # N, H, W, C
    torch.testing.assert_close(m.weight.cpu(), cpu.weight.detach())
    x = torch.randn(2, 4, 9, 9)
    torch.testing.assert_close(m(x.to(TPU)).cpu(), cpu(x), atol=1e-5, rtol=1e-5)
