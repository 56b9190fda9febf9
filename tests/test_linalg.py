import pytest
import torch
import torch.nn.functional as F

from helpers import check

FLOATS = [torch.float32, torch.bfloat16]


def r(*shape, dtype=torch.float32, grad=True):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad and dtype.is_floating_point)


@pytest.mark.parametrize("dtype", FLOATS)
def test_products(dtype):
    check(torch.mm, r(3, 4, dtype=dtype), r(4, 5, dtype=dtype))
    check(torch.bmm, r(2, 3, 4, dtype=dtype), r(2, 4, 5, dtype=dtype))
    check(torch.mv, r(3, 4, dtype=dtype), r(4, dtype=dtype))
    check(torch.dot, r(4, dtype=dtype), r(4, dtype=dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_add_products(dtype):
    check(lambda s, x, y: torch.addmm(s, x, y, beta=0.5, alpha=2), r(5, dtype=dtype), r(3, 4, dtype=dtype),
          r(4, 5, dtype=dtype))
    check(torch.addmm, r(3, 5, dtype=dtype), r(3, 4, dtype=dtype), r(4, 5, dtype=dtype))
    check(lambda s, x, y: torch.baddbmm(s, x, y, beta=-1, alpha=0.25), r(1, 3, 5, dtype=dtype),
          r(2, 3, 4, dtype=dtype), r(2, 4, 5, dtype=dtype))
    check(lambda s, x, y: torch.addmv(s, x, y, alpha=3), r(3, dtype=dtype), r(3, 4, dtype=dtype), r(4, dtype=dtype))


def test_beta_zero_ignores_self():
    nan = torch.full((3, 3), float("nan"))
    check(lambda s, x, y: torch.addmm(s, x, y, beta=0), nan, r(3, 2), r(2, 3))
    check(lambda s, x, y: torch.baddbmm(s, x, y, beta=0.0), nan, r(2, 3, 2), r(2, 2, 3))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_integer(dtype):
    a = torch.randint(0, 9, (3, 4), dtype=dtype)
    b = torch.randint(0, 9, (4, 2), dtype=dtype)
    check(torch.mm, a, b)
    check(torch.mv, a, b[:, 0])
    check(torch.dot, a[0], b[:, 1])
    check(torch.bmm, a[None], b[None])
    check(lambda s, x, y: torch.addmm(s, x, y, beta=2, alpha=0.5), b[:3], a, b)  # alpha truncates to 0


@pytest.mark.parametrize("dtype", FLOATS)
def test_matmul_and_linear(dtype):
    x = r(2, 5, 3, dtype=dtype)
    check(F.linear, x, r(4, 3, dtype=dtype), r(4, dtype=dtype))
    check(F.linear, r(1, 3, dtype=dtype), r(4, 3, dtype=dtype))
    check(torch.matmul, x, r(3, 4, dtype=dtype))
    check(torch.matmul, x, r(2, 3, 4, dtype=dtype))
    check(torch.matmul, r(2, 1, 5, 3, dtype=dtype), r(4, 3, 2, dtype=dtype))  # broadcast batch
    check(torch.matmul, x, r(3, dtype=dtype))
    check(torch.matmul, r(3, dtype=dtype), r(3, 4, dtype=dtype))
    check(torch.matmul, r(3, dtype=dtype), r(3, dtype=dtype))


def test_nn_linear():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 4)
    w, bias = lin.weight.detach().requires_grad_(), lin.bias.detach().requires_grad_()
    check(lambda x, w, b: torch.func.functional_call(lin, {"weight": w, "bias": b}, (x,)), r(6, 3), w, bias)


def test_non_contiguous_and_empty():
    # Views are taken on the device, so the lowerings read strided operands.
    check(lambda a, b: torch.mm(a.t(), b[::2].t()), r(4, 3), r(10, 4))
    check(lambda a, b: torch.bmm(a.transpose(0, 1), b.transpose(1, 2)), r(3, 2, 4), r(2, 5, 4))
    check(lambda a, v: torch.mv(a.t(), v[::2]), r(4, 3), r(8))
    check(lambda s, a, b: torch.addmm(s[:, 1], a[:, ::2], b), r(5, 2), r(3, 8), r(4, 5))
    check(F.linear, r(0, 3), r(4, 3), r(4))
    check(torch.mm, r(2, 0), r(0, 3))
    check(lambda s, x, y: torch.addmm(s, x, y, beta=3), r(2, 3), r(2, 0), r(0, 3))
    check(torch.bmm, r(0, 2, 3), r(0, 3, 4))


def test_errors():
    tpu = torch.device("tpu")
    with pytest.raises(RuntimeError):
        torch.mm(torch.ones(2, 3, device=tpu), torch.ones(2, 3, device=tpu))
    with pytest.raises(RuntimeError):
        torch.mm(torch.ones(2, 3, device=tpu), torch.ones(3, 2, device=tpu, dtype=torch.float64))
    with pytest.raises(RuntimeError):
        torch.bmm(torch.ones(2, 2, 3, device=tpu), torch.ones(3, 3, 2, device=tpu))
    with pytest.raises(NotImplementedError, match="Bool"):
        torch.mm(torch.ones(2, 2, dtype=torch.bool, device=tpu), torch.ones(2, 2, dtype=torch.bool, device=tpu))


@pytest.mark.parametrize("fn", [lambda a, b: torch.mm(a, b), lambda a, b: torch.mm(b, a),
                                lambda a, b: torch.mv(a, b[0]), lambda a, b: torch.mv(b, a[0]),
                                lambda a, b: torch.dot(a[0], b[0]), lambda a, b: torch.bmm(a[None], b[None]),
                                lambda a, b: torch.addmm(b, a, a), lambda a, b: torch.addmm(a, a, b),
                                lambda a, b: torch.addmv(b[0], a, a[0]),
                                lambda a, b: torch.baddbmm(a[None], a[None], b[None])])
@pytest.mark.parametrize("other", [torch.float64, torch.int64, torch.bfloat16])
def test_dtype_mismatch_errors(fn, other):
    a, b = torch.ones(2, 2), torch.ones(2, 2, dtype=other)
    with pytest.raises(RuntimeError) as cpu:
        fn(a, b)
    with pytest.raises(RuntimeError) as tpu:
        fn(a.to("tpu"), b.to("tpu"))
    # mm, mv and addmm give CPU's exact message; the others come from PyTorch's meta kernels.
    assert "dtype" in str(tpu.value) or "scalar type" in str(tpu.value)


def test_long_vector_products_sum_as_accurately_as_cpu():
    """XLA:CPU's dot emitter adds a vector product's terms one after another in float32: the dot of two
    rand(10**6) vectors was 3.7e-4 off (10**7: 1.2e-2) where CPU's BLAS is 1e-7; such products are
    a multiply and a reduce now (lowering/linalg.py)."""
    torch.manual_seed(0)
    k = 10**6
    x, y, a = torch.rand(k), torch.rand(k), torch.rand(3, k)
    xt, yt, at = x.to("tpu"), y.to("tpu"), a.to("tpu")
    for got, want in [(xt.dot(yt), x.double().dot(y.double())), (xt @ yt, x.double() @ y.double()),
                      (torch.einsum("i,i", xt, yt), x.double().dot(y.double())),
                      (at @ yt, a.double() @ y.double()), (yt @ at.T, y.double() @ a.double().T),
                      (torch.inner(at, yt), a.double() @ y.double())]:
        rel = ((got.cpu().double() - want).abs() / want.abs()).max().item()
        assert rel < 2e-6, rel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.complex64])
