"""Storage, aliasing through every view kind, copy_ between devices and layouts, round trips."""
import pytest
import torch

import torch_tpu

from helpers import run_python

ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
              torch.int64, torch.uint8, torch.bool, torch.complex64]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_round_trip_bit_exact(dtype):
    if dtype == torch.bool:
        x = torch.tensor([True, False, True, True])
    elif dtype.is_floating_point or dtype.is_complex:
        x = torch.randn(17, 3).to(dtype)
        if dtype.is_floating_point:
            x[0, 0], x[0, 1], x[0, 2] = float("nan"), float("inf"), -0.0
    else:
        info = torch.iinfo(dtype)
        x = torch.tensor([info.min, info.max, 0, 1, -1 if info.min < 0 else 2], dtype=dtype)
    y = x.to("tpu").cpu()
    assert y.dtype == dtype
    assert torch.equal(x.view(torch.uint8) if dtype != torch.bool else x,
                       y.view(torch.uint8) if dtype != torch.bool else y) or torch.equal(x, y)


def _views():
    return {
        "slice": lambda t: t[1:3],
        "transpose": lambda t: t.t(),
        "diagonal": lambda t: t.diagonal(),
        "select": lambda t: t.select(1, 2),
        "as_strided": lambda t: t.as_strided((2, 2), (5, 1), 1),
        "unfold": lambda t: t.reshape(-1).unfold(0, 4, 4),
        "view": lambda t: t.view(2, 8),
        "step": lambda t: t[::2, 1::2],
    }


@pytest.mark.parametrize("kind", list(_views()))
def test_write_through_view_is_seen_by_base(kind):
    make = _views()[kind]
    cpu = torch.arange(16.0).reshape(4, 4)
    tpu = cpu.to("tpu")
    vc, vt = make(cpu), make(tpu)
    vc.mul_(-1).add_(0.5)
    vt.mul_(-1).add_(0.5)
    torch.testing.assert_close(tpu.cpu(), cpu)
    torch.testing.assert_close(vt.cpu(), vc)


@pytest.mark.parametrize("kind", list(_views()))
def test_write_to_base_is_seen_by_view(kind):
    make = _views()[kind]
    cpu = torch.arange(16.0).reshape(4, 4)
    tpu = cpu.to("tpu")
    vc, vt = make(cpu), make(tpu)
    cpu.add_(100)
    tpu.add_(100)
    torch.testing.assert_close(vt.cpu(), vc)
    # siblings: a second view of the same storage
    sc, st = cpu[:, 1], tpu[:, 1]
    sc.fill_(7)
    st.fill_(7)
    torch.testing.assert_close(vt.cpu(), vc)


def test_aliasing_metadata():
    x = torch.zeros(4, 4, device="tpu")
    v = x[1:]
    assert v._base is x
    assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert v.data_ptr() == x.data_ptr() + 4 * 4
    assert v.is_set_to(v) and not v.is_set_to(x)
    y = torch.zeros(4, 4, device="tpu")
    assert y.data_ptr() != x.data_ptr()


def test_expand_aliasing():
    for dev in ("cpu", "tpu"):
        x = torch.tensor([[5], [6], [7]], device=dev)
        y = x.expand(3, 2)
        x[1] = -1
        z = torch.arange(4, device=dev)
        w = z.expand(2, 4)
        w[0, 1] = 9
        if dev == "cpu":
            ref = (y.clone(), z.clone(), w.clone())
        else:
            for a, b in zip(ref, (y.clone(), z, w.clone())):
                torch.testing.assert_close(b.cpu(), a)


def test_inplace_on_views_of_views():
    for dev in ("cpu", "tpu"):
        x = torch.zeros(5, device=dev)
        x[1:3].add_(1)
        m = torch.zeros(2, 3, device=dev)
        m.t()[0].fill_(7)
        m[:, 1:][1].sub_(2)
        if dev == "cpu":
            ref = (x.clone(), m.clone())
        else:
            torch.testing.assert_close(x.cpu(), ref[0])
            torch.testing.assert_close(m.cpu(), ref[1])


@pytest.mark.parametrize("src_dev", ["cpu", "tpu"])
@pytest.mark.parametrize("dst_dev", ["cpu", "tpu"])
@pytest.mark.parametrize("src_layout", ["contig", "transposed", "strided"])
@pytest.mark.parametrize("dst_layout", ["contig", "transposed"])
def test_copy_matrix(src_dev, dst_dev, src_layout, dst_layout):
    base = torch.arange(32.0).reshape(4, 8)
    src = {"contig": base[:, :4].contiguous(), "transposed": base[:4, :4].t(), "strided": base[:, ::2]}[src_layout]
    src = src.to(src_dev) if src_dev == "tpu" else src
    if src_dev == "tpu" and src_layout != "contig":  # make it a real view on the device
        b = base.to("tpu")
        src = {"transposed": b[:4, :4].t(), "strided": b[:, ::2]}[src_layout]
    dst_cpu = torch.zeros(4, 4, dtype=torch.int32)
    dst = dst_cpu.to(dst_dev)
    if dst_layout == "transposed":
        dst_cpu, dst = dst_cpu.t(), dst.t()
    expected = torch.zeros(4, 4, dtype=torch.int32)
    expected = expected.t() if dst_layout == "transposed" else expected
    expected.copy_(src.cpu())
    dst.copy_(src)
    torch.testing.assert_close(dst.cpu(), expected)


