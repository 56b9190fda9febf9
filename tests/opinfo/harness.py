"""OpInfo conformance: each op_db entry's sample inputs run on CPU and on tpu, compared.

Every (op, dtype) ends as one result: "pass", "mismatch" (values, dtypes or gradients differ),
"error" (tpu raised where CPU did not, or a timeout), "fallback" (right answer, but some op ran
through the counted CPU fallback), or "skip" (with the reason). Only a few samples per pair are
run (the first ones are the plain cases) so that the whole database fits in tens of minutes.
"""
from __future__ import annotations

import math
import signal
import time
import traceback

import torch
from torch._prims_common import check_significant_strides
from torch.utils._python_dispatch import TorchDispatchMode

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.bool,
          torch.float64, torch.complex64]
TPU = "tpu"

# Ops whose values are random: compared by shape and dtype only.
RANDOM_OPS = {
    "bernoulli", "normal", "normal.number_mean", "normal.in_place", "uniform", "rand_like", "randn_like",
    "randint_like", "randint", "multinomial", "nn.functional.dropout", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train", "nn.functional.feature_alpha_dropout.without_train",
    "nn.functional.rrelu", "cauchy", "exponential", "geometric", "log_normal", "randn", "rand",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted",
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "torch._refs.nn.functional.alpha_dropout",
}
# Ops whose results are uninitialized memory, or that only exist to raise: values not compared.
SHAPE_ONLY = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"}


class OpTimeout(Exception):
    pass


def _tol(dtype):
    """Default tolerances per dtype, a little wider than assert_close's because XLA's and
    PyTorch's transcendental functions differ in the last bits."""
    return {
        torch.float32: dict(atol=1e-5, rtol=1.3e-5),
        torch.float64: dict(atol=1e-7, rtol=1e-7),
        torch.complex128: dict(atol=1e-7, rtol=1e-7),
        torch.complex64: dict(atol=1e-5, rtol=1.3e-5),
        torch.bfloat16: dict(atol=1e-2, rtol=1.6e-2),
        torch.float16: dict(atol=1e-3, rtol=1e-3),
    }.get(dtype, dict(atol=0, rtol=0))


def op_key(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def _map(x, fn):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, tuple):
        return tuple(_map(v, fn) for v in x)
    if isinstance(x, list):
        return [_map(v, fn) for v in x]
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    return x


# Ops whose extra tensor arguments must stay on CPU (PyTorch requires it), by op name.
_HOST_ARGS = {"tensor_split"}


def _to_tpu_args(sample, op):
    """The sample's (input, args, kwargs) on tpu; a factory's device= argument points there too."""
    if op.name in _HOST_ARGS:
        inp = _map(sample.input, _copier(TPU))
        args, kwargs = _map((sample.args, sample.kwargs), _copier(None))
    else:
        inp, args, kwargs = _map((sample.input, sample.args, sample.kwargs), _copier(TPU))
    if "device" in kwargs:
        kwargs["device"] = TPU
    # Samples are made for CPU; PyTorch's device-generic tests make them for the device under test,
    # so a device the sample names (x.to("cpu", ...)) becomes tpu.
    args = [TPU if (isinstance(a, torch.device) and a.type == "cpu") or (op.name == "to" and isinstance(a, str)
                                                                         and a == "cpu") else a
            for a in args]
    return inp, tuple(args), kwargs


def _is_sparse(sample):
    return any(t.layout != torch.strided for t in _leaves((sample.input, sample.args, sample.kwargs)))


