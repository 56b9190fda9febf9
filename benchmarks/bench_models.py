"""Hugging Face Llama, Gemma, Qwen2 and GPT-2 architectures on tpu against CPU, side by side (ratios), in the
shape of Google's TorchTPU model benchmarks: forward, training step and decode, in each eager mode and
compiled.

    python benchmarks/bench_models.py [--models llama,gemma,qwen2,gpt2] [--workloads forward,train,decode]
                                      [--modes cpu,inductor,strict,fused,compiled] [--steps 8]

Models are random-init configs sized for 2 cores (hidden 128, 2 layers, 4 heads, vocab 512; GPT-2's
MLP is 4x wide, the others' 2x; batch 4 x
64 tokens; decode: batch 1, an 8-token prompt, 16 new tokens, greedy, static cache). Workloads:
- forward: logits under no_grad, ending with a host read of one logit;
- train: AdamW step on the causal LM loss (zero_grad, forward, backward, step; loss.item());
  compiled: the step function under torch.compile;
- decode: model.generate(); reported per new token. Compiled: transformers' own compile of the decode
  step (with a static cache it compiles the model's forward with backend "tpu" on tpu, or the backend
  of its CompileConfig: "inductor" on CPU); eager modes set generation_config.disable_compile.
Modes: cpu (eager, the reference), inductor (torch.compile on CPU; skipped where Inductor cannot
build), strict / fused (tpu eager), compiled (torch.compile(backend="tpu")). Per mode: the first
step's seconds (compiles included), the median post-warm-up step in ms, the warm-up overhead (first
step less a steady one) and, on tpu, the peak device memory (torch.tpu.max_memory_allocated). Ratios
are step time over CPU eager's. jax.jit references exist for the MLP and GPT-block steps only (see
bench_compile.py), not for these models. On a machine without a TPU, "tpu" is OpenXLA's CPU plugin.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

warnings.filterwarnings("ignore")
import torch_tpu  # noqa: E402
import transformers  # noqa: E402

transformers.logging.set_verbosity_error()

BATCH, SEQ, PROMPT, NEW_TOKENS = 4, 64, 8, 16


def config(name: str):
    common = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    if name == "llama":
        return transformers.LlamaConfig(**common)
    if name == "gemma":
        return transformers.GemmaConfig(**dict(common, num_key_value_heads=1, head_dim=32))
    if name == "qwen2":
        return transformers.Qwen2Config(**common)
    if name == "gpt2":
        return transformers.GPT2Config(vocab_size=512, n_embd=128, n_layer=2, n_head=4, n_positions=256)
    raise ValueError(f"unknown model {name!r}: llama, gemma, qwen2 or gpt2")


def _sync(dev: torch.device) -> None:
    if dev.type == "tpu":
        torch.tpu.synchronize()


def make_step(name: str, workload: str, mode: str):
    """(device, step function) for one measurement; every step ends with a host read."""
    dev = torch.device("cpu" if mode in ("cpu", "inductor") else "tpu")
    torch_tpu.set_eager_mode(mode if mode in ("strict", "fused") else "strict")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config(name)).to(dev)
    g = torch.Generator().manual_seed(1)
    compiled = mode in ("inductor", "compiled")
    backend = "inductor" if mode == "inductor" else "tpu"
    if workload == "forward":
        ids = torch.randint(0, 512, (BATCH, SEQ), generator=g).to(dev)
        model.eval()
        fwd = torch.compile(model, backend=backend) if compiled else model

        def step():
            with torch.no_grad():
                return fwd(input_ids=ids).logits[0, 0, 0].item()
        return dev, step
    if workload == "train":
        ids = torch.randint(0, 512, (BATCH, SEQ), generator=g).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def train():
            opt.zero_grad()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            return loss.detach()
        run = torch.compile(train, backend=backend) if compiled else train
        return dev, lambda: run().item()
    if workload == "decode":
        ids = torch.randint(0, 512, (1, PROMPT), generator=g).to(dev)
        model.eval()
        gc = model.generation_config
        gc.disable_compile = not compiled
        if mode == "inductor":
            gc.compile_config = transformers.CompileConfig(backend="inductor", mode="default", dynamic=False)
            gc.compile_config._compile_all_devices = True  # transformers compiles on accelerators only otherwise

        def step():
            out = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                 cache_implementation="static", pad_token_id=0)
            return out[0, -1].item()
        return dev, step
    raise ValueError(f"unknown workload {workload!r}: forward, train or decode")


def measure(name: str, workload: str, mode: str, steps: int) -> dict:
    torch._dynamo.reset()
    dev, step = make_step(name, workload, mode)
    if dev.type == "tpu":
        torch.tpu.reset_peak_memory_stats()
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    step()  # a second warm-up: Dynamo recompiles once where a first call's state differs
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        _sync(dev)
        times.append(time.perf_counter() - t0)
    per = NEW_TOKENS if workload == "decode" else 1
    steady = statistics.median(times) / per
    torch_tpu.set_eager_mode("strict")
    return dict(first=first, steady=steady, warmup=first - steady * per,
                peak=torch.tpu.max_memory_allocated() if dev.type == "tpu" else None)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="llama,gemma,qwen2,gpt2")
    p.add_argument("--workloads", default="forward,train,decode")
    p.add_argument("--modes", default="cpu,inductor,strict,fused,compiled")
    p.add_argument("--steps", type=int, default=8)
    a = p.parse_args(argv)
    modes = a.modes.split(",")
    print(f"platform: {torch_tpu.runtime.platform()}; torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"{'model':6s} {'workload':8s} {'mode':9s} {'first s':>8s} {'step ms':>9s} {'warm-up s':>9s} "
          f"{'peak MiB':>9s} {'/ cpu':>7s}")
    for name in a.models.split(","):
        for workload in a.workloads.split(","):
            ref = None
            for mode in modes:
                try:
                    r = measure(name, workload, mode, a.steps)
                except Exception as e:  # noqa: BLE001  (Inductor without a C++ compiler, ...: say so, go on)
                    print(f"{name:6s} {workload:8s} {mode:9s} skipped: {type(e).__name__}: {str(e).splitlines()[0][:90]}")
                    continue
                if mode == "cpu":
                    ref = r["steady"]
                unit = "ms/token" if workload == "decode" else "ms"
                peak = f"{r['peak'] / 2**20:9.1f}" if r["peak"] is not None else f"{'-':>9s}"
                ratio = f"{r['steady'] / ref:6.2f}x" if ref else f"{'-':>7s}"
                print(f"{name:6s} {workload:8s} {mode:9s} {r['first']:8.2f} {r['steady'] * 1e3:9.2f} {r['warmup']:9.2f} "
                      f"{peak} {ratio}  ({unit})", flush=True)


if __name__ == "__main__":
    main()
