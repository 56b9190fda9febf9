"""Semantics other backends got wrong (cases handed to us in ../shared/cases), each widened to its
kind: every program runs on CPU and on tpu and must give the same tensors, dtypes included."""
from __future__ import annotations

import pytest
import torch

import torch_tpu


def _both(program):
    """Runs program(device) on CPU and tpu; asserts equal results and no CPU fallback."""
    before = sum(torch_tpu.metrics.fallback_counts().values())
    want = program(torch.device("cpu"))
    got = program(torch.device("tpu"))
    assert sum(torch_tpu.metrics.fallback_counts().values()) == before, torch_tpu.metrics.fallback_counts()
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert g.device.type == "tpu"
        torch.testing.assert_close(g.cpu(), w, equal_nan=True, atol=0, rtol=0)


# -- aliasing through views ------------------------------------------------------------------------
def test_broadcast_view_sees_base_writes_and_writes_back():
    def program(dev):
        col = torch.tensor([[1], [2], [3]], device=dev)
        wide = col.expand(3, 4)
        col[2] = -5                   # visible through the stride-0 view
        row = torch.arange(5, device=dev)
        rows = row.expand(3, 5)
        rows[1, 3] = 40               # lands in the base, so in every row of the view
        return wide.clone(), row, rows.clone()
    _both(program)


@pytest.mark.parametrize("view", ["slice", "transpose", "diagonal", "select", "unfold", "view_of_view"])
def test_inplace_op_through_view_writes_base(view):
    def program(dev):
        base = torch.zeros(4, 6, device=dev)
        v = {"slice": lambda: base[1:3, ::2],
             "transpose": lambda: base.t()[1],
             "diagonal": lambda: base.diagonal(),
             "select": lambda: base.select(1, 4),
             "unfold": lambda: base[0].unfold(0, 2, 2),
             "view_of_view": lambda: base.view(24)[3:15].view(3, 4)[:, 1]}[view]()
        v.add_(2)
        v.mul_(3)
        return base
    _both(program)


def test_fill_on_row_of_transposed_matrix():
    def program(dev):
        m = torch.zeros(3, 4, device=dev)
        m.t()[2].fill_(5)
        v = torch.zeros(6, device=dev)
        v[2:5].add_(1.5)
        return m, v
    _both(program)


# -- storage metadata ------------------------------------------------------------------------------
def test_resize_grow_copy_then_shrink():
    def program(dev):
        t = torch.empty(0, device=dev)
        t.resize_(4)
        t.copy_(torch.tensor([4.0, 3.0, 2.0, 1.0]))
        before = t.clone()
        t.resize_(2)
        after = t.clone()
        t.resize_(1, 2)
        return before, after, t[0]
    _both(program)


# -- integer arithmetic ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.int64])
def test_integer_division_and_modulus_signs(dtype):
    def program(dev):
        a = torch.tensor([-47, 47, -7, 7, 0, -1], dtype=dtype, device=dev)
        b = torch.tensor([47, -47, 2, -2, 3, 4], dtype=dtype, device=dev)
        return (torch.div(a, b, rounding_mode="trunc"), torch.div(a, b, rounding_mode="floor"), a // b,
                torch.remainder(a, b), torch.fmod(a, b), a % 3, torch.div(a, b))
    _both(program)


def test_float_modulus_signs():
    def program(dev):
        a = torch.tensor([-5.5, 5.5, -3.0, 3.0], device=dev)
        b = torch.tensor([2.0, -2.0, 2.0, -2.0], device=dev)
        return torch.remainder(a, b), torch.fmod(a, b), torch.div(a, b, rounding_mode="floor"), a // b
    _both(program)


def test_int64_beyond_32_bits():
    def program(dev):
        big = torch.tensor([2**40 + 3, -(2**35), 2**62], device=dev)
        return big + 1, big * 2, big // 7, big.sum(), big.max(), big.cumsum(0)
    _both(program)


# -- NaN propagation ---------------------------------------------------------------------------------
def test_nan_propagates_in_max_min_and_arg_forms():
    def program(dev):
        x = torch.tensor([3.0, float("nan"), -2.0], device=dev)
        return (x.max(), x.argmax(), x.min(), x.argmin(),
                torch.maximum(x, torch.zeros(3, device=dev)), torch.minimum(x, torch.zeros(3, device=dev)))
    _both(program)


def test_nan_in_sort_topk_amax_clamp_cummax():
    def program(dev):
        x = torch.tensor([[1.0, float("nan"), 0.5, -3.0], [2.0, 2.0, float("nan"), 7.0]], device=dev)
        s, si = x.sort(dim=1)
        d, di = x.sort(dim=1, descending=True)
        tv, ti = x.topk(2, dim=1)
        m, mi = x.max(dim=1)
        cm, cmi = x.cummax(dim=1)
        return (s, si, d, di, tv, ti, x.amax(1), x.amin(1), m, mi, x.clamp(0, 1), cm, cmi)
    _both(program)


