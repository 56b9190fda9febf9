"""Custom kernels: JAX functions and Pallas kernels as PyTorch operators on tpu tensors
(torch_tpu.pallas), in every eager mode, under torch.compile and autograd. CPU (torch) is the
reference for values."""
import subprocess
import sys

import pytest
import torch

import torch_tpu

jax = pytest.importorskip("jax")
jnp = jax.numpy
pl = pytest.importorskip("jax.experimental.pallas")

from torch_tpu.pallas import custom_jax_kernel, jax_op  # noqa: E402

TPU = "tpu"


def _axpy_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] * 2 + y_ref[...]


def _pallas_axpy(x, y):
    return pl.pallas_call(_axpy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)


axpy = jax_op("tpu_test::axpy", _pallas_axpy)
sin_sq = jax_op("tpu_test::sin_sq", lambda a: (jnp.sin(a), a * a))


@torch_tpu.eager_mode("strict")  # counts per-op compiles: fused eager compiles its runs, per run signature
def test_pallas_kernel_runs_on_tpu_tensors_and_is_cached():
    x, y = torch.randn(8, 128), torch.randn(8, 128)
    out = axpy(x.to(TPU), y.to(TPU))
    assert out.device.type == "tpu" and out.shape == (8, 128)
    torch.testing.assert_close(out.cpu(), 2 * x + y)
    before = torch_tpu.compile_cache.stats()
    plans = torch_tpu._C.eager.plan_cache_stats()["misses"]
    for _ in range(3):
        out = axpy(y.to(TPU), x.to(TPU))
    torch.testing.assert_close(out.cpu(), 2 * y + x)
    assert torch_tpu.compile_cache.stats()["misses"] == before["misses"]  # nothing compiled again
    assert torch_tpu._C.eager.plan_cache_stats()["misses"] == plans             # the C++ plan cache hit


def test_views_and_multiple_outputs():
    base = torch.randn(6, 8)
    s, q = sin_sq(base.to(TPU).t()[1:5])  # a strided view is read as eager ops read it
    ref = base.t()[1:5]
    torch.testing.assert_close(s.cpu(), torch.sin(ref))
    torch.testing.assert_close(q.cpu(), ref * ref)


def test_default_backward_is_jax_vjp():
    a = torch.randn(5, 3, requires_grad=True)
    at = a.detach().to(TPU).requires_grad_()
    s, q = sin_sq(at)
    (s.sum() + (q * 3).sum()).backward()
    s0, q0 = torch.sin(a), a * a
    (s0.sum() + (q0 * 3).sum()).backward()
    torch.testing.assert_close(at.grad.cpu(), a.grad)


def test_register_autograd_overrides_the_vjp():
    op = jax_op("tpu_test::double", lambda a: a * 2)
    op.register_autograd(lambda ctx, grads: ([grads[0] * 100],))
    a = torch.ones(3, device=TPU, requires_grad=True)
    op(a).sum().backward()
    torch.testing.assert_close(a.grad.cpu(), torch.full((3,), 100.0))


def test_static_arguments_are_keyed():
    scale = custom_jax_kernel(lambda x, s, n: x * s + n, name="tpu_test::scale")
    x = torch.randn(4)
    torch.testing.assert_close(scale(x.to(TPU), 3.0, 1).cpu(), x * 3 + 1)
    torch.testing.assert_close(scale(x.to(TPU), 0.5, 2).cpu(), x * 0.5 + 2)


def test_donation_updates_the_input_in_place():
    acc = jax_op("tpu_test::acc", lambda a, b: a + b, donate_argnums=(0,))
    a = torch.zeros(4, device=TPU)
    view_before = a[1:]
    r = acc(a, torch.ones(4, device=TPU))
    assert r is a
    torch.testing.assert_close(a.cpu(), torch.ones(4))
    torch.testing.assert_close(view_before.cpu(), torch.ones(3))  # the storage itself was updated
    pallas_acc = custom_jax_kernel(
        lambda o, x: pl.pallas_call(lambda o_ref, x_ref, out_ref: out_ref.__setitem__(..., o_ref[...] + x_ref[...]),
                                    out_shape=jax.ShapeDtypeStruct(o.shape, o.dtype),
                                    input_output_aliases={0: 0})(o, x),
        name="tpu_test::pallas_acc", input_output_aliases={0: 0})
    pallas_acc(a, torch.full((4,), 2.0, device=TPU))
    torch.testing.assert_close(a.cpu(), torch.full((4,), 3.0))


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_every_eager_mode(mode):
    x, y = torch.randn(8, 128), torch.randn(8, 128)
    with torch_tpu.eager_mode(mode):
        before = torch_tpu.metrics.counters()["fused_ops"]
        out = (axpy(x.to(TPU) * 2, y.to(TPU)) + 1).relu()
        recorded = torch_tpu.metrics.counters()["fused_ops"] - before
        got = out.cpu()
    torch.testing.assert_close(got, (4 * x + y + 1).relu())
    if mode == "fused":
        assert recorded >= 3  # the kernel is one op of the fused run, between its neighbours


