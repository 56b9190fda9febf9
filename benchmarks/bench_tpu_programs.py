"""Program quality on TPU: the same steps written in PyTorch (ours) and in JAX, compiled for a TPU
topology by libtpu on this machine (no TPU needed), compared by libtpu's own figures.

    python benchmarks/bench_tpu_programs.py [--topology v5e:1x1] [--precision highest] [--backward both] [--gpt2]

Ours: torch_tpu.aot.compile of the step (every graph torch.compile(backend="tpu") gives: forward,
backward, optimizer step), summed over its programs. Each training step is compiled twice
(--backward): as Dynamo does by default (the backward a graph of its own), and with
torch._dynamo.config.trace_autograd_ops (loss.backward() traced: one forward-backward program and
the optimizer's). JAX: benchmarks/jax_reference.py's jax.jit of the
same step (value_and_grad and the same AdamW update, parameters and moments donated), lowered for TPU
and compiled by the same libtpu with the same options. Printed per step: flops, bytes accessed,
temporaries, peak memory (ours: the busiest program plus what is alive across programs; JAX: its one
program's peak) and libtpu's time estimate where its cost model has one, and ours/JAX for each.
Cases: the MLP step (Linear 256-512-512-10, batch 64), the GPT-style decoder block's forward and
training step (examples/tiny_models.py's TinyGPT, 64 wide, 16 x 32 tokens), the digits CNN's training
step (examples/train_digits.py); and ours against ours, the GPT block's step with its length
bucketed against static (--case bucketed: what a bucketed program's relayouts cost). --gpt2: also
times aot.compile of a GPT-2-small training step (124M parameters, batch 8 x 1024, AdamW) built on
the meta device, and prints its report.

Both sides compute float32 matmuls at the same precision, --precision (PyTorch's name): `highest`
(PyTorch's default; HIGHEST, full float32), `high` (HIGH, bfloat16 three-pass) or `medium` (DEFAULT,
one bfloat16 pass: JAX's own default on TPU), set with torch.set_float32_matmul_precision and
jax_default_matmul_precision. Left to their defaults the two would differ (JAX's DEFAULT keeps
attention's intermediates in bfloat16, about 25% fewer bytes for the GPT block).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore")
import torch_tpu  # noqa: E402,F401
from torch_tpu import aot  # noqa: E402
import jax_reference as jr  # noqa: E402
from tiny_models import TinyGPT  # noqa: E402
from train_digits import DigitsCNN  # noqa: E402


# Whether Dynamo traces loss.backward() (torch._dynamo.config.trace_autograd_ops, README's
# "torch.compile"): "traced" gives two programs per step (forward+backward, and the optimizer's, as
# PyTorch breaks the graph around opt.step on purpose); "default" (Dynamo's default) three or more
# (forward, backward run by the autograd engine, optimizer).
BACKWARD = "default"


def _train(model, loss_of):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(*inputs):
        opt.zero_grad()
        loss = loss_of(model, *inputs)
        loss.backward()
        loss = loss.detach()  # what crosses opt.step()'s graph break must not need grad
        opt.step()
        return loss
    return step


def mlp_case():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    jax_text = jr.mlp_runner(model, x, y, program=True)  # before the model moves to meta
    ours = _train(model.to("meta"), lambda m, x, y: F.cross_entropy(m(x), y))
    return (ours, (x.to("meta"), y.to("meta"))), jax_text


def _gpt():
    torch.manual_seed(0)
    model = TinyGPT(vocab=256, dim=64, ctx=32)
    g = torch.Generator().manual_seed(0)
    idx, tgt = torch.randint(0, 256, (16, 32), generator=g), torch.randint(0, 256, (16 * 32,), generator=g)
    return model, idx, tgt


def gpt_step_case():
    model, idx, tgt = _gpt()
    jax_text = jr.gpt_runner(model, idx, tgt, program=True)
    ours = _train(model.to("meta"), lambda m, i, t: F.cross_entropy(m(i).flatten(0, 1), t))
    return (ours, (idx.to("meta"), tgt.to("meta"))), jax_text


def gpt_forward_case():
    import jax
    model, idx, _ = _gpt()
    P = jr._params(model)
    # TinyGPT's forward in JAX: jax_reference's, taken from its training step's loss (logits only).
    fwd = jr.gpt_forward(4)
    text = jax.jit(fwd).trace(P, jax.numpy.asarray(idx.numpy())).lower(lowering_platforms=("tpu",)).as_text()
    meta = model.to("meta")

    @torch.no_grad()
    def forward(i):
        return meta(i)
    return (forward, (idx.to("meta"),)), text


def digits_case():
    torch.manual_seed(0)
    model = DigitsCNN()
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(64, 1, 8, 8, generator=g), torch.randint(0, 10, (64,), generator=g)
    jax_text = jr.digits_runner(model, x, y, program=True)
    ours = _train(model.to("meta"), lambda m, x, y: F.cross_entropy(m(x), y))
    return (ours, (x.to("meta"), y.to("meta"))), jax_text


def _ratio(a, b):
    return "n/a" if not b else f"{a / b:.2f}x"


def compare(name, case, topo):
    (fn, args), jax_text = case()
    torch._dynamo.reset()  # the config is not among Dynamo's guards: the same step's code recompiles
    torch._dynamo.config.trace_autograd_ops = BACKWARD == "traced"
    report = aot.compile(fn, *args, topology=topo)
    if not report.ok:
        print(report)
        return
    j = topo.compile(jax_text)
    jc = j["cost"]
    j_peak = max(j["peak_bytes"], j["argument_bytes"] + j["output_bytes"] - j["alias_bytes"] + j["temp_bytes"])
    j_est = jc.get("optimal_seconds", -1)
    ours_est = report.estimated_seconds
    rows = [("flops", report.flops, jc.get("flops", 0)),
            ("bytes accessed", report.bytes_accessed, jc.get("bytes accessed", 0)),
            ("temp bytes", sum(p.temp_bytes for p in report.programs), j["temp_bytes"]),
            ("peak bytes", report.peak_bytes, j_peak)]
    form = f", backward {'traced (trace_autograd_ops)' if BACKWARD == 'traced' else 'not traced'}" \
        if "step" in name else ""
    print(f"\n{name}: ours {len(report.programs)} program(s){form}, JAX 1")
    print(f"  {'':16}{'ours':>14}{'JAX':>14}{'ours/JAX':>10}")
    for label, o, x in rows:
        print(f"  {label:16}{o:14.4g}{x:14.4g}{_ratio(o, x):>10}")
    if ours_est is not None and j_est >= 0:
        print(f"  {'est. seconds':16}{ours_est:14.4g}{j_est:14.4g}{_ratio(ours_est, j_est):>10}")
    else:
        print(f"  est. seconds: unknown (libtpu's cost model cannot time a program of "
              f"{'ours' if ours_est is None else 'JAX'})")


def bucketed(topo):
    """The GPT block's training step at length 64, static against bucketed (the length marked dynamic
    over 33..64: one bucket, 64), ours against ours: what a bucketed program's relayouts cost
    (dynamo/relayout.py), per program."""
    torch.manual_seed(0)
    step = _train(TinyGPT(vocab=256, dim=64, ctx=64).to("meta"), lambda m, i, t: F.cross_entropy(m(i).flatten(0, 1), t.flatten()))
    got = {}
    for marked in (False, True):
        torch._dynamo.reset()
        torch._dynamo.config.trace_autograd_ops = False
        idx, tgt = torch.randint(0, 256, (16, 64), device="meta"), torch.randint(0, 256, (16, 64), device="meta")
        if marked:
            for t in (idx, tgt):
                torch._dynamo.mark_dynamic(t, 1, min=33, max=64)
        report = aot.compile(step, idx, tgt, topology=topo)
        if not report.ok:
            print(report)
            return
        got[marked] = [p for p in report.programs if p.flops]
    print("\nGPT block training step, length 64: bucketed (<= 64) / static, per program")
    print(f"  {'program':24}{'bytes':>10}{'temp':>10}{'peak':>10}")
    for s, d in zip(got[False], got[True]):
        print(f"  {s.name:24}{_ratio(d.bytes_accessed, s.bytes_accessed):>10}"
              f"{_ratio(d.temp_bytes, s.temp_bytes):>10}{_ratio(d.peak_bytes, s.peak_bytes):>10}")


def gpt2_small(topo):
    from transformers import GPT2Config, GPT2LMHeadModel
    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config())
    n = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, 50257, (8, 1024), device="meta")
    step = _train(model, lambda m, i: m(input_ids=i, labels=i).loss)
    t0 = time.perf_counter()
    report = aot.compile(step, ids, topology=topo)
    print(f"\nGPT-2 small ({n / 1e6:.0f}M parameters), batch 8 x 1024, AdamW: aot.compile took "
          f"{time.perf_counter() - t0:.1f} s")
    print(report)


CASES = {"mlp": ("MLP training step", mlp_case), "gpt_forward": ("GPT block forward", gpt_forward_case),
         "gpt_step": ("GPT block training step", gpt_step_case), "digits": ("digits CNN training step", digits_case)}


# PyTorch's float32 matmul precision -> JAX's name of the same StableHLO precision.
_JAX_PRECISION = {"highest": "highest", "high": "high", "medium": "default"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--topology", default="v5e:1x1")
    ap.add_argument("--gpt2", action="store_true")
    ap.add_argument("--precision", choices=sorted(_JAX_PRECISION), default="highest",
                    help="float32 matmul precision of both sides (PyTorch's names)")
    ap.add_argument("--case", choices=[*CASES, "gpt2", "bucketed"], help="run only this case")
    ap.add_argument("--backward", choices=["default", "traced", "both"], default="both",
                    help="whether Dynamo traces loss.backward() (BACKWARD); both: each step case twice")
    a = ap.parse_args()
    torch.set_float32_matmul_precision(a.precision)
    import jax
    jax.config.update("jax_default_matmul_precision", _JAX_PRECISION[a.precision])
    topo = aot.topology(a.topology)
    global BACKWARD
    forms = ["default", "traced"] if a.backward == "both" else [a.backward]
    if a.case == "gpt2":
        for BACKWARD in forms:
            gpt2_small(topo)
        return
    print(f"programs compiled by libtpu for {topo!r}, float32 matmuls at {a.precision!r} on both sides")
    if a.case == "bucketed":
        bucketed(topo)
        return
    # In this process: libtpu compiles in aot's worker processes, so a libtpu crash fails one program
    # (reported in its case's table), not the run.
    for key, case in CASES.items():
        if a.case and key != a.case:
            continue
        for BACKWARD in forms if "step" in case[0] else forms[:1]:
            compare(*case, topo)
    if not a.case:
        bucketed(topo)
    if a.gpt2:
        for BACKWARD in forms:
            gpt2_small(topo)


if __name__ == "__main__":
    main()