# -- writes into strided destinations ---------------------------------------------------------------
def test_out_and_copy_into_non_contiguous_destination():
    def program(dev):
        x = torch.arange(-3.0, 3.0, device=dev).reshape(2, 3)
        out = torch.empty(3, 2, device=dev).t()
        torch.abs(x, out=out)
        y = torch.zeros(3, 4, device=dev)
        y[:, 1:3].copy_(torch.arange(6.0, device=dev).reshape(2, 3).t())
        z = torch.zeros(4, 4, device=dev)
        z[::2, ::2] = torch.ones(2, 2, device=dev)
        return out, y, z
    _both(program)


def test_copy_between_views_of_one_storage():
    def program(dev):
        x = torch.arange(8.0, device=dev)
        x[2:6].copy_(x[0:4].clone())
        y = torch.arange(8.0, device=dev)
        y[4:8].copy_(y[0:4])            # same storage, disjoint ranges
        z = torch.arange(12.0, device=dev).reshape(3, 4)
        z.t()[1:3].copy_(z[:, :2].t().clone())  # transposed, strided destination
        return x, y, z
    _both(program)


def test_copy_between_partly_overlapping_views_raises():
    for dev in ("cpu", "tpu"):
        y = torch.arange(8.0, device=dev)
        with pytest.raises(RuntimeError, match="single memory location"):
            y[1:5].copy_(y[0:4])
        with pytest.raises(RuntimeError, match="single memory location"):
            y[1:5].add_(y[0:4])
        with pytest.raises(RuntimeError, match="single memory location"):
            torch.zeros(3, device=dev).expand(2, 3).add_(1)
        y[0:4].add_(y[0:4])  # the very same view is allowed
        torch.testing.assert_close(y.cpu(), torch.tensor([0.0, 2, 4, 6, 4, 5, 6, 7]))


# -- index checking --------------------------------------------------------------------------------
def _raises(fn):
    try:
        fn()
        torch.tpu.synchronize()  # indices checked on the device raise at the next synchronisation
    except (IndexError, RuntimeError):
        return True
    return False


def test_out_of_range_indices_raise_and_leave_tensor_unchanged():
    def program(dev):
        base = torch.arange(6, device=dev)
        view = base[1:3]
        idx = lambda *v: torch.tensor(list(v), device=dev)  # noqa: E731
        flags = [
            _raises(lambda: view.__setitem__(idx(2), 99)),
            _raises(lambda: torch.gather(base, 0, idx(-1))),
            _raises(lambda: torch.gather(base, 0, idx(6))),
            _raises(lambda: base.index_select(0, idx(7))),
            _raises(lambda: base[idx(-7)]),
            _raises(lambda: base.index_put_((idx(6),), torch.tensor(1, device=dev))),
            _raises(lambda: base.scatter_(0, idx(9), idx(1))),
            _raises(lambda: torch.nn.functional.embedding(idx(4), torch.zeros(3, 2, device=dev))),
        ]
        return torch.tensor(flags, device=dev), base
    _both(program)


# -- type promotion ----------------------------------------------------------------------------------
def test_python_scalars_and_zero_dim_tensors_in_promotion():
    def program(dev):
        f = torch.tensor([4.0, 5.0, 6.0], device=dev)
        i = torch.tensor([1, 2, 3], dtype=torch.int32, device=dev)
        h = torch.tensor([1.0, 2.0], dtype=torch.bfloat16, device=dev)
        return (torch.copysign(f, -0.5), i * 0.5, i + torch.tensor(5), i + 2,
                f + torch.tensor(2.0, dtype=torch.float64), h * torch.tensor(3.0), h + 1,
                torch.where(i > 1, i, 0.5), torch.where(i > 1, 2, i), torch.where(i > 2, 1.5, 0),
                i / 2, i.sum(), torch.tensor([True, False], device=dev) + 1)
    _both(program)


def test_cumsum_and_prod_result_dtypes():
    def program(dev):
        i = torch.tensor([1, 2, 3], dtype=torch.int32, device=dev)
        b = torch.tensor([True, True, False], device=dev)
        return i.cumsum(0), b.cumsum(0), i.prod(), b.sum(), b.prod(), b.any(), b.all(), i.cumprod(0)
    _both(program)


# -- float -> int casts ------------------------------------------------------------------------------
def test_float_to_int_casts_of_nan_inf_and_out_of_range():
    """x86 CPU semantics: NaN, inf and values outside int32 (int64 for int64) give the minimum
    integer; narrower types wrap the int32 value."""
    def program(dev):
        x = torch.tensor([float("nan"), float("inf"), -float("inf"), 3e9, -3e9, 1e20, 2.5], device=dev)
        outs = []
        for src in (x, x.double(), x.bfloat16(), x.half()):
            outs += [src.to(dt) for dt in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)]
        return tuple(outs)
    _both(program)