def test_inlined_into_compiled_graphs_forward_and_backward():
    x, y = torch.randn(8, 128), torch.randn(8, 128)
    f = torch.compile(lambda u, v: axpy(u * 1.5, v).relu(), backend="tpu", fullgraph=True)
    torch.testing.assert_close(f(x.to(TPU), y.to(TPU)).cpu(), (3 * x + y).relu())
    assert "func.call" in torch_tpu.dynamo.last_stablehlo()  # one module: XLA fuses around the kernel

    def g(u):
        s, q = sin_sq(u * 2)
        return (s * q).sum()

    xt = x.to(TPU).requires_grad_()
    graphs = torch_tpu.metrics.counters()["compiled_graphs"]
    out = torch.compile(g, backend="tpu", fullgraph=True)(xt)
    out.backward()
    xc = x.clone().requires_grad_()
    ref = (torch.sin(xc * 2) * (xc * 2) ** 2).sum()
    ref.backward()
    torch.testing.assert_close(out.cpu(), ref.detach(), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
    assert torch_tpu.metrics.counters()["compiled_graphs"] == graphs + 2  # forward and backward
    assert "_vjp" in torch_tpu.dynamo.last_stablehlo() or "func.call" in torch_tpu.dynamo.last_stablehlo()


def test_a_kernel_jax_cannot_differentiate_says_to_register_autograd():
    x = torch.randn(8, 128, device=TPU, requires_grad=True)
    out = axpy(x, x.detach())
    with pytest.raises(RuntimeError, match="register_autograd"):
        out.sum().backward()


def test_errors_are_clear_and_change_nothing():
    with pytest.raises(RuntimeError, match="runs on tpu tensors, and argument 0 is on cpu"):
        axpy(torch.randn(8, 128), torch.randn(8, 128))
    bad = jax_op("tpu_test::bad", lambda a: jnp.dot(a, a))
    with pytest.raises(RuntimeError, match=r"could not trace tpu_test::bad[\s\S]*TypeError"):
        bad(torch.randn(3, 4, device=TPU))
    with pytest.raises(ValueError, match="namespace::name"):
        jax_op("no_namespace", lambda a: a)
    acc = jax_op("tpu_test::acc2", lambda a, b: (a + b).astype(jnp.float32), donate_argnums=(0,))
    a = torch.zeros(4, dtype=torch.float16, device=TPU)
    with pytest.raises(ValueError, match="same shape and dtype"):
        acc(a, torch.ones(4, dtype=torch.float16, device=TPU))
    torch.testing.assert_close(a.cpu(), torch.zeros(4, dtype=torch.float16))


@pytest.mark.multiprocess
def test_import_torch_tpu_does_not_import_jax_and_missing_jax_says_what_to_install():
    prog = ("import sys, torch, torch_tpu; assert 'jax' not in sys.modules, 'jax imported';"
            "sys.modules['jax'] = None\n"
            "from torch_tpu.pallas import jax_op\n"
            "try:\n    jax_op('t::f', lambda a: a)(torch.ones(2, device='tpu'))\n"
            "except ImportError as e:\n    print('IMPORT-ERROR', e)\n")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "IMPORT-ERROR" in r.stdout and "torch_tpu[kernels]" in r.stdout


def test_tokamax_kernels_through_custom_jax_kernel():
    tokamax = pytest.importorskip("tokamax")
    from absl import flags
    if not flags.FLAGS.is_parsed():  # tokamax reads absl flags, which would parse pytest's argv
        flags.FLAGS(["pytest"])
    # implementation="xla": the default autotunes, parsing absl flags from sys.argv (pytest's)
    attn = custom_jax_kernel(lambda q, k, v: tokamax.dot_product_attention(q, k, v, implementation="xla"),
                             name="tpu_test::tk_attn")
    q, k, v = (torch.randn(2, 16, 4, 32) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    torch.testing.assert_close(attn(q.to(TPU), k.to(TPU), v.to(TPU)).cpu(), ref, atol=1e-4, rtol=1e-4)
    rd = custom_jax_kernel(lambda a, b, g: tokamax.ragged_dot(a, b, g), name="tpu_test::tk_ragged_dot")
    lhs, rhs, sizes = torch.randn(12, 8), torch.randn(3, 8, 5), torch.tensor([4, 5, 3], dtype=torch.int32)
    ref = torch.cat([lhs[0:4] @ rhs[0], lhs[4:9] @ rhs[1], lhs[9:12] @ rhs[2]])
    torch.testing.assert_close(rd(lhs.to(TPU), rhs.to(TPU), sizes.to(TPU)).cpu(), ref, atol=1e-4, rtol=1e-4)
    ln = custom_jax_kernel(lambda x, s, b: tokamax.layer_norm(x, s, b), name="tpu_test::tk_layer_norm")
    x, s, b = torch.randn(4, 64), torch.randn(64), torch.randn(64)
    torch.testing.assert_close(ln(x.to(TPU), s.to(TPU), b.to(TPU)).cpu(),
                               torch.nn.functional.layer_norm(x, (64,), s, b), atol=1e-4, rtol=1e-4)


try:
    import helion
    import helion.language as hl
except ImportError:  # the kernels extra brings it
    helion = None

if helion is not None:
    @helion.kernel(backend="pallas", config=helion.Config(block_sizes=[8, 128]))
    def helion_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        for tile in hl.tile(out.size()):
            out[tile] = x[tile] + y[tile]
        return out


def test_helion_pallas_kernel_runs_through_its_own_launcher():
    """Helion's Pallas launcher imports torch_tpu._internal.pallas.pallas (JaxCallable,
    jax_placeholder) and torch_tpu._internal.utils.hardware: it runs unchanged on tpu tensors."""
    if helion is None:
        pytest.skip("helion is not installed (pip install 'torch_tpu[kernels]')")
    from torch_tpu._internal.pallas.pallas import JaxCallable
    calls = []
    original = JaxCallable.__call__

    def counted(self, *args):
        calls.append(self.name)
        return original(self, *args)
    JaxCallable.__call__ = counted
    try:
        x, y = torch.randn(16, 256), torch.randn(16, 256)
        out = helion_add(x.to(TPU), y.to(TPU))
    finally:
        JaxCallable.__call__ = original
    assert calls, "Helion did not launch through torch_tpu's JaxCallable"
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), x + y)