def test_vector_products_past_the_summed_size_equal_cpu(dtype):
    """The multiply-and-reduce form of a vector product keeps dot_general's layout: batches, a vector
    on either side, transposed operands, a contraction just past the threshold and not a multiple of
    anything."""
    torch.manual_seed(0)
    k = 4099

    def make(*shape):
        if dtype.is_floating_point or dtype.is_complex:
            return torch.randn(*shape, dtype=torch.float32 if dtype != torch.complex64 else dtype).to(dtype)
        return torch.randint(-3, 4, shape, dtype=dtype)

    m, v, bm, bv = make(5, k), make(k), make(2, 5, k), make(2, k, 1)
    cases = [lambda m, v, bm, bv: m @ v, lambda m, v, bm, bv: v @ m.T, lambda m, v, bm, bv: v @ v,
             lambda m, v, bm, bv: torch.bmm(bm, bv), lambda m, v, bm, bv: torch.bmm(bv.transpose(1, 2), bm.transpose(1, 2)),
             lambda m, v, bm, bv: torch.addmv(m[:, 0], m, v, beta=0.5, alpha=2)]
    for f in cases:
        want = f(m, v, bm, bv)
        got = f(*(t.to("tpu") for t in (m, v, bm, bv))).cpu()
        if dtype == torch.int64:
            assert torch.equal(got, want)
        else:
            tol = 1e-2 * k ** 0.5 if dtype == torch.bfloat16 else 1e-4
            torch.testing.assert_close(got, want, rtol=tol, atol=tol)
