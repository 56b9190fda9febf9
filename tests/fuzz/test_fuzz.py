"""Differential fuzzing of tpu against CPU in CI: fixed seeds, a fixed budget per eager mode and for
torch.compile (tests/fuzz/programs.py; `python -m tests.fuzz --programs 10000` runs thousands), and
the programs whose differences were found and fixed, kept as regression tests."""
import pytest
import torch

import torch_tpu
from . import reuse
from .programs import KNOWN, KNOWN_COMPILED, compare, generate, run

# Programs that once differed, and what they found (all fixed):
FOUND = {
    1: "hypot of uint8: CPU's NotImplementedError (the CPU dtype probe)",
    19: "argmax of an empty tensor: CPU's IndexError",
    28: "round of complex: CPU's NotImplementedError",
    67: "bitwise_and of floats: CPU's NotImplementedError, not a compile error",
    84: "softmax of int8: CPU's NotImplementedError",
    102: "relu of bool: CPU's RuntimeError",
    114: "softmax of an empty uint8 tensor: an empty result (it failed to compile)",
    227: "frac of bool: CPU's NotImplementedError over the meta kernel's RuntimeError",
    312: "max(dim) of complex: CPU's RuntimeError (a TypeError inside the lowering)",
    404: "cat of a 0-dim tensor: CPU's RuntimeError (an internal IndexError)",
    448: "fmod of empty uint8 tensors: XLA's compiler died of SIGFPE",
    461: "max(dim) over a dim of size 0: CPU's IndexError",
    1129: "float16 - bool: CPU's RuntimeError",
    1530: "int16 ** int16 with exponents >= 64: XLA's integer power read 6 exponent bits",
    646: "sort of complex: CPU's RuntimeError",
    101145: "copy_ of an expanded view into itself: nothing to do, as on CPU (it was refused as an overlap)",
    1001518: "uint8 0 ** complex: CPU's special values (inf+nanj where Re(y) < 0; XLA's power gave nan+nanj)",
    1006210: "bfloat16 % a float32 0-dim tensor: the divisor rounded to bfloat16 first, as CPU does",
    1006303: "bfloat16 ** a float64 0-dim tensor: the exponent rounded to bfloat16 (-12.998 is -13) first",
    1007107: "-inf // 4 in float16: nan, CPU's floor division through fmod (it gave -inf)",
}


# Programs that once failed under torch.compile only (all fixed):
FOUND_COMPILED = {
    1000457: "fmod of complex: CPU's NotImplementedError before XLA sees it (its compiler died of SIGSEGV)",
}


def _check(seed, mode):
    prog = generate(seed)
    cpu = run(prog, "cpu")
    with torch_tpu.eager_mode("strict" if mode == "compiled" else mode):
        tpu = run(prog, "tpu", compiled=mode == "compiled")
    return compare(cpu, tpu, compiled=mode == "compiled")


@pytest.mark.parametrize("seed", sorted(FOUND))
def test_found_programs_match_cpu(seed):
    assert _check(seed, "strict") == [], f"{generate(seed)} ({FOUND[seed]})"


@pytest.mark.parametrize("seed", sorted(FOUND_COMPILED))
def test_found_compiled_programs_match_cpu(seed):
    torch._dynamo.reset()
    assert _check(seed, "compiled") == [], f"{generate(seed)} ({FOUND_COMPILED[seed]})"


@pytest.mark.parametrize("mode,first,count", [("strict", 10000, 240), ("fused", 20000, 120),
                                              ("compiled", 30000, 25)])
@pytest.mark.slow
def test_fuzz_budget(mode, first, count):
    torch._dynamo.reset()
    differ = {}
    for seed in range(first, first + count):
        diffs = _check(seed, mode)
        if diffs:
            differ[str(generate(seed))] = diffs
    assert not differ, "\n".join(f"{p}\n    " + "\n    ".join(d) for p, d in differ.items())


@pytest.mark.parametrize("mode,count", [("strict", 40), ("debug", 15), ("fused", 25), ("compiled", 12)])
@pytest.mark.slow
def test_reuse_budget(mode, count):
    """Operands updated in place (or through a view, out=, an optimizer step, a reallocation) and read
    again, at real layer sizes (tests/fuzz/reuse.py); with XLA:CPU's XNNPACK on, strict's budget finds
    stale products (issue 50)."""
    differ = {}
    for seed in range(count):
        prog = reuse.generate(seed)
        cpu = reuse.run(prog, "cpu")
        with torch_tpu.eager_mode("strict" if mode == "compiled" else mode):
            diffs = reuse.compare(cpu, reuse.run(prog, "tpu", compiled=mode == "compiled"))
        if diffs:
            differ[str(prog)] = diffs
    assert not differ, "\n".join(f"{p}\n    " + "\n    ".join(d) for p, d in differ.items())


def test_known_differences_say_why():
    assert all(why for _, _, why in KNOWN) and all(why for _, why in KNOWN_COMPILED)


def test_known_compile_refusals_are_pytorchs():
    """Each KNOWN_COMPILED refusal is PyTorch's own: aot_eager on CPU raises it for a program that
    hit it on tpu (seed 1000127: index_fill_ of an expanded view)."""
    prog = generate(1000127)
    assert _check(1000127, "compiled") == []
    x = prog.inputs[0].make("cpu")
    torch._dynamo.reset()
    with pytest.raises(Exception, match=KNOWN_COMPILED[0][0]):
        torch.compile(lambda a: a.index_fill_(0, torch.tensor([0]), 2), backend="aot_eager")(x)