def test_internal_names_google_documents():
    from torch_tpu._internal.pallas import custom_jax_kernel as ck, jax_op as jo
    from torch_tpu._internal.pallas.pallas import JaxCallable, jax_placeholder
    assert jo is jax_op and ck is custom_jax_kernel
    assert jax_placeholder(torch.empty(3, 4, dtype=torch.bfloat16)) == jax.ShapeDtypeStruct((3, 4), jnp.bfloat16)

    def kernel(x_ref, acc_ref, o_ref):
        o_ref[...] = acc_ref[...] + x_ref[...]

    acc = torch.ones(4, device=TPU)
    call = JaxCallable(name="acc", jit_fn=jax.jit(pl.pallas_call(kernel, out_shape=jax_placeholder(acc),
                                                                 input_output_aliases={1: 0})),
                       trace_key="acc", input_output_aliases={1: 0})
    call(torch.full((4,), 2.0, device=TPU), acc)  # a pallas_call built before tracing: interpreted too
    torch.testing.assert_close(acc.cpu(), torch.full((4,), 3.0))


def test_tpu_torch_pallas_runs_serialized_modules():
    """The registry PyTorch Inductor's tpu Pallas backend calls (a jax.export module on tpu tensors)."""
    from torch_tpu._internal.pallas import tpu_torch_pallas as registry
    spec = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    exported = jax.export.export(jax.jit(lambda a, b: (a * 2 + b, a.sum())), platforms=["cpu"])(spec, spec)
    assert not registry.lookup_custom_kernel("k", "8x128")
    registry.register_custom_kernel("k", "8x128", serialized_mlir_module=exported.mlir_module_serialized)
    assert registry.lookup_custom_kernel("k", "8x128")
    x, y = torch.randn(8, 128), torch.randn(8, 128)
    out = registry.call_custom_kernel("k", "8x128", inputs=[x.to(TPU), y.to(TPU)],
                                      output_shapes=[torch.empty(8, 128), torch.empty(())], donate_argnums=[])
    torch.testing.assert_close(out[0].cpu(), 2 * x + y)
    torch.testing.assert_close(out[1].cpu(), x.sum(), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="the kernel takes"):
        registry.call_custom_kernel("k", "8x128", inputs=[x.to(TPU)])
    with pytest.raises(KeyError, match="not registered"):
        registry.call_custom_kernel("k", "other", inputs=[])