def _leaves(x, out=None):
    out = [] if out is None else out
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _leaves(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            _leaves(v, out)
    return out


def _copier(device):
    def fn(t):
        c = t.detach().to(device) if device is not None else t.detach().clone()
        if device is not None and c.data_ptr() == t.data_ptr() and t.device == c.device:
            c = c.clone()
        return c.requires_grad_(t.requires_grad)
    return fn


def _compare_structure(cpu, tpu, what, tol, values=True, any_device=False):
    """Raises AssertionError with a short reason if tpu's result differs from cpu's."""
    if isinstance(cpu, torch.Tensor):
        if not isinstance(tpu, torch.Tensor):
            raise AssertionError(f"{what}: tpu returned {type(tpu).__name__}, cpu a tensor")
        if tpu.device.type != "tpu" and not (any_device and tpu.device == cpu.device):
            raise AssertionError(f"{what}: result on {tpu.device}")
        if tpu.dtype != cpu.dtype:
            raise AssertionError(f"{what}: dtype {tpu.dtype} != cpu {cpu.dtype}")
        if tpu.shape != cpu.shape:
            raise AssertionError(f"{what}: shape {tuple(tpu.shape)} != cpu {tuple(cpu.shape)}")
        if values:
            t = tpu.detach().cpu()
            c = cpu.detach()
            if c.layout != torch.strided:
                c, t = c.to_dense(), t.to_dense() if t.layout != torch.strided else t
            try:
                torch.testing.assert_close(t, c, equal_nan=True, check_device=False, **tol(cpu.dtype))
            except AssertionError as e:
                lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
                detail = "; ".join(ln for ln in lines[1:] if ln.startswith(("Mismatched", "Greatest")))
                raise AssertionError(f"{what} {cpu.dtype}: {lines[0] if lines else ''} {detail}") from None
        return
    if isinstance(cpu, (list, tuple)):
        if not isinstance(tpu, (list, tuple)) or len(tpu) != len(cpu):
            raise AssertionError(f"{what}: structure differs ({type(tpu).__name__})")
        for i, (c, t) in enumerate(zip(cpu, tpu)):
            _compare_structure(c, t, f"{what}[{i}]", tol, values, any_device)
        return
    if isinstance(cpu, float) and isinstance(tpu, float) and math.isnan(cpu) and math.isnan(tpu):
        return
    if values and cpu != tpu:
        raise AssertionError(f"{what}: {tpu!r} != cpu {cpu!r}")


class LayoutMismatch(AssertionError):
    """Equal values, but a result's strides differ from CPU's."""


def _compare_layouts(cpu, tpu):
    """Raises LayoutMismatch when a tensor result's strides (those of dims of size > 1, as PyTorch's
    own stride checks compare) differ from the CPU result's."""
    for i, (c, t) in enumerate(zip(_leaves(cpu), _leaves(tpu))):
        if isinstance(c, torch.Tensor) and isinstance(t, torch.Tensor) and c.layout == t.layout == torch.strided \
                and not check_significant_strides(t, c, only_cuda=False)[0]:
            raise LayoutMismatch(f"output[{i}]: strides {t.stride()} != cpu {c.stride()} (shape {tuple(c.shape)})")


class _RandomSpy(TorchDispatchMode):
    """Notes whether any ATen op that draws random numbers ran (its values are then not compared)."""

    def __init__(self):
        super().__init__()
        self.seen = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.seen = True
        return func(*args, **(kwargs or {}))


def _grad_tol(dtype):
    t = _tol(dtype)
    return dict(atol=t["atol"] * 10 if t["atol"] else 0, rtol=t["rtol"] * 10 if t["rtol"] else 0)


def _grads(op, sample, args_in, out, weights):
    """Gradients of sum(outputs * weights) w.r.t. the float inputs that require grad."""
    outs = [t for t in _leaves(sample.output_process_fn_grad(out))
            if t.requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex)]
    ins = [t for t in _leaves(args_in) if t.requires_grad]
    if not outs or not ins:
        return None
    loss = sum((o * w.to(o.device, o.dtype)).real.sum() if o.dtype.is_complex else (o * w.to(o.device, o.dtype)).sum()
               for o, w in zip(outs, weights(outs)))
    return torch.autograd.grad(loss, ins, allow_unused=True)


def _weights_fn():
    cache = {}

    def weights(outs):
        if "w" not in cache:
            gen = torch.Generator().manual_seed(0)
            cache["w"] = [torch.randn(o.shape, generator=gen) for o in outs]
        return cache["w"]
    return weights


