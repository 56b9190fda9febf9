"""Compiled graphs: the CPU values the host computes itself (an optimizer's step counts), packed."""
import copy

import pytest
import torch

import torch_tpu  # noqa: F401
from torch_tpu import _C
from torch_tpu.dynamo import host_part

TPU = torch.device("tpu")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def host_parts(monkeypatch):
    """The HostPart of every graph compiled in the test."""
    made = []
    finish = host_part.HostPart.finish

    def record(self, mutations):
        finish(self, mutations)
        made.append(self)
    monkeypatch.setattr(host_part.HostPart, "finish", record)
    return made


def test_adamw_step_counts_update_as_one_packed_op(host_parts):
    """AdamW (capturable=False: step counts are 0-dim CPU tensors) compiled: the counts advance as
    in eager, each count tensor is written in place once per step (its version moves), and the host
    does it with one gather and one add, not one op per parameter."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    models = [copy.deepcopy(base).to(TPU) for _ in range(2)]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in models]
    x = torch.randn(5, 4).to(TPU)
    for m in models:
        m(x).square().mean().backward()
    # The state is created inside the compiled step (Dynamo moves the counts of an optimizer whose
    # state exists already to the parameters' device).
    compiled = torch.compile(opts[1].step, backend="tpu")
    opts[0].step()
    compiled()
    steps = [opts[1].state[p]["step"] for p in models[1].parameters()]
    versions = [s._version for s in steps]
    for _ in range(3):
        opts[0].step()
        compiled()
    for pe, pc in zip(models[0].parameters(), models[1].parameters()):
        se, sc = opts[0].state[pe]["step"], opts[1].state[pc]["step"]
        assert sc.device.type == "cpu" and sc.dim() == 0 and sc.dtype == se.dtype
        assert sc.item() == se.item() == 4.0
        torch.testing.assert_close(pc.detach().cpu(), pe.detach().cpu(), atol=1e-6, rtol=1e-5)
    assert all(s is opts[1].state[p]["step"] for s, p in zip(steps, models[1].parameters()))
    assert all(s._version > v for s, v in zip(steps, versions))
    code = [h.fn.__self__.code for h in host_parts if h.fn is not None]
    assert len(code) == 1
    assert code[0].count("_gather_scalars(") == 1 and code[0].count("torch.add(") == 1
    assert "unbind" not in code[0] and "_foreach" not in code[0]


def test_host_foreach_chain_outputs_and_promotion():
    """A chain of foreach ops on 0-dim int64 CPU tensors (the second promotes to float), read by the
    device program and returned: values, dtypes and in-place updates equal eager."""
    def f(counts, x):
        torch._foreach_add_(counts, 1)
        halves = torch._foreach_mul(counts, 0.5)
        return halves, x * halves[1]

    def make():
        return [torch.tensor(v) for v in (3, 7, 10)], torch.arange(4.0)

    counts_e, x_e = make()
    counts_c, x_c = make()
    out_e = f(counts_e, x_e)
    out_c = torch.compile(f, backend="tpu")(counts_c, x_c.to(TPU))
    assert [c.item() for c in counts_c] == [c.item() for c in counts_e] == [4, 8, 11]
    assert all(c.dtype == torch.int64 for c in counts_c)
    for he, hc in zip(out_e[0], out_c[0]):
        assert hc.device.type == "cpu" and hc.dtype == he.dtype == torch.float32 and hc.item() == he.item()
    torch.testing.assert_close(out_c[1].cpu(), out_e[1])
    out_c[0][0].add_(100)  # a returned value is a tensor of its own
    assert out_c[0][1].item() == 4.0 and counts_c[0].item() == 4


def test_gather_and_scatter_scalars():
    ts = [torch.tensor(float(v)) for v in (1, 2, 3)]
    packed = _C.device.gather_scalars(ts)
    assert packed.tolist() == [1.0, 2.0, 3.0] and packed.dtype == torch.float32
    with pytest.raises(RuntimeError, match="0-dim CPU tensors of one dtype"):
        _C.device.gather_scalars([torch.tensor(1.0), torch.tensor(1)])
    dsts = [torch.tensor(0.0), None, torch.tensor(0.0)]
    before = dsts[0]._version
    assert _C.device.scatter_scalars(packed * 10, dsts)
    assert dsts[0].item() == 10.0 and dsts[2].item() == 30.0 and dsts[0]._version > before
    # Not a byte copy (another dtype, requires_grad): nothing is written, the caller uses copy_.
    other = [torch.tensor(5), torch.tensor(5), torch.tensor(5)]
    assert not _C.device.scatter_scalars(packed, other)
    assert [t.item() for t in other] == [5, 5, 5]
    leaf = torch.tensor(5.0, requires_grad=True)
    assert not _C.device.scatter_scalars(packed, [None, leaf, None]) and leaf.item() == 5.0
