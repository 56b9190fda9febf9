"""torch.tpu's stream, event and device-property API, as an out-of-tree device offers it (OpenReg)
and as torch.cuda users call it."""
import pytest
import torch

import torch_tpu  # noqa: F401

from helpers import ADD4_PROGRAM


def test_device_module_and_properties():
    assert torch.get_device_module("tpu") is torch.tpu
    assert torch.get_device_module(torch.device("tpu:0")) is torch.tpu
    props = torch.tpu.get_device_properties(0)
    assert props.name == torch.tpu.get_device_name() == torch.tpu.get_device_name("tpu:0")
    assert props.platform == torch_tpu.runtime.platform()
    assert props.id == 0 and props.process_index == 0
    assert props.total_memory >= 0 and isinstance(props.attributes, dict)
    assert torch.tpu.get_device_properties("tpu:1").id == 1
    with pytest.raises(IndexError, match="invalid tpu device index"):
        torch.tpu.get_device_properties(99)
    assert torch.tpu.is_bf16_supported()


@pytest.mark.slow
def test_streams_have_identity_and_a_current_one_per_thread():
    default = torch.tpu.current_stream()
    assert default == torch.tpu.default_stream() and default.stream_id == 0
    s = torch.tpu.Stream()
    assert isinstance(s, torch.Stream) and s != default and s.device == torch.device("tpu:0")
    with torch.tpu.stream(s):
        assert torch.tpu.current_stream() == s
        x = torch.ones(4, device="tpu") * 3
    assert torch.tpu.current_stream() == default
    default.wait_stream(s)  # every stream of a device shares its one order: already satisfied
    assert s.query() is not None
    s.synchronize()
    assert s.query()
    assert x.cpu().tolist() == [3.0] * 4
    with torch.tpu.device(1):
        assert torch.tpu.Stream().device == torch.device("tpu:1")


def test_stream_work_is_ordered_like_cuda_code_expects():
    """The CUDA idiom: produce on a side stream, wait for it on the main one, consume."""
    side = torch.tpu.Stream()
    a = torch.arange(6.0, device="tpu")
    with torch.tpu.stream(side):
        a.mul_(2)
        done = side.record_event()
    torch.tpu.current_stream().wait_event(done)
    assert (a + 1).cpu().tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]


def test_events_query_synchronize_and_time():
    start = torch.tpu.Event(enable_timing=True)
    end = torch.tpu.Event(enable_timing=True)
    assert isinstance(start, torch.tpu.Event) and isinstance(start, torch.Event)
    assert not isinstance(torch.Event(device="cpu"), torch.tpu.Event)
    assert start.query()  # never recorded: nothing to wait for
    x = torch.randn(256, 256, device="tpu")
    start.record()
    for _ in range(8):
        x = torch.tanh(x @ x)
    end.record()
    end.synchronize()
    assert end.query()
    ms = start.elapsed_time(end)
    assert 0.0 <= ms < 60_000
    assert torch.isfinite(x).all().item()


def test_elapsed_time_needs_timing_events():
    a, b = torch.tpu.Event(), torch.tpu.Event()
    a.record()
    b.record()
    b.synchronize()
    with pytest.raises(ValueError, match="enable_timing=True"):  # PyTorch checks it, as for CUDA
        a.elapsed_time(b)


def test_event_synchronize_raises_the_error_of_failed_work():
    """A launch that fails asynchronously (a 3-element argument for a 4-element parameter) surfaces
    at the synchronize() of an event recorded after it, naming the op, once."""
    exe = torch_tpu.runtime.compile(ADD4_PROGRAM)
    ev = torch.tpu.Event()
    torch_tpu._C.testing.launch(exe, [torch.zeros(3, device="tpu")], [None], [torch_tpu._C.eager.FreshSpec((4,), torch.float32)], 0, "my_event_op")
    ev.record()
    with pytest.raises(RuntimeError, match="my_event_op"):
        ev.synchronize()
    ev.record()
    ev.synchronize()  # reported once
    assert ev.query()


def test_accelerator_api_reaches_tpu():
    if torch.accelerator.current_accelerator().type != "tpu":
        pytest.skip("another accelerator is current")
    s = torch.accelerator.current_stream()
    assert s.device.type == "tpu"
    ev = torch.Event(device="tpu")
    ev.record(s)
    ev.synchronize()
    torch.accelerator.synchronize()