def run_sample(op, sample, dtype, check_grad, random_op):
    """Returns None if the sample matches, else raises. Returns "skip: reason" if CPU itself fails."""
    if _is_sparse(sample) or op.name.startswith("to_sparse"):
        return "skip: sparse layouts are not supported on tpu"
    args_cpu = _map((sample.input, sample.args, sample.kwargs), _copier(None))
    spy = _RandomSpy()
    try:
        # The reference runs outside any dispatch mode (a Python mode changes some CPU results, e.g.
        # complex pinv); a throwaway run under the spy tells whether the op draws random numbers.
        out_cpu = op(args_cpu[0], *args_cpu[1], **args_cpu[2])
        spare = _map((sample.input, sample.args, sample.kwargs), _copier(None))
        with spy:
            op(spare[0], *spare[1], **spare[2])
    except Exception as e:  # the sample is invalid on CPU too: nothing to compare
        return f"skip: cpu raised {type(e).__name__}"
    if any(t.dtype == torch.complex32 for t in _leaves(out_cpu)):
        return "skip: complex32 has no XLA element type (tpu raises TypeError naming the dtype)"
    random_op = random_op or spy.seen  # e.g. attention with dropout in training
    args_tpu = _to_tpu_args(sample, op)
    out_tpu = op(args_tpu[0], *args_tpu[1], **args_tpu[2])
    ties = False  # tie order differs: gradients then go to other (equal) elements, not compared
    try:
        if op.name in _GAUGE_OPS:
            _compare_up_to_gauge(op.name, out_cpu, out_tpu)
        else:
            _compare_structure(out_cpu, out_tpu, "output", _tol, values=not random_op)
    except AssertionError:
        if _closer_to_double(op, sample, dtype, out_cpu, out_tpu):
            return None
        if not _same_order_up_to_ties(op, sample, out_cpu, out_tpu):
            raise
        ties = True
    _compare_layouts(out_cpu, out_tpu)
    if op.name == "msort" and sample.input.numel() != sample.input.unique().numel():
        ties = True  # equal values: which of them receives which gradient is unspecified
    # in-place ops (and ops that write an argument): the arguments must agree too
    _compare_structure(list(_leaves(args_cpu)), list(_leaves(args_tpu)), "argument after call", _tol,
                       values=not random_op, any_device=True)
    if not check_grad or random_op or ties:
        return None
    weights = _weights_fn()
    try:
        g_cpu = _grads(op, sample, args_cpu, out_cpu, weights)
    except Exception as e:
        return f"skip-grad: cpu backward raised {type(e).__name__}"
    if g_cpu is None:
        return None
    g_tpu = _grads(op, sample, args_tpu, out_tpu, weights)
    for i, (c, t) in enumerate(zip(g_cpu, g_tpu)):
        if c is None and t is None:
            continue
        if c is None or t is None:
            z = t if c is None else c
            if z.abs().sum().item() == 0:
                continue
            raise AssertionError(f"grad[{i}]: one side is None")
        _compare_structure(c, t, f"grad[{i}]", _grad_tol)
    return None


# Ops whose vector outputs are unique only up to a per-column sign (real) or phase (complex):
# PyTorch's documentation of torch.linalg.eigh ("The eigenvectors of a real symmetric or complex
# Hermitian matrix are only unique up to sign (complex phase)... the returned eigenvectors may differ
# between implementations") and of torch.linalg.svd / torch.svd ("The returned decomposition is not
# unique: the singular vectors ... are unique up to multiplication by a sign / a complex phase e^{i phi}
# ... different platforms, like NumPy, or inputs on different device types, may produce different U and
# V"). Their values are compared directly; the vectors after fixing each column's phase (dividing by the
# phase of its largest-magnitude entry, located on the CPU result and used on both), the reconstruction
# too, and, for full_matrices=True, the extra columns of U / rows of Vh (any orthonormal basis of the
# complement) only for being unitary. Gradients need no rule: these OpInfos' output_process_fn_grad
# already take abs() of the vectors (or U @ Vh), which is gauge-invariant.
_GAUGE_OPS = {"linalg.eigh", "linalg.svd", "svd"}


def _fix_phase(x, ref):
    """Columns of x divided by the phase of their entry where ref's column is largest in magnitude."""
    if x.numel() == 0:
        return x
    idx = ref.abs().argmax(dim=-2, keepdim=True)
    piv = x.gather(-2, idx)
    mag = piv.abs()
    phase = torch.where(mag == 0, torch.ones_like(piv), piv / torch.where(mag == 0, torch.ones_like(mag), mag))
    return x / phase


