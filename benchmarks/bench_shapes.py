"""Shapes that change (issue 49): what a new length costs, side by side in one run.

    python benchmarks/bench_shapes.py [--only classify|generate] [--modes cpu,inductor,strict,fused,compiled]

Two Hugging Face workloads (small random-init configs, nothing downloaded):
- classify: BertForSequenceClassification (2 layers, hidden 64) trained with AdamW on batches of 8
  padded to their longest row, as DataCollatorWithPadding does (an attention mask marks the padding):
  12 batches of 12 different lengths (17..66);
- generate: GPT2LMHeadModel (2 layers, hidden 64) greedy generate() of 8 new tokens after prompts of
  8 different lengths (5..33).
Each runs over its lengths twice (first pass: every length new; second pass: every length seen) in
each mode, every mode in its own process with an empty executable cache (TORCH_TPU_CACHE_DIR in a
fresh temporary directory), so the first pass pays every compile:
  cpu       eager on CPU (the reference: ratios are against its time)
  inductor  torch.compile(backend="inductor") on CPU, PyTorch's default dynamic=None
  strict    strict eager on tpu (the default mode): new programs compile on the compile pool's threads
            (TORCH_TPU_COMPILE_THREADS, one per core) while ops go on queuing
  serial    strict eager with TORCH_TPU_COMPILE_THREADS=0: every compile on the dispatching thread
  fused     fused eager on tpu (TORCH_TPU_DEFER_AND_FUSE=1)
  compiled  torch.compile(backend="tpu") on tpu, default dynamic=None: one program per shape bucket
            (TORCH_TPU_SHAPE_BUCKETS, default powers of two >= 16)
Printed per mode: first pass and second pass in seconds and as a ratio to CPU eager; programs
compiled in the first pass per new length and in the second pass (tpu; for compiled mode, how many of
them are compiled graphs: the others are eager ops outside the graphs, e.g. generate()'s); peak tpu memory (padding to a
bucket costs memory: compare compiled with strict); the largest difference of the losses (classify)
or whether the tokens equal CPU's (generate). On a machine without a TPU, "tpu" is OpenXLA's CPU plugin.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

CLASSIFY_LENGTHS = [17, 24, 31, 38, 45, 52, 59, 66, 21, 35, 49, 63]
PROMPT_LENGTHS = [5, 9, 13, 17, 21, 25, 29, 33]
MODES = ["cpu", "inductor", "strict", "serial", "fused", "compiled"]
TPU_MODES = ("strict", "serial", "fused", "compiled")
VOCAB = 1000


def _classify(mode, dev, torch, transformers):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=128, num_labels=3,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.BertForSequenceClassification(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss_fn(ids, mask, labels):
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss
    if mode in ("inductor", "compiled"):
        loss_fn = torch.compile(loss_fn, backend="inductor" if mode == "inductor" else "tpu")
    g = torch.Generator().manual_seed(1)
    batches = []
    for n in CLASSIFY_LENGTHS:  # rows of random lengths, padded to the longest (n)
        rows = torch.randint(n // 2, n + 1, (8,), generator=g)
        rows[0] = n
        mask = (torch.arange(n)[None, :] < rows[:, None]).long()
        ids = torch.randint(1, VOCAB, (8, n), generator=g) * mask
        batches.append((ids, mask, torch.randint(0, 3, (8,), generator=g)))
    losses = []

    def step(ids, mask, labels):
        loss = loss_fn(ids.to(dev), mask.to(dev), labels.to(dev))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return [lambda b=b: step(*b) for b in batches], losses


def _generate(mode, dev, torch, transformers):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg).eval().to(dev)
    if mode in ("inductor", "compiled"):
        model.forward = torch.compile(model.forward, backend="inductor" if mode == "inductor" else "tpu")
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (1, n), generator=g) for n in PROMPT_LENGTHS]
    tokens = []

    def one(ids):
        with torch.no_grad():
            out = model.generate(ids.to(dev), max_new_tokens=8, do_sample=False, pad_token_id=0)
        tokens.append(out.cpu()[0].tolist())
    return [lambda p=p: one(p) for p in prompts], tokens


def child(workload: str, mode: str) -> dict:
    warnings.filterwarnings("ignore")
    import torch
    import transformers
    tpu = mode in TPU_MODES
    if tpu:
        import torch_tpu
    dev = torch.device("tpu" if tpu else "cpu")
    steps, results = (_classify if workload == "classify" else _generate)(mode, dev, torch, transformers)

    def counts():
        c = torch_tpu.metrics.counters() if tpu else {}
        return c.get("program_cache_misses", 0), c.get("compiled_graphs", 0)
    out = {}
    for p in ("first", "second"):
        (m0, g0), t0 = counts(), time.perf_counter()
        for s in steps:
            s()
        out[p] = time.perf_counter() - t0
        m1, g1 = counts()
        out[p + "_programs"], out[p + "_graphs"] = m1 - m0, g1 - g0
    out["results"] = results[:len(steps)]  # the first pass's (the second continues training)
    if tpu:
        out["peak_bytes"] = torch.tpu.max_memory_allocated()
        c = torch_tpu.metrics.counters()
        out["bucket_input_copies"] = c["bucket_input_copies"]
        out["bucket_input_uploads"] = c["bucket_input_uploads"]
        out["refusals"] = torch_tpu.metrics.bucket_refusals()
    return out


def run_mode(workload: str, mode: str) -> dict | None:
    env = dict(os.environ, TORCH_TPU_RECOMPILE_WARN="0", PYTHONWARNINGS="ignore")
    if mode == "fused":
        env["TORCH_TPU_DEFER_AND_FUSE"] = "1"
    elif mode == "serial":
        env["TORCH_TPU_COMPILE_THREADS"] = "0"
    with tempfile.TemporaryDirectory() as cache:
        env["TORCH_TPU_CACHE_DIR"] = cache
        r = subprocess.run([sys.executable, __file__, "--child", workload, mode], env=env, capture_output=True,
                           text=True, timeout=3000)
    if r.returncode != 0:
        print(f"  {mode}: failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def report(workload: str, modes: list[str]) -> None:
    n = len(CLASSIFY_LENGTHS if workload == "classify" else PROMPT_LENGTHS)
    what = "training steps" if workload == "classify" else "generate() calls"
    print(f"\n{workload}: {n} {what}, each at a new length (first pass), then again (second pass)")
    got = {m: run_mode(workload, m) for m in modes}
    ref = got.get("cpu")
    print(f"  {'mode':9} {'first s':>8} {'/cpu':>7} {'second s':>9} {'/cpu':>6} {'programs/new length':>20} "
          f"{'2nd-pass programs':>18} {'peak tpu MiB':>13}  vs CPU")
    for m, r in got.items():
        if r is None:
            continue
        r1 = f"{r['first'] / ref['first']:.2f}x" if ref else "-"
        r2 = f"{r['second'] / ref['second']:.2f}x" if ref else "-"
        tpu = m in TPU_MODES
        per = f"{r['first_programs'] / n:.1f}" if tpu else "-"
        second = str(r["second_programs"]) if tpu else "-"
        peak = f"{r['peak_bytes'] / 2**20:.2f}" if tpu else "-"
        if ref is None:
            vs = "-"
        elif workload == "classify":
            vs = f"max |loss diff| {max(abs(a - b) for a, b in zip(r['results'], ref['results'])):.1e}"
        else:
            vs = "tokens equal" if r["results"] == ref["results"] else "TOKENS DIFFER"
        print(f"  {m:9} {r['first']:8.2f} {r1:>7} {r['second']:9.3f} {r2:>6} {per:>20} {second:>18} {peak:>13}  {vs}")
        if m == "compiled":
            print(f"            of which compiled graphs: {r['first_graphs']} in the first pass, {r['second_graphs']} in "
                  "the second (the rest: eager ops outside the graphs)")
            print(f"            inputs given a bucket-sized buffer: {r['bucket_input_uploads']} uploaded again from "
                  f"their kept host bytes, {r['bucket_input_copies']} copied on the device")
            if r.get("refusals"):
                print(f"            per-shape graphs: {r['refusals']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["classify", "generate"])
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(*a.child)))
        return
    for w in ([a.only] if a.only else ["classify", "generate"]):
        report(w, a.modes.split(","))


if __name__ == "__main__":
    main()
