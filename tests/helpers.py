"""Compare an op on tpu with PyTorch's CPU result: forward values, dtypes and gradients."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import torch
from torch._prims_common import check_significant_strides

TPU = torch.device("tpu")


@contextlib.contextmanager
def python_entries():
    """Yields the list of op names whose calls enter the eager front-end's Python half (Kernel._slow)
    inside the block: empty when every call ran on the C++ path."""
    from torch_tpu.eager.kernel import Kernel
    names = []
    real = Kernel._slow
    Kernel._slow = lambda self, *a: names.append(self.name) or real(self, *a)
    try:
        yield names
    finally:
        Kernel._slow = real


def to_tpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to(TPU).requires_grad_(x.requires_grad)
    if isinstance(x, (list, tuple)):
        return type(x)(to_tpu(v) for v in x)
    return x


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(v) for v in x)
    return x


def _leaves(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _leaves(v)]
    return []


def _tol(dtype):
    if dtype in (torch.bfloat16,):
        return dict(atol=2e-2, rtol=2e-2)
    if dtype == torch.float16:
        return dict(atol=2e-3, rtol=2e-3)
    if dtype == torch.float32:
        return dict(atol=1e-5, rtol=1.3e-5)
    return {}


def check(fn, *args, grad=True, atol=None, rtol=None, no_fallback=True, strides=True, **kwargs):
    """Runs fn(*args) on CPU and on tpu, asserts equal outputs (values, dtypes and, unless
    strides=False, the strides of each output) and, when some float input requires grad, equal
    gradients of sum(outputs * fixed random weights).
    Fails if the tpu run went through the CPU fallback (unless no_fallback=False)."""
    import torch_tpu
    cpu_args = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                for a in args]
    tpu_args = [to_tpu(a) for a in args]
    before = sum(torch_tpu.metrics.fallback_counts().values())
    out_cpu = fn(*cpu_args, **kwargs)
    out_tpu = fn(*tpu_args, **kwargs)
    after = torch_tpu.metrics.fallback_counts()
    if no_fallback:
        assert sum(after.values()) == before, f"CPU fallback used: {after}"
    lc, lt = _leaves(out_cpu), _leaves(out_tpu)
    assert len(lc) == len(lt)
    for c, t in zip(lc, lt):
        assert t.device.type == "tpu", f"result on {t.device}"
        tol = _tol(c.dtype) if atol is None else dict(atol=atol, rtol=rtol if rtol is not None else atol)
        torch.testing.assert_close(t.detach().cpu(), c.detach(), equal_nan=True, **tol)
        if strides:  # the dims of size > 1 (the others never move a pointer), as PyTorch compares them
            assert check_significant_strides(t, c, only_cuda=False)[0], \
                f"strides {t.stride()} != CPU {c.stride()} (shape {tuple(c.shape)})"
    if not grad:
        return out_tpu
    need = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    diff = [(c, t) for c, t in zip(lc, lt) if c.requires_grad and c.dtype.is_floating_point]
    if not need or not diff:
        return out_tpu
    gen = torch.Generator().manual_seed(0)
    ws = [torch.randn(c.shape, generator=gen, dtype=torch.float32).to(c.dtype) for c, _ in diff]
    loss_c = sum((c * w).sum() for (c, _), w in zip(diff, ws))
    loss_t = sum((t * w.to(TPU)).sum() for (_, t), w in zip(diff, ws))
    gc = torch.autograd.grad(loss_c, [cpu_args[i] for i in need], allow_unused=True)
    gt = torch.autograd.grad(loss_t, [tpu_args[i] for i in need], allow_unused=True)
    if no_fallback:
        assert sum(torch_tpu.metrics.fallback_counts().values()) == before, \
            f"CPU fallback used in backward: {torch_tpu.metrics.fallback_counts()}"
    for c, t in zip(gc, gt):
        if c is None:
            assert t is None or not t.abs().sum().item()
            continue
        tol = _tol(c.dtype) if atol is None else dict(atol=atol, rtol=rtol if rtol is not None else atol)
        torch.testing.assert_close(t.cpu(), c, equal_nan=True, **tol)
    return out_tpu


def data(shape, dtype):
    """Random test data of `dtype` (bool: random signs), values spread over about [-15, 15]."""
    x = torch.randn(shape) * 5
    return x.to(dtype) if dtype != torch.bool else x > 0


def grad(x):
    """x requiring grad when it is a float tensor."""
    return x.requires_grad_() if x.dtype.is_floating_point else x


def run_python(prog: str, **env: str) -> str:
    """Runs `prog` in a new interpreter from the repository root (so `tests.*` and the test modules'
    own `helpers` import), with the extra environment variables `env` (a runtime setting read once
    per process); asserts that it exits cleanly and returns its stdout."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    full = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([root, here, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=full, timeout=300,
                       cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


# A 4-element float32 program: the tests of failing launches give it a 3-element argument.
ADD4_PROGRAM = """module @m {
  func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %a : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}"""


def strict_env(env: dict) -> dict:
    """`env` for a subprocess whose eager mode is strict whatever the suite runs in (tests that count
    per-op programs: fused eager would make one program of several ops, debug is strict's programs)."""
    env = {k: v for k, v in env.items() if k not in ("TPU_LAUNCH_BLOCKING", "TORCH_TPU_DEFER_AND_FUSE")}
    env["TORCH_TPU_EAGER_MODE"] = "strict"
    return env