def test_float_to_int_casts_of_finite_values():
    def program(dev):
        x = torch.tensor([-2.7, -0.5, 0.5, 2.7, 1e3, -1.0, 300.0, 4e4, -129.0], device=dev)
        return x.to(torch.int32), x.to(torch.int64), x.to(torch.int16), x.to(torch.int8), x.to(torch.uint8)
    _both(program)


# -- empty tensors -----------------------------------------------------------------------------------
def test_zero_size_tensors():
    def program(dev):
        e = torch.zeros(0, 3, device=dev)
        return e.sum(0), e.sum(), e + 1, e.t().matmul(e), torch.cat([e, torch.ones(1, 3, device=dev)]), e.mean(1)
    _both(program)


def test_index_put_with_duplicate_indices():
    def program(dev):
        x = torch.zeros(4, device=dev)
        idx = torch.tensor([1, 1, 3], device=dev)
        acc = x.clone().index_put_((idx,), torch.tensor([1.0, 2.0, 5.0], device=dev), accumulate=True)
        same = x.clone().index_put_((idx,), torch.tensor([7.0, 7.0, 5.0], device=dev))
        return acc, same
    _both(program)


def test_stable_sort_keeps_order_of_equal_keys():
    def program(dev):
        x = torch.tensor([2, 1, 2, 1, 2, 0, 1], device=dev)
        v, i = x.sort(stable=True)
        vd, idd = x.sort(stable=True, descending=True)
        return v, i, vd, idd
    _both(program)


# -- what CPU refuses, and what it allows ------------------------------------------------------------
def _same_refusal(program):
    """program(device) raises on CPU; it must raise the same exception type on tpu, nothing written."""
    with pytest.raises(Exception) as cpu:
        program(torch.device("cpu"))
    with pytest.raises(type(cpu.value)) as tpu:
        program(torch.device("tpu"))
    # The same words after the kernel's name ('"frac_cpu" not implemented for 'Long'' on CPU, '"frac"
    # not implemented for 'Long'' on tpu; "result type Float can't be cast to ... Bool").
    tail = lambda e: str(e).split('" ', 1)[-1]  # noqa: E731
    assert tail(tpu.value) == tail(cpu.value) or type(cpu.value) is RuntimeError and "bool" in str(cpu.value), \
        (cpu.value, tpu.value)


@pytest.mark.parametrize("case", [
    lambda d: torch.tensor([True, False], device=d).mul_(torch.tensor([1.5, 2.0], device=d)),  # unsafe in-place cast
    lambda d: torch.tensor([1, 2], device=d).mul_(2.5),
    lambda d: torch.tensor([1, 2], device=d).frac(),                 # CPU's kernels for floating types only
    lambda d: torch.tensor([1, 2], device=d).round(decimals=1),
    lambda d: torch.tensor([True], device=d).round(),
    lambda d: torch.tensor([True], device=d).trunc(),
    lambda d: torch.tensor([True], device=d).abs(),
    lambda d: torch.lerp(torch.tensor([1, 2], device=d), torch.tensor([3, 4], device=d), 0.5),
    lambda d: torch.tensor([True, False], device=d).pow(torch.tensor([True, True], device=d)),
    lambda d: torch.tensor([True, False, True], device=d).topk(2),
], ids=["bool_mul_float", "int_mul_float_scalar", "frac_int", "round_decimals_int", "round_bool", "trunc_bool",
        "abs_bool", "lerp_int", "pow_bool_bool", "topk_bool"])
def test_refused_as_on_cpu(case):
    _same_refusal(case)


def test_the_dtype_probe_adds_no_warning_of_its_own():
    # The CPU dtype probe runs an op's first call per key on one-element tensors; var on one element
    # warns "degrees of freedom is <= 0" there, a warning CPU does not give for the user's 8x8 call.
    import warnings
    for dev in ("cpu", "tpu"):
        m = torch.arange(56.0, device=dev).reshape(8, 7) * 1.25  # a shape no other test keys
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            m.var(1, correction=2)
        assert [str(w.message) for w in got] == [], dev


def test_unsigned_abs_and_fills_of_expanded_views():
    # abs of an unsigned type is the identity (StableHLO's abs takes signed types only); fill_ and
    # zero_ may write an expanded view (every element at one address gets the same value).
    def program(dev):
        u = torch.tensor([0, 7, 200, 255], dtype=torch.uint8, device=dev).abs()
        base = torch.zeros(4, device=dev)
        base[1:3].unsqueeze(0).expand(3, 2).fill_(2.5)
        other = torch.ones(2, 3, device=dev)
        other[:, :1].expand(2, 3).zero_()
        return u, base, other
    _both(program)