def _compare_up_to_gauge(name, out_cpu, out_tpu):
    _compare_structure(out_cpu, out_tpu, "output", _tol, values=False)
    c = [t.detach() for t in out_cpu]
    t = [x.detach().cpu() for x in out_tpu]
    close = lambda a, b, what: _compare_structure(b, a, what, _tol, any_device=True)  # noqa: E731
    if name == "linalg.eigh":
        (lc, qc), (lt, qt) = c, t
        close(lt, lc, "output[0] (eigenvalues)")
        close(_fix_phase(qt, qc), _fix_phase(qc, qc), "output[1] (eigenvectors up to phase)")
        rec = lambda w, q: (q * w.to(q.dtype).unsqueeze(-2)) @ q.mH  # noqa: E731
        close(rec(lt, qt), rec(lc, qc), "eigh reconstruction")
        return
    (uc, sc, vc), (ut, st, vt) = c, t
    if name == "svd":   # torch.svd returns V, not Vh
        vc, vt = vc.mH, vt.mH
    close(st, sc, "output[1] (singular values)")
    k = sc.shape[-1]
    for full_c, full_t, what in ((uc, ut, "U"), (vc.mH, vt.mH, "V")):
        close(_fix_phase(full_t[..., :k], full_c[..., :k]), _fix_phase(full_c[..., :k], full_c[..., :k]),
              f"{what} columns up to phase")
        if full_t.shape[-1] > k:
            eye = torch.eye(full_t.shape[-1], dtype=full_t.dtype).expand(full_t.shape[:-2] + (-1, -1))
            close(full_t.mH @ full_t, eye, f"{what} unitary")
    rec = lambda u, s_, vh: (u[..., :k] * s_.to(u.dtype).unsqueeze(-2)) @ vh[..., :k, :]  # noqa: E731
    close(rec(ut, st, vt), rec(uc, sc, vc), "svd reconstruction")


def _closer_to_double(op, sample, dtype, out_cpu, out_tpu):
    """Half precision: CPU kernels may round intermediates (e.g. accumulate in bf16) where tpu
    accumulates in float32. A tpu result at least as close to the float64 computation as CPU's
    is accepted."""
    if dtype not in (torch.float16, torch.bfloat16):
        return False
    up = lambda t: t.detach().to(torch.float64) if t.dtype == dtype else t.detach().clone()  # noqa: E731
    try:
        ref = op(*[_map(sample.input, up)], *_map(sample.args, up), **_map(sample.kwargs, up))
    except Exception:
        return False
    lc, lt, lr = _leaves(out_cpu), _leaves(out_tpu), _leaves(ref)
    if not (len(lc) == len(lt) == len(lr)):
        return False
    for c, t, r in zip(lc, lt, lr):
        if c.dtype != t.dtype or c.shape != t.shape or c.shape != r.shape:
            return False
        if not c.dtype.is_floating_point:
            if not torch.equal(c, t.cpu()):
                return False
            continue
        r = r.to(torch.float64)
        ec = (c.to(torch.float64) - r).abs().nan_to_num(0)
        et = (t.detach().cpu().to(torch.float64) - r).abs().nan_to_num(0)
        if not torch.equal(c.isnan(), t.detach().cpu().isnan()):
            return False
        if et.numel() and et.max() > ec.max() * 1.01 + 1e-6:
            return False
    return True


# Ops whose indices for equal values are unspecified unless stable=True (CPU's unstable sort
# orders ties arbitrarily): any order of ties is right if it selects the same values.
_TIE_ORDER_OPS = {"sort": 0, "argsort": 0, "topk": 1, "msort": None}


def _same_order_up_to_ties(op, sample, out_cpu, out_tpu):
    if op.name not in _TIE_ORDER_OPS or sample.kwargs.get("stable"):
        return False
    pos = _TIE_ORDER_OPS[op.name]
    dim = sample.kwargs.get("dim", -1)
    if pos is not None and len(sample.args) > pos and isinstance(sample.args[pos], int):
        dim = sample.args[pos]
    if pos is None:
        dim = 0
    x = sample.input.detach()
    if x.dim() == 0:
        return False
    idx_c = out_cpu if isinstance(out_cpu, torch.Tensor) else out_cpu[1]
    idx_t = (out_tpu if isinstance(out_tpu, torch.Tensor) else out_tpu[1]).detach().cpu()
    if not isinstance(out_cpu, torch.Tensor):
        _compare_structure(out_cpu[0], out_tpu[0], "output[0]", _tol)
    if idx_c.dtype != idx_t.dtype or idx_c.shape != idx_t.shape:
        return False
    if idx_t.numel() and (idx_t.min() < 0 or idx_t.max() >= x.shape[dim]):
        return False
    # each tpu index must pick the value cpu's picks, and no index may repeat along dim
    same = torch.equal(x.gather(dim, idx_t), x.gather(dim, idx_c)) or \
        torch.testing.assert_close(x.gather(dim, idx_t), x.gather(dim, idx_c), equal_nan=True) is None
    uniq = idx_t.sort(dim=dim).values.diff(dim=dim).ne(0).all().item() if idx_t.shape[dim] > 1 else True
    return bool(same and uniq)


