"""The model-zoo table: `python -m tests.models.report [--models gpt2,resnet18] [--modes strict,compiled]`.

For each zoo model (tests/models/zoo.py) and each mode, one row: the status (pass / fallback /
mismatch / error, see runner.py), the time per training step (forward, backward, AdamW) on tpu and
on the CPU (PyTorch's CPU eager, the reference, on the same cores), their ratio, and what the row
found (the ops that fell back to the CPU, graph breaks, the worst mismatch, the error). Causal LMs
add two rows for Hugging Face `generate()`: eager with the dynamic KV cache, and a static cache
under torch.compile(backend="tpu"); their times are per generated token.

The table prints as Markdown, row by row. The exit status is 1 if any row is a mismatch or an
error. Executables are cached on disk (TORCH_TPU_CACHE_DIR), so a second run compiles nothing.
"""
import argparse
import sys
import time
import warnings

import torch

from . import runner, zoo


def _ratio(r):
    return r.tpu_ms / r.cpu_ms if r.cpu_ms == r.cpu_ms and r.cpu_ms > 0 else float("nan")


def _row(r) -> str:
    return (f"| {r.model} | {r.mode} | {r.status} | {r.tpu_ms:.1f} | {r.cpu_ms:.1f} | {_ratio(r):.2f} "
            f"| {r.detail.replace('|', '/')} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(m.name for m in zoo.MODELS),
                        help="comma-separated zoo names (default: all): " + ", ".join(zoo.BY_NAME))
    parser.add_argument("--modes", default=",".join(runner.MODES), help="comma-separated, of "
                        + ", ".join(runner.MODES))
    parser.add_argument("--timed-steps", type=int, default=5, help="training steps timed per row")
    parser.add_argument("--no-generate", action="store_true", help="skip the generate() rows")
    args = parser.parse_args(argv)
    names, modes = args.models.split(","), args.modes.split(",")
    unknown = [n for n in names if n not in zoo.BY_NAME] + [m for m in modes if m not in runner.MODES]
    if unknown:
        parser.error(f"unknown model or mode {unknown}; models: {', '.join(zoo.BY_NAME)}; "
                     f"modes: {', '.join(runner.MODES)}")

    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads; times in ms per training "
          "step (generate: per token)\n")
    print("| model | mode | status | tpu ms | CPU ms | tpu/CPU | notes |")
    print("|---|---|---|---|---|---|---|", flush=True)
    results = []
    start = time.perf_counter()
    for name in names:
        spec = zoo.BY_NAME[name]
        try:
            reference = runner.cpu_reference(spec, args.timed_steps)
        except Exception as e:  # the model itself fails on the CPU: nothing to compare with
            results.append(runner.Result(name, "CPU reference", "error", f"{type(e).__name__}: {e}"))
            print(_row(results[-1]), flush=True)
            continue
        for mode in modes:
            results.append(runner.run(spec, mode, reference, args.timed_steps))
            print(_row(results[-1]), flush=True)
        if spec.generate and not args.no_generate:
            base, inputs = reference[0], reference[1]
            for compiled in (False, True):
                results.append(runner.generate(spec, base, inputs, compiled))
                print(_row(results[-1]), flush=True)
    counts = {s: sum(r.status == s for r in results) for s in ("pass", "fallback", "mismatch", "error")}
    print(f"\n{len(results)} rows in {time.perf_counter() - start:.0f} s: "
          + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 1 if counts["mismatch"] or counts["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
