"""Runs a zoo model's training on tpu in one mode and on the CPU, and compares them.

A run is: the forward pass and loss, the backward pass, and an AdamW step, three times (steps 1-3:
each step's loss, the first step's gradients and the final parameters and buffers are compared),
then WARMUP_STEPS untimed steps and `timed_steps` more steps timed end to end (a host sync at the end: the tpu device runs
asynchronously). The CPU reference is PyTorch's CPU eager run of the same model from the same
initial weights and inputs, as the project's rule makes CPU the reference for every op.

Modes: "strict" and "fused" eager (torch_tpu.eager_mode), and "compiled": the model under
`torch.compile(backend="tpu")`, with the optimizer step eager, as a training script writes it.

A result's status is one of:
- "pass": every compared value is within tolerance and no op ran through the CPU fallback;
- "fallback": values match, but some ops ran on the CPU (they are listed), or a compiled graph
  failed to lower and ran eagerly instead;
- "mismatch": a value is out of tolerance (the worst one is named). Values are compared with a
  float64 CPU run of the same model: a tpu value may be CPU_ERROR_FACTOR times as far from it as the
  CPU float32 value is (see there);
- "error": the run raised (the exception is given).
"""
import copy
import dataclasses
import time
import traceback

import torch

import torch_tpu
from torch_tpu import metrics

from .zoo import ModelSpec

MODES = ("strict", "fused", "compiled")
LR = 1e-3
STEPS = 3
# Untimed steps before the timed ones: a process's first steps pay one-time costs (on tpu, compiles
# of steps whose programs differ from step 1's; on the CPU, PyTorch's lazy initialisation).
WARMUP_STEPS = 2
# How far from the float64 truth a tpu value may be, in units of the CPU float32 run's own distance
# from it (plus a floor). Two float32 implementations sum in different orders; where a model is
# ill-conditioned (batch norm over two values, three AdamW steps amplifying a rounding difference),
# both are far from the truth, and the CPU's distance measures how far. A wrong op is orders of
# magnitude further.
CPU_ERROR_FACTOR = 10
RTOL = 1e-4  # step 1's floor, relative to the tensor's norm
LATER_RTOL = 1e-3  # the losses of steps 2 and 3 (see _compare)
UPDATE_RTOL = 0.02  # the weights after step 3, relative to how far the steps moved them

@dataclasses.dataclass
class Result:
    """One row of the table: a model in a mode. Times are milliseconds per training step."""
    model: str
    mode: str
    status: str
    detail: str = ""
    tpu_ms: float = float("nan")
    cpu_ms: float = float("nan")


@dataclasses.dataclass
class _Run:
    losses: list
    grads: dict
    state: dict
    ms: float


def _to(inputs, device, dtype=None):
    def move(v):
        if not isinstance(v, torch.Tensor):
            return v
        return v.to(device, dtype=dtype if dtype is not None and v.is_floating_point() else None)
    return {k: move(v) for k, v in inputs.items()}


def _sync(device):
    if device.type == "tpu":
        torch.tpu.synchronize()


def _train(spec: ModelSpec, base: torch.nn.Module, cpu_inputs: dict, device: str, mode: str,
           timed_steps: int, dtype=None) -> _Run:
    device = torch.device(device)
    model = copy.deepcopy(base).to(device, dtype=dtype)
    model.train()
    inputs = _to(cpu_inputs, device, dtype)
    forward = torch.compile(model, backend="tpu") if mode == "compiled" else model
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, grads = [], {}

    def step():
        loss = spec.loss(forward, inputs)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i in range(STEPS):
        loss = spec.loss(forward, inputs)
        loss.backward()
        if i == 0:
            grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters() if p.grad is not None}
        losses.append(loss.detach().cpu())
        opt.step()
        opt.zero_grad(set_to_none=True)
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}  # not views of the live state
    for _ in range(WARMUP_STEPS if timed_steps else 0):
        step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(timed_steps):
        step()
    _sync(device)
    ms = (time.perf_counter() - start) * 1e3 / max(timed_steps, 1)
    return _Run(losses, grads, state, ms)