def _alarm(signum, frame):
    raise OpTimeout()


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    first = next((m for m in msg if m.strip()), "")
    return f"{type(e).__name__}: {first[:300]}"


def run_op(op, dtypes=DTYPES, max_samples=3, timeout_s=60.0, grad_samples=1):
    """Results of one OpInfo over `dtypes`: list of dicts (op, dtype, result, reason, seconds)."""
    import torch_tpu
    key = op_key(op)
    results = []
    supported = op.supported_dtypes("cpu")
    random_op = key in RANDOM_OPS or op.name in RANDOM_OPS
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for dtype in dtypes:
            t0 = time.time()
            res = dict(op=key, dtype=str(dtype).replace("torch.", ""))
            results.append(res)
            if dtype not in supported:
                res.update(result="skip", reason="dtype not supported by the op on CPU", seconds=0.0)
                continue
            fb_before = torch_tpu.metrics.fallback_counts()
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            try:
                res.update(_run_pair(op, dtype, max_samples, grad_samples, random_op))
            except OpTimeout:
                res.update(result="error", reason=f"timeout after {timeout_s:.0f}s")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            fb_after = torch_tpu.metrics.fallback_counts()
            used = sorted(k for k, v in fb_after.items() if v != fb_before.get(k, 0))
            if used and res["result"] == "pass":
                res.update(result="fallback", reason="CPU fallback: " + ", ".join(used)[:200])
            elif used:
                res["fallback_ops"] = used
            res["seconds"] = round(time.time() - t0, 2)
    finally:
        signal.signal(signal.SIGALRM, old)
    return results


def _run_pair(op, dtype, max_samples, grad_samples, random_op):
    want_grad = op.supports_autograd and (dtype.is_floating_point or dtype.is_complex) and dtype != torch.complex64
    try:
        samples = list(_take(op.sample_inputs("cpu", dtype, requires_grad=want_grad), max_samples))
    except OpTimeout:
        raise
    except Exception as e:
        return dict(result="skip", reason="sample generation failed: " + _short(e))
    if not samples:
        return dict(result="skip", reason="no sample inputs")
    ran = 0
    notes = []
    for i, s in enumerate(samples):
        try:
            r = run_sample(op, s, dtype, want_grad and i < grad_samples, random_op)
        except OpTimeout:
            raise
        except LayoutMismatch as e:
            return dict(result="layout", reason=f"sample {i}: " + _short(e))
        except AssertionError as e:
            return dict(result="mismatch", reason=f"sample {i}: " + _short(e))
        except Exception as e:
            return dict(result="error", reason=f"sample {i}: " + _short(e),
                        trace=traceback.format_exc(limit=-4)[-1500:])
        if r is None or r.startswith("skip-grad"):
            ran += 1
        if r:
            notes.append(r)
    if not ran:
        return dict(result="skip", reason="; ".join(sorted(set(notes)))[:200])
    return dict(result="pass", reason=("random op: shape/dtype only" if random_op else ""))


def _take(it, n):
    for i, s in enumerate(it):
        if i >= n:
            return
        yield s


def select_ops(names=None, exclude=None):
    """op_db entries, optionally only those whose key (name[.variant]) or name is in `names`."""
    from torch.testing._internal.common_methods_invocations import op_db
    ops = list(op_db)
    if names:
        wanted = set(names)
        ops = [o for o in ops if op_key(o) in wanted or o.name in wanted]
    if exclude:
        ops = [o for o in ops if op_key(o) not in exclude]
    return ops
