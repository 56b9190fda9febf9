"""The typed seam between the eager front-end's C++ and Python halves (csrc/eager/call.h,
csrc/eager/op_kernel.h): argument kinds and key parts are _C enums and read-only objects with
named fields, and a miss hands Python the call as such."""
import pytest
import torch

import torch_tpu
from torch_tpu import _C
from torch_tpu.eager.kernel import Kernel, Signature

TPU = "tpu"


def test_signature_kinds_are_arg_kinds():
    kinds = Signature(torch.ops.aten.add.Tensor).kinds
    assert kinds == [_C.eager.ArgKind.tensor, _C.eager.ArgKind.tensor, _C.eager.ArgKind.scalar]
    kinds = Signature(torch.ops.aten.cat.default).kinds
    assert kinds == [_C.eager.ArgKind.tensor_list, _C.eager.ArgKind.value]
    assert Signature(torch.ops.aten.bernoulli_.float).kinds[-1] == _C.eager.ArgKind.generator


def _parts_of_miss(fn):
    """The key parts Python receives for the first (missing) call in fn."""
    seen = []
    real = Kernel._slow
    Kernel._slow = lambda self, args, kwargs, key, *rest: seen.append(key) or real(self, args, kwargs, key, *rest)
    try:
        torch_tpu._C.eager.plan_cache_clear()
        with torch_tpu.eager_mode("strict"):
            fn()
    finally:
        Kernel._slow = real
    assert seen, "the call did not miss"
    return seen[0]


def test_key_parts_have_named_fields():
    base = torch.arange(12.0, device=TPU).reshape(3, 4)
    view = base[1:, ::2]  # offset 4, strides (4, 2)
    t, t2, s = _parts_of_miss(lambda: torch.add(view, view, alpha=2.5))
    assert t.kind == _C.eager.KeyPartKind.device
    # offset 4 is an operand (position 1, after its storage): the program adds t.offset to it
    assert (t.dtype, t.sizes, t.strides, t.offset, t.offset_position, t.slot, t.bits) == \
        (torch.float32, (2, 2), (4, 2), 0, 1, 0, 0)
    assert t.first and t.storage_dtype == torch.float32
    assert t2.kind == _C.eager.KeyPartKind.device and t2.slot == 0 and not t2.first  # the same storage
    assert (t2.offset, t2.offset_position) == (0, 1)  # the same view: relative offset 0
    assert s.kind == _C.eager.KeyPartKind.scalar and s.dtype == torch.float32 and s.position == 2 and s.baked is None
    t0 = _parts_of_miss(lambda: torch.add(base[:2], 1.5))[0]  # offset 0 is baked
    assert (t0.offset, t0.offset_position) == (0, -1)
    _, wrapped, alpha = _parts_of_miss(lambda: torch.add(view, 2.5))  # a wrapped number; alpha 1 is baked
    assert wrapped.kind == _C.eager.KeyPartKind.host and wrapped.dtype == torch.float64 and wrapped.sizes == ()
    assert alpha.kind == _C.eager.KeyPartKind.baked and alpha.baked == 1 and alpha.dtype == torch.int64
    with pytest.raises(AttributeError):
        t.slot = 3  # read-only


def test_key_parts_of_lists():
    a, b = torch.ones(2, device=TPU), torch.zeros(3, device=TPU)
    parts = _parts_of_miss(lambda: torch.cat([a, b]))
    assert [p.kind for p in parts] == [_C.eager.KeyPartKind.length, _C.eager.KeyPartKind.device, _C.eager.KeyPartKind.device,
                                       _C.eager.KeyPartKind.value]
    assert parts[0].length == 2 and (parts[1].slot, parts[2].slot) == (0, 1)


def test_fresh_specs_are_typed():
    s = _C.eager.FreshSpec((2, 3), torch.float32)
    assert (s.sizes, s.dtype, s.strides) == ((2, 3), torch.float32, None)
    t = _C.eager.FreshSpec((2, 3, 4), torch.bfloat16, (12, 1, 3))
    assert (t.sizes, t.dtype, t.strides) == ((2, 3, 4), torch.bfloat16, (12, 1, 3))
    assert "bfloat16" in repr(t)
    with pytest.raises(RuntimeError, match="2 strides for 3 sizes"):
        _C.eager.FreshSpec((2, 3, 4), torch.float32, (1, 2))



def test_an_entry_describes_its_fresh_results_as_fresh_specs(monkeypatch):
    entries = []
    real = Kernel._slow

    def spy(self, *a):
        r = real(self, *a)
        entries.append(r[1])
        return r

    x = torch.randn(2, 3, 4, device=TPU).permute(0, 2, 1)
    _C.eager.plan_cache_clear()  # the sub below enters the slow path, whatever ran before
    monkeypatch.setattr(Kernel, "_slow", spy)
    y = x - 0.25
    (spec,) = entries[-1].fresh
    assert isinstance(spec, _C.eager.FreshSpec)
    assert (spec.sizes, spec.dtype, spec.strides) == (tuple(y.shape), torch.float32, y.stride()) == \
        ((2, 4, 3), torch.float32, (12, 1, 4))  # CPU's: the input's permuted layout kept


@pytest.mark.parametrize("mode", ["strict", "debug", "fused"])
def test_a_refused_key_runs_on_the_cpu_fallback_from_cpp(monkeypatch, mode):
    """A call a lowering refuses (NotLowered: bilinear upsampling of uint8 runs CPU's kernel) is kept
    in the plan cache as a host plan: that call and every later one with its key run PyTorch's CPU
    kernel from C++ (csrc/aten/fallback.h's run_on_cpu), counted, and Python sees only the first."""
    import torch.nn.functional as F
    misses = []
    real = Kernel._slow
    monkeypatch.setattr(Kernel, "_slow", lambda self, *a: misses.append(self.name) or real(self, *a))
    x = torch.randint(0, 255, (1, 3, 5, 7), dtype=torch.uint8)
    want = F.interpolate(x, scale_factor=2, mode="bilinear")
    _C.eager.plan_cache_clear()
    torch_tpu.metrics.reset()
    with torch_tpu.eager_mode(mode):
        xt = x.to(TPU)
        got = [F.interpolate(xt, scale_factor=2, mode="bilinear") for _ in range(3)]
        out = torch.zeros(1, 3, 10, 14, dtype=torch.uint8, device=TPU)
        for _ in range(2):
            torch._C._nn.upsample_bilinear2d(xt, [10, 14], False, out=out)  # written in place, as CPU writes it
    for g in got + [out]:
        assert g.device.type == "tpu" and torch.equal(g.cpu(), want)
    assert misses.count("aten::upsample_bilinear2d") == 1 and misses.count("aten::upsample_bilinear2d.out") == 1
    counts = torch_tpu.metrics.fallback_counts()
    assert counts["aten::upsample_bilinear2d"] == 3 and counts["aten::upsample_bilinear2d.out"] == 2