def test_copy_into_slice_and_broadcast():
    y = torch.zeros(3, 4, device="tpu")
    y[:, 1:3].copy_(torch.arange(6.0, device="tpu").reshape(2, 3).t())
    ref = torch.zeros(3, 4)
    ref[:, 1:3].copy_(torch.arange(6.0).reshape(2, 3).t())
    torch.testing.assert_close(y.cpu(), ref)
    y.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    torch.testing.assert_close(y.cpu(), torch.tensor([1.0, 2.0, 3.0, 4.0]).expand(3, 4))


def test_resize_set_empty_strided_clone_contiguous():
    b = torch.empty(0, device="tpu")
    b.resize_(3)
    b.copy_(torch.tensor([1.0, 2.0, 3.0]))
    snap = b.clone()
    b.resize_(2)
    torch.testing.assert_close(snap.cpu(), torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(b.cpu(), torch.tensor([1.0, 2.0]))
    b.resize_(6)
    torch.testing.assert_close(b[:3].cpu(), torch.tensor([1.0, 2.0, 3.0]))
    s = torch.empty_strided((2, 3), (1, 2), device="tpu")
    assert s.stride() == (1, 2)
    s.copy_(torch.arange(6.0).reshape(2, 3))
    c = s.contiguous()
    assert c.is_contiguous()
    torch.testing.assert_close(c.cpu(), torch.arange(6.0).reshape(2, 3))
    t = torch.empty(0, device="tpu")
    t.set_(c.untyped_storage(), 2, (2,), (1,))
    torch.testing.assert_close(t.cpu(), torch.tensor([2.0, 3.0]))
    t.fill_(-1)
    torch.testing.assert_close(c.cpu(), torch.tensor([[0.0, 1.0, -1.0], [-1.0, 4.0, 5.0]]))


def test_copy_dtype_conversion():
    x = torch.tensor([1.5, -2.7, 3.0])
    t = torch.zeros(3, dtype=torch.int64, device="tpu")
    t.copy_(x)
    torch.testing.assert_close(t.cpu(), x.to(torch.int64))
    h = torch.zeros(3, dtype=torch.float64)
    h.copy_(x.to("tpu").to(torch.bfloat16))
    torch.testing.assert_close(h, x.to(torch.bfloat16).to(torch.float64))


def test_inplace_update_donates_buffer():
    """An in-place update hands the old buffer to its program (tf.aliasing_output), so the update
    does not hold two copies of the data."""
    x = torch.zeros((1 << 16) + 3, device="tpu")  # a shape no other test uses: the program is built here
    ptr = x.data_ptr()
    with torch_tpu.eager_mode("strict"):
        x.add_(1.0)
        text = torch_tpu.eager.state.last_program_text
        x.add_(1.0)
        x.add_(1.0)
    assert "tf.aliasing_output = 0" in text
    assert x.data_ptr() == ptr
    torch.testing.assert_close(x[:4].cpu(), torch.full((4,), 3.0))


def _busy_product(n=1400):
    """A small (n, 40) input `a` (224 KiB: under TORCH_TPU_KEEP_BUSY_BYTES' default) and `c`, three
    (n, n) products applied to it: seconds of device work, the last of which reads `a`, still
    running when the next op is launched; and the (n, n) factor `w`, so that c = w @ w @ w @ a."""
    w = torch.randn(n, n, device="tpu") / n
    a = torch.randn(n, 40, device="tpu")
    torch.tpu.synchronize()
    c = w @ w @ w @ a
    return a, c, w


@torch_tpu.eager_mode("strict")  # debug mode waits after every launch: nothing would still be running
def test_inplace_update_of_a_busy_buffer_does_not_wait():
    """Donating a buffer that a running program still reads would make PJRT block the launching
    thread until that program ends; a small buffer's update then writes a fresh buffer instead (same
    storage, same values), and PJRT frees the old one when its reader is done.

    Whether the product is still running when the update is issued depends on scheduling (on a
    loaded 2-core machine the launcher thread can be descheduled for the whole product), so the
    kept-busy count must rise in at least one of a few attempts; the values must be right in all."""
    kept = 0
    for _ in range(3):
        a, c, w = _busy_product()
        ptr = a.data_ptr()
        before = torch_tpu.metrics.counters()["busy_inputs_kept"]
        with torch_tpu.eager_mode("strict"):
            a.add_(1.0)  # a is still being read by the product
        assert a.data_ptr() == ptr
        a_before = a.cpu() - 1.0
        kept += torch_tpu.metrics.counters()["busy_inputs_kept"] - before
        w = w.cpu()
        # three float32 products of 40-long sums, summed in another order than CPU's (XLA's threads
        # split them by load): 1e-3; an update read in the wrong order is off by 1 (a's add_)
        torch.testing.assert_close(c.cpu(), w @ w @ w @ a_before, atol=1e-3, rtol=1e-3)
        if kept:
            break
    assert kept > 0


@pytest.mark.multiprocess
def test_busy_buffers_are_donated_past_the_byte_limit():
    """TORCH_TPU_KEEP_BUSY_BYTES=0: busy inputs are donated (the launch waits), with the same values."""
    prog = ("import warnings; warnings.filterwarnings('ignore'); import torch, torch_tpu\n"
            "from tests.test_storage_views import _busy_product\n"
            "a, c, w = _busy_product()\n"
            "a.add_(1.0)\n"
            "b, w = a.cpu() - 1.0, w.cpu()\n"
            "ok = torch.allclose(c.cpu(), w @ w @ w @ b, atol=1e-4, rtol=1e-3)\n"
            "print(torch_tpu.metrics.counters()['busy_inputs_kept'], ok)\n")
    assert run_python(prog, TORCH_TPU_KEEP_BUSY_BYTES="0").split() == ["0", "True"]


def test_save_and_load_tpu_state_dict(tmp_path):
    model = torch.nn.Linear(3, 2).to("tpu")
    torch.save(model.state_dict(), tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", map_location="tpu")
    for k, v in model.state_dict().items():
        assert loaded[k].device.type == "tpu"
        assert torch.equal(loaded[k].cpu(), v.cpu())
    torch.testing.assert_close((loaded["weight"] * 2).cpu(), model.weight.detach().cpu() * 2)


def test_reinterpreting_storage_bytes():
    x = torch.randn(3, 4)
    t = x.to("tpu")
    assert torch.equal(t.view(torch.uint8).cpu(), x.view(torch.uint8))
    assert torch.equal(t.view(torch.int32).cpu(), x.view(torch.int32))
    y = torch.zeros(2, device="tpu")
    y.view(torch.uint8)[4:8] = torch.tensor([0, 0, 128, 63], dtype=torch.uint8, device="tpu")  # 1.0f
    torch.testing.assert_close(y.cpu(), torch.tensor([0.0, 1.0]))
    b = torch.tensor([True, False, True], device="tpu")
    assert torch.equal(b.view(torch.uint8).cpu(), torch.tensor([1, 0, 1], dtype=torch.uint8))


def test_complex_python_scalars():
    c = torch.tensor([1 + 1j, 2 - 1j, 0.5j])
    t = c.to("tpu")
    torch.testing.assert_close((t * 1j).cpu(), c * 1j)
    torch.testing.assert_close(t.add(1 + 1j).cpu(), c.add(1 + 1j))


_LAYOUT_OPS = {
    "add": lambda x: x + 1,
    "relu": torch.relu,
    "clone": lambda x: x.clone(),
    "clone_channels_last": lambda x: x.clone(memory_format=torch.channels_last),
    "contiguous": lambda x: x.contiguous(),
    "contiguous_channels_last": lambda x: x.contiguous(memory_format=torch.channels_last),
    "mul_of_transposed": lambda x: x.transpose(0, 1) * 2,
    "sum": lambda x: (x.transpose(0, 1) * 2).sum(0),
    "batch_norm": lambda x: torch.nn.functional.batch_norm(x, None, None, training=True),
    "max_pool2d": lambda x: torch.nn.functional.max_pool2d(x, 2),
    "ones_like": torch.ones_like,
    "binary_mixed_layouts": lambda x: x + x.contiguous(),
    "roll": lambda x: x.roll(1, 2),
    "exp_into_resized_out": lambda x: torch.exp(x, out=torch.empty(0, device=x.device)),
}


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "permuted"])
def test_fresh_results_take_the_cpu_layout(layout, mode):
    """A new result has the strides CPU gives it (TensorIterator keeps a channels_last or permuted
    input's layout; clone / contiguous honour memory_format; a resized out= tensor takes the
    functional result's layout), with the same values."""
    x = torch.arange(2 * 3 * 4 * 6, dtype=torch.float32).reshape(2, 3, 4, 6)
    x = {"contiguous": x, "channels_last": x.contiguous(memory_format=torch.channels_last),
         "permuted": x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)}[layout]
    with torch_tpu.eager_mode(mode):
        xt = x.to("tpu")
        assert xt.stride() == x.stride()
        for name, op in _LAYOUT_OPS.items():
            c, t = op(x), op(xt)
            assert t.stride() == c.stride(), (name, t.stride(), c.stride())
            torch.testing.assert_close(t.cpu(), c, msg=name)


def test_view_of_a_channels_last_result_fails_as_on_cpu():
    x = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    for dev in ("cpu", "tpu"):
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            (x.to(dev) + 1).view(-1)
    torch.testing.assert_close((x.to("tpu") + 1).reshape(-1).cpu(), (x + 1).reshape(-1))