def _error(got: torch.Tensor, cpu: torch.Tensor, truth: torch.Tensor, floor: float) -> float:
    """||got - truth|| over CPU_ERROR_FACTOR * ||cpu - truth|| + floor, in the 2-norm (> 1: out of
    tolerance). A wrong op moves the whole tensor; the norm forgives an element whose rounding
    differs, as the CPU's own does."""
    if got.shape != cpu.shape or got.dtype != cpu.dtype:
        return float("inf")
    if not cpu.is_floating_point():
        return 0.0 if torch.equal(got, cpu) else float("inf")
    if torch.isnan(got).any() != torch.isnan(cpu).any():
        return float("inf")
    bound = CPU_ERROR_FACTOR * (cpu.double() - truth).norm().item() + floor + 1e-30
    return (got.double() - truth).norm().item() / bound


def _worst(got: dict, cpu: dict, truth: dict, floor):
    """(name, error) of the entry furthest out of tolerance (see _error), or None if all are in it.
    `floor(name, truth_tensor)` gives each entry's tolerance floor."""
    if got.keys() != cpu.keys():
        return (f"names differ: {sorted(got.keys() ^ cpu.keys())[:4]}", float("inf"))
    errors = [(name, _error(got[name], cpu[name], truth[name].double(), floor(name, truth[name].double())))
              for name in cpu]
    worst = max(errors, key=lambda e: e[1], default=None)
    return worst if worst is not None and worst[1] > 1 else None


def _flat(state: dict) -> torch.Tensor:
    return torch.cat([v.double().flatten() for v in state.values() if v.is_floating_point()])


def _compare(tpu: _Run, cpu: _Run, truth: _Run, init: dict) -> str:
    """A mismatch's description, or "" if the tpu run is as close to the float64 run as it should be.

    Step 1 (same weights on both devices: only the ops' rounding differs) is checked per tensor: the
    loss and every gradient. Later steps start from weights that already differ by rounding, and
    training amplifies it: a ReLU whose input is zero up to rounding passes a gradient or not, and
    AdamW's first update has size lr whatever the gradient's, so a gradient that is zero up to
    rounding moves its weight by +-lr. They are checked in aggregate: the losses of steps 2 and 3
    to LATER_RTOL, and all parameters and buffers after step 3 as one vector, whose distance from the
    float64 run's may be UPDATE_RTOL of the distance the three steps moved it (integer buffers, such
    as batch norm's num_batches_tracked, exactly)."""
    loss = lambda r, i: {f"loss of step {i + 1}": r.losses[i]}  # noqa: E731
    checks = [("", loss(tpu, 0), loss(cpu, 0), loss(truth, 0), lambda n, t: RTOL * t.norm().item()),
              ("gradient ", tpu.grads, cpu.grads, truth.grads, lambda n, t: RTOL * t.norm().item())]
    for i in range(1, len(truth.losses)):
        checks.append(("", loss(tpu, i), loss(cpu, i), loss(truth, i),
                       lambda n, t: LATER_RTOL * t.norm().item()))
    ints = lambda r: {k: v for k, v in r.state.items() if not v.is_floating_point()}  # noqa: E731
    moved = (_flat(truth.state) - _flat(init)).norm().item()
    checks += [("", ints(tpu), ints(cpu), ints(truth), lambda n, t: 0.0),
               ("", {"weights after 3 steps": _flat(tpu.state)}, {"weights after 3 steps": _flat(cpu.state)},
                {"weights after 3 steps": _flat(truth.state)}, lambda n, t: UPDATE_RTOL * moved)]
    for what, got, want, exact, floor in checks:
        worst = _worst(got, want, exact, floor)
        if worst is not None:
            return f"{what}{worst[0]}: {worst[1]:.3g}x the tolerance"
    return ""


