"""Bad input: a clear error, raised before anything runs, and every tensor keeps its value."""
import pytest
import torch


def _snap(*ts):
    return [t.cpu().clone() for t in ts]


def _same(ts, snaps):
    for t, s in zip(ts, snaps):
        torch.testing.assert_close(t.cpu(), s)


def test_mismatched_shapes():
    a = torch.randn(3, 4, device="tpu")
    b = torch.randn(5, device="tpu")
    before = _snap(a, b)
    with pytest.raises(RuntimeError, match="size of tensor a|broadcast"):
        a + b
    with pytest.raises(RuntimeError):
        a.add_(b)
    with pytest.raises(RuntimeError, match="cannot be multiplied|same reduction dim"):
        a @ torch.randn(5, 2, device="tpu")
    _same((a, b), before)


def test_inplace_broadcast_into_self_refused():
    a = torch.randn(4, device="tpu")
    b = torch.randn(3, 4, device="tpu")
    before = _snap(a)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        a.add_(b)
    _same((a,), before)


def test_unsafe_inplace_cast_refused():
    i = torch.ones(3, dtype=torch.int64, device="tpu")
    with pytest.raises(RuntimeError, match="can't be cast|Promotion"):
        i.add_(torch.randn(3, device="tpu"))
    torch.testing.assert_close(i.cpu(), torch.ones(3, dtype=torch.int64))


def test_out_wrong_dtype_refused():
    x = torch.randn(3, device="tpu")
    out = torch.zeros(3, dtype=torch.int64, device="tpu")
    with pytest.raises(RuntimeError):
        torch.add(x, x, out=out)
    torch.testing.assert_close(out.cpu(), torch.zeros(3, dtype=torch.int64))


def test_out_resized_like_cpu():
    x = torch.randn(2, 3, device="tpu")
    out = torch.empty(0, device="tpu")
    torch.exp(x, out=out)
    assert out.shape == (2, 3)
    torch.testing.assert_close(out.cpu(), x.cpu().exp())


def test_unsupported_dtype_message():
    with pytest.raises((TypeError, RuntimeError)):
        torch.ones(2, dtype=torch.quint8, device="tpu")


@pytest.mark.parametrize("call", [
    lambda d: torch.mm(torch.ones(2, 3, device=d), torch.ones(2, 3, device=d)),
    lambda d: torch.ones(2, 3, device=d) @ torch.ones(2, 3, device=d),
    lambda d: torch.addmm(torch.ones(2, 3, device=d), torch.ones(2, 3, device=d), torch.ones(2, 3, device=d)),
    lambda d: torch.nn.functional.linear(torch.ones(4, 3, device=d), torch.ones(5, 4, device=d)),
    lambda d: torch.mv(torch.ones(2, 3, device=d), torch.ones(2, device=d)),
    lambda d: torch.ones(2, 3, device=d) @ torch.ones(2, device=d),
    lambda d: torch.dot(torch.ones(3, device=d), torch.ones(2, device=d)),
    lambda d: torch.softmax(torch.ones(3, 4, device=d), dim=2),
    lambda d: torch.softmax(torch.ones(3, 4, device=d), dim=-3),
    lambda d: torch.softmax(torch.tensor(1.0, device=d), dim=1),
    lambda d: torch.nn.functional.nll_loss(torch.ones(4, 5, device=d), torch.zeros(4, 5, dtype=torch.long, device=d)),
    lambda d: torch.ops.aten.nll_loss_forward(torch.ones(2, 4, 5, device=d), torch.zeros(2, dtype=torch.long, device=d),
                                              None, 1, -100),
], ids=["mm", "matmul", "addmm", "linear", "mv", "matmul_mv", "dot", "softmax_dim", "softmax_neg_dim",
        "softmax_scalar_dim", "nll_multi_target", "nll_3d_input"])
def test_shape_errors_are_cpus(call):
    """A bad shape or dim raises CPU's type and message (PyTorch's meta kernels and decompositions
    word these differently, e.g. "a and b must have same reduction dim", or assert; _softmax's meta
    accepts any dim)."""
    with pytest.raises(Exception) as on_cpu:
        call("cpu")
    with pytest.raises(type(on_cpu.value)) as on_tpu:
        call("tpu")
    assert str(on_tpu.value) == str(on_cpu.value)


def test_sparse_tensors_meeting_tpu_are_refused_saying_what_to_do():
    """The tpu device has no sparse layouts: a sparse tensor meeting a tpu tensor (a GNN's adjacency
    left on the host) or moved to tpu raises NotImplementedError naming the op and the way out,
    where PyTorch's own message named a 'Sparsetpu' backend."""
    adj = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]), (2, 2))
    x = torch.randn(2, 3, device="tpu")
    before = _snap(x)
    for call, op in [(lambda: torch.sparse.mm(adj, x), "aten::addmm"), (lambda: adj @ x, "aten::mm"),
                     (lambda: adj.to("tpu"), "aten::_sparse_coo_tensor_with_dims_and_tensors"),
                     (lambda: x.to_sparse(), "aten::_sparse_coo_tensor_with_dims_and_tensors")]:
        with pytest.raises(NotImplementedError, match=f"{op}: a sparse tensor .* has no sparse layouts.*to_dense"):
            call()
    _same((x,), before)
    torch.testing.assert_close((adj.to_dense().to("tpu") @ x).cpu(), torch.sparse.mm(adj, x.cpu()))
    emb = torch.nn.Embedding(10, 4, sparse=True).to("tpu")
    with pytest.raises(NotImplementedError, match=r"sparse=True\) make sparse gradients: pass sparse=False"):
        emb(torch.tensor([1, 2], device="tpu")).sum().backward()