def test_torch_compile_without_a_backend_routes_tpu_graphs_to_the_tpu_backend():
    """Inductor's tpu path emits Mosaic kernels, which compile only on a TPU: elsewhere a graph of tpu
    tensors compiled with the default backend runs through backend "tpu" (README)."""
    graphs = torch_tpu.metrics.counters()["compiled_graphs"]
    f = torch.compile(lambda a, b: (a * 2 + axpy(a, b)).relu().sum(1))
    x, y = torch.randn(8, 128), torch.randn(8, 128)
    torch.testing.assert_close(f(x.to(TPU), y.to(TPU)).cpu(), (4 * x + y).relu().sum(1), rtol=1e-4, atol=1e-4)
    assert torch_tpu.metrics.counters()["compiled_graphs"] == graphs + 1


def test_donation_inside_a_compiled_graph():
    """The donated input is an input the graph writes: its buffer is donated to the program (one
    graph, the kernel inlined), as functionalization makes of any in-place update."""
    acc = jax_op("tpu_test::acc_compiled", lambda a, b: a + b * 2, donate_argnums=(0,))

    def step(a, b):
        acc(a, b)
        return a.sum()

    a, b = torch.zeros(4, device=TPU), torch.ones(4, device=TPU)
    graphs = torch_tpu.metrics.counters()["compiled_graphs"]
    out = torch.compile(step, backend="tpu", fullgraph=True)(a, b)
    text = torch_tpu.dynamo.last_stablehlo()
    assert torch_tpu.metrics.counters()["compiled_graphs"] == graphs + 1
    assert "func.call" in text and "tf.aliasing_output" in text
    torch.testing.assert_close(a.cpu(), torch.full((4,), 2.0))
    assert out.item() == 8.0


def test_stablehlo_the_plugin_cannot_read_names_the_jax_version():
    """A JAX newer than the plugin's XLA may write StableHLO it cannot parse: the error says so."""
    text = ('module @m {\n  func.func public @main(%arg0: tensor<2xf32>) -> (tensor<2xf32>) {\n'
            '    "func.return"(%arg0) : (tensor<2xf32>) -> ()\n  }\n'
            '  func.func private @k0123456789abcdef_main(%a: tensor<2xf32>) -> tensor<2xf32> {\n'
            '    %0 = stablehlo.an_op_from_a_newer_stablehlo %a : tensor<2xf32>\n    return %0 : tensor<2xf32>\n  }\n}\n')
    with pytest.raises(RuntimeError, match=r"custom kernel's StableHLO[\s\S]*torch_tpu\[kernels\]"):
        torch_tpu.runtime.compile(text)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_and_gradient_per_dtype(dtype):
    op = jax_op(f"tpu_test::gelu_mul_{str(dtype).split('.')[-1]}", lambda a, b: jax.nn.gelu(a, approximate=False) * b)
    a, b = torch.randn(4, 8, dtype=dtype), torch.randn(4, 8, dtype=dtype)
    at, bt = a.to(TPU).requires_grad_(), b.to(TPU).requires_grad_()
    out = op(at, bt)
    assert out.dtype == dtype
    out.float().sum().backward()
    ac, bc = a.clone().requires_grad_(), b.clone().requires_grad_()
    ref = torch.nn.functional.gelu(ac) * bc
    ref.float().sum().backward()
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), **tol)
    torch.testing.assert_close(at.grad.cpu(), ac.grad, **tol)
    torch.testing.assert_close(bt.grad.cpu(), bc.grad, **tol)


def test_a_new_shape_traces_again_the_same_does_not():
    from torch_tpu.pallas import program
    op = jax_op("tpu_test::cube", lambda a: a * a * a)
    before = len(program._CACHE)
    op(torch.ones(3, device=TPU))
    op(torch.full((3,), 2.0, device=TPU))
    assert len(program._CACHE) == before + 1   # one trace for the (3,) float32 signature
    torch.testing.assert_close(op(torch.full((2, 2), 2.0, device=TPU)).cpu(), torch.full((2, 2), 8.0))
    assert len(program._CACHE) == before + 2   # a new shape: traced again