def cpu_reference(spec: ModelSpec, timed_steps: int):
    """(base model, inputs, CPU float32 run, CPU float64 run): the weights and inputs every mode
    starts from, seeded, and the two CPU runs a tpu run is compared with."""
    torch.manual_seed(0)
    base = spec.build()
    inputs = spec.inputs(torch.Generator().manual_seed(0))
    cpu = _train(spec, base, inputs, "cpu", "eager", timed_steps)
    try:
        truth = _train(spec, base, inputs, "cpu", "eager", 0, dtype=torch.float64)
    except RuntimeError:
        # Some CPU kernels have no float64 (grouped_mm: float32, bfloat16, float16 only). The CPU
        # float32 run is then the reference, and the floors alone are the tolerance.
        truth = cpu
    return base, inputs, cpu, truth


def run(spec: ModelSpec, mode: str, reference, timed_steps: int = 3) -> Result:
    """Trains `spec` on tpu in `mode` and compares with `reference` (from cpu_reference)."""
    base, inputs, cpu, truth = reference
    metrics.reset()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        with torch_tpu.eager_mode("fused" if mode == "fused" else "strict"):
            tpu = _train(spec, base, inputs, "tpu", mode, timed_steps)
    except Exception as e:  # the row records it; the table goes on
        where = traceback.extract_tb(e.__traceback__)[-1]
        return Result(spec.name, mode, "error", f"{type(e).__name__}: {str(e).splitlines()[0][:160]} "
                      f"({where.filename.rsplit('/', 1)[-1]}:{where.lineno})", cpu_ms=cpu.ms)
    mismatch = _compare(tpu, cpu, truth, base.state_dict())
    fallbacks = metrics.fallback_counts()
    notes = []
    if mode == "compiled":
        breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
        counts = metrics.counters()
        notes.append(f"{counts['compiled_graphs']} graphs, {breaks} graph breaks")
        if counts["graph_eager_fallbacks"]:
            fallbacks["graphs run eagerly (lowering failed)"] = counts["graph_eager_fallbacks"]
    if mismatch:
        status, notes = "mismatch", [mismatch] + notes
    elif fallbacks:
        status = "fallback"
        notes = ["fell back: " + ", ".join(sorted(fallbacks))] + notes
    else:
        status = "pass"
    return Result(spec.name, mode, status, "; ".join(notes), tpu.ms, cpu.ms)


def _generate_ms(model, ids, kwargs, new_tokens):
    """(tokens, ms per token) of a greedy generate() after one untimed warm-up call."""
    model.generate(ids, **kwargs)
    start = time.perf_counter()
    out = model.generate(ids, **kwargs).cpu()
    return out, (time.perf_counter() - start) * 1e3 / new_tokens


def generate(spec: ModelSpec, base: torch.nn.Module, inputs: dict, compiled: bool,
             new_tokens: int = 8) -> Result:
    """Greedy Hugging Face `generate()` on tpu against the CPU's tokens: eager with the default
    dynamic KV cache, or (compiled) with a static cache, whose forward transformers compiles with
    torch.compile (here with backend "tpu", through its CompileConfig)."""
    mode = "generate, static cache, compiled" if compiled else "generate, KV cache, eager"
    ids = inputs["input_ids"][:1, :8]
    kwargs = dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    want, cpu_ms = _generate_ms(copy.deepcopy(base).eval(), ids, kwargs, new_tokens)
    metrics.reset()
    torch._dynamo.reset()
    try:
        model = copy.deepcopy(base).to("tpu").eval()
        if compiled:
            from transformers import CompileConfig
            kwargs.update(cache_implementation="static", compile_config=CompileConfig(backend="tpu"))
        got, ms = _generate_ms(model, ids.to("tpu"), kwargs, new_tokens)
    except Exception as e:  # the row records it; the table goes on
        return Result(spec.name, mode, "error", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}",
                      cpu_ms=cpu_ms)
    notes = [f"{metrics.counters()['compiled_graphs']} graphs"] if compiled else []
    fallbacks = metrics.fallback_counts()
    if not torch.equal(got, want):
        status, notes = "mismatch", [f"tokens {got.tolist()} against {want.tolist()}"]
    elif fallbacks:
        status, notes = "fallback", ["fell back: " + ", ".join(sorted(fallbacks))] + notes
    else:
        status = "pass"
    return Result(spec.name, mode, status, "; ".join(notes), ms, cpu_ms)
