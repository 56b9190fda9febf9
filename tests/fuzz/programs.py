"""Seeded random programs for differential testing of tpu against CPU (issue: fuzzing against CPU).

A program is a few input tensors (random shapes: 0-d, empty, size 1, odd sizes; random dtypes; random
layouts: transposed, sliced with a step, expanded, views of views) and a few steps, each an op from
OPS applied to tensors of the pool: a new value (appended to the pool), an in-place update or an out=
write. `run(program, device, mode)` executes it and returns, per step, the result or the exception;
`compare(cpu, tpu)` says where tpu differs from CPU (values with PyTorch's tolerances, dtypes, shapes,
exception types, and the pool after a refused step: a failed op writes nothing).

    python -m tests.fuzz --programs 10000 --modes strict,fused,compiled [--seed 0]

runs many (tests/fuzz/__main__.py); tests/fuzz/test_fuzz.py runs a fixed budget in CI.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

DTYPES = [torch.float32, torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64]
SHAPES = [(), (0,), (1,), (3,), (5,), (2, 3), (1, 4), (4, 1), (3, 0), (2, 1, 3), (3, 2, 2), (1, 1)]
SPECIAL = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"), 0.5, -2.5, 1e-8, 3e4]


def _value(rng: random.Random, shape, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.randrange(2 ** 31))
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if dtype.is_complex:
        return torch.complex(torch.randn(shape, generator=g), torch.randn(shape, generator=g)).to(dtype)
    if dtype.is_floating_point:
        t = (torch.randn(shape, generator=g) * rng.choice([1.0, 3.0, 100.0]))
        if t.numel() and rng.random() < 0.3:  # special values somewhere
            flat = t.view(-1)
            for _ in range(rng.randint(1, 2)):
                flat[rng.randrange(flat.numel())] = rng.choice(SPECIAL)
        return t.to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -20), min(info.max, 20)
    return torch.randint(lo, hi + 1, shape, generator=g).to(dtype)


@dataclass
class Input:
    """An input tensor: its base value and a layout recipe applied on each device."""
    base: torch.Tensor
    layout: tuple  # ("plain",) | ("t",) | ("step", dim) | ("expand", shape) | ("view_of_view",)

    def make(self, device) -> torch.Tensor:
        t = self.base.clone().to(device)
        kind = self.layout[0]
        if kind == "t":
            return t.t()
        if kind == "step":
            return t[::2] if t.dim() else t
        if kind == "expand":
            return t.expand(self.layout[1])
        if kind == "view_of_view":
            return t.unsqueeze(0).transpose(0, -1)[..., :].squeeze(-1)
        return t


def _input(rng: random.Random) -> Input:
    dtype, shape = rng.choice(DTYPES), rng.choice(SHAPES)
    layout = ("plain",)
    r = rng.random()
    if r < 0.15 and len(shape) == 2:
        base = _value(rng, shape[::-1], dtype)
        return Input(base, ("t",))
    if r < 0.3 and len(shape) >= 1 and shape[0] > 0:
        base = _value(rng, (shape[0] * 2,) + shape[1:], dtype)
        return Input(base, ("step",))
    if r < 0.4 and len(shape) >= 1 and 1 in shape:
        big = tuple(3 if s == 1 else s for s in shape)
        return Input(_value(rng, shape, dtype), ("expand", big))
    if r < 0.5 and len(shape) == 1:
        return Input(_value(rng, shape, dtype), ("view_of_view",))
    return Input(_value(rng, shape, dtype), layout)


# Ops: name -> (arity, fn(*tensors) -> tensor or None (in-place)). Errors are expected: CPU's
# refusals are compared too.
_UNARY = {
    "abs": torch.abs, "neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "sin": torch.sin, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "floor": torch.floor, "ceil": torch.ceil,
    "round": torch.round, "trunc": torch.trunc, "frac": torch.frac, "sign": torch.sign,
    "reciprocal": torch.reciprocal, "relu": torch.relu, "logical_not": torch.logical_not,
    "bitwise_not": torch.bitwise_not, "square": torch.square, "isnan": torch.isnan, "isfinite": torch.isfinite,
    "clamp": lambda a: torch.clamp(a, -1, 2), "nan_to_num": torch.nan_to_num,
    "sum": lambda a: a.sum(), "sum0": lambda a: a.sum(0), "mean": lambda a: a.mean(), "amax": lambda a: a.amax(),
    "argmax": lambda a: a.argmax(), "cumsum": lambda a: a.cumsum(0), "prod": lambda a: a.prod(),
    "softmax": lambda a: a.softmax(-1), "flip": lambda a: a.flip(0), "reshape": lambda a: a.reshape(-1),
    "unsqueeze": lambda a: a.unsqueeze(0), "contiguous": lambda a: a.contiguous(), "clone": lambda a: a.clone(),
    "t": lambda a: a.t(), "to_float": lambda a: a.float(), "to_int": lambda a: a.to(torch.int32),
    "to_bool": lambda a: a.bool(), "to_half": lambda a: a.half(), "any": lambda a: a.any(), "all": lambda a: a.all(),
    "max_dim": lambda a: a.max(0)[0], "sort": lambda a: a.sort(-1)[0], "topk1": lambda a: a.topk(1)[0],
    "nonzero": torch.nonzero, "diff": lambda a: torch.diff(a), "var": lambda a: a.var(),
}
_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "floor_divide": torch.floor_divide, "remainder": torch.remainder, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "eq": torch.eq, "lt": torch.lt, "ge": torch.ge,
    "logical_and": torch.logical_and, "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
    "atan2": torch.atan2, "lerp": lambda a, b: torch.lerp(a, b, 0.25), "where": lambda a, b: torch.where(a > 0, a, b),
    "matmul": torch.matmul, "cat": lambda a, b: torch.cat([a, b]), "stack": lambda a, b: torch.stack([a, b]),
    "add_scalar": lambda a, b: a + 2, "mul_float": lambda a, b: a * 1.5, "rsub": lambda a, b: 1 - a,
    "isin": torch.isin, "hypot": torch.hypot, "fmod": torch.fmod,
    # the sign of a NaN is the hardware's (x86's default NaN is negative, XLA's is not): signs of numbers only
    "copysign": lambda a, b: torch.copysign(a, torch.nan_to_num(b) if b.is_floating_point() else b),
}
_INPLACE = {
    "add_": lambda a, b: a.add_(b), "mul_": lambda a, b: a.mul_(b), "sub_": lambda a, b: a.sub_(b),
    "div_": lambda a, b: a.div_(b), "clamp_": lambda a, b: a.clamp_(min=0), "fill_": lambda a, b: a.fill_(3),
    "zero_": lambda a, b: a.zero_(), "copy_": lambda a, b: a.copy_(b), "neg_": lambda a, b: a.neg_(),
    "masked_fill_": lambda a, b: a.masked_fill_(b > 0, 1), "abs_": lambda a, b: a.abs_(),
    "index_fill_": lambda a, b: a.index_fill_(0, torch.tensor([0], device=a.device), 2),
    "add_out": lambda a, b: torch.add(b, b, out=a), "mul_out": lambda a, b: torch.mul(b, 2, out=a),
}


@dataclass
class Program:
    seed: int
    inputs: list
    steps: list = field(default_factory=list)  # (op name, operand indices into the pool)

    def __str__(self):
        ins = ", ".join(f"{tuple(i.base.shape)}:{str(i.base.dtype)[6:]}:{i.layout[0]}" for i in self.inputs)
        return f"seed {self.seed}: inputs [{ins}] steps {self.steps}"


def generate(seed: int) -> Program:
    """The program of `seed` (the same on every machine)."""
    rng = random.Random(seed)
    prog = Program(seed, [_input(rng) for _ in range(rng.randint(1, 3))])
    pool = len(prog.inputs)
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        if kind < 0.4:
            name = rng.choice(sorted(_UNARY))
            prog.steps.append((name, (rng.randrange(pool),)))
            pool += 1
        elif kind < 0.8:
            name = rng.choice(sorted(_BINARY))
            prog.steps.append((name, (rng.randrange(pool), rng.randrange(pool))))
            pool += 1
        else:
            name = rng.choice(sorted(_INPLACE))
            prog.steps.append((name, (rng.randrange(pool), rng.randrange(pool))))
    return prog


def _op(name):
    for table in (_UNARY, _BINARY, _INPLACE):
        if name in table:
            return table[name], table is _INPLACE
    raise KeyError(name)


def run(prog: Program, device, compiled: bool = False) -> list:
    """Per step: the result tensor (a CPU copy), None for an in-place step, or the exception; then the
    pool's tensors (CPU copies) at the end. compiled: each step through torch.compile(backend="tpu")."""
    pool = [i.make(device) for i in prog.inputs]
    out = []
    if compiled:
        torch._dynamo.reset()  # past its recompile limit, Dynamo would run a step's lambda eagerly
    for name, idx in prog.steps:
        fn, inplace = _op(name)
        args = [pool[i] for i in idx]
        call = torch.compile(fn, backend="tpu", dynamic=False) if compiled else fn
        try:
            r = call(*args)
            if torch.device(device).type == "tpu":
                torch.tpu.synchronize()  # index errors found on the device surface here (README)
        except Exception as e:  # noqa: BLE001  (CPU's refusals are results to compare)
            out.append(e)
            if not inplace:
                pool.append(None)
            continue
        if inplace:
            out.append(None)
        else:
            out.append(r.detach().to("cpu", copy=True) if isinstance(r, torch.Tensor) else r)  # later steps may write r
            pool.append(r)
    out.append([t.detach().cpu() if isinstance(t, torch.Tensor) else None for t in pool])
    return out


def _close(a: torch.Tensor, b: torch.Tensor) -> str | None:
    if a.dtype != b.dtype:
        return f"dtype {b.dtype} != CPU {a.dtype}"
    if a.shape != b.shape:
        return f"shape {tuple(b.shape)} != CPU {tuple(a.shape)}"
    try:
        if a.dtype.is_floating_point or a.dtype.is_complex:
            tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(a.dtype)
            kw = dict(rtol=tol, atol=tol) if tol else {}
            torch.testing.assert_close(b, a, equal_nan=True, **kw)
        elif not torch.equal(a, b):
            return f"values {b.flatten()[:8].tolist()} != CPU {a.flatten()[:8].tolist()}"
    except AssertionError as e:
        return "values: " + str(e).splitlines()[0] + " " + str(e).splitlines()[-1][:120]
    return None


# Differences that are decisions, not defects (README): (CPU's exception type, start of its message,
# why tpu differs).
KNOWN = [
    (RuntimeError, "ZeroDivisionError", "integer division by zero: CPU checks every divisor on the host; "
                                        "tpu, as CUDA, gives a value (XLA's: -1 or the dividend) without a sync"),
    (RuntimeError, "view size is not compatible", "CPU's isin views a non-contiguous test_elements (a CPU "
                                                  "limitation); tpu computes"),
    (RuntimeError, "setStorage:", "index_fill_ of an empty tensor: CPU fails restriding it; tpu raises the "
                                  "index's IndexError"),
]


# Refusals of torch.compile itself, raised the same by PyTorch's aot_eager and inductor backends on
# CPU tensors (test_fuzz checks that): (the message tpu's compiled step raises, why).
KNOWN_COMPILED = [
    ("more than one element of the written-to tensor refers to a single memory location",
     "AOTAutograd writes a mutated input back with copy_, which PyTorch refuses for an expanded input"),
]


def _known(c: Exception) -> bool:
    return any(isinstance(c, t) and str(c).startswith(m) for t, m, _ in KNOWN)


def _known_compiled(t: Exception) -> bool:
    return any(m in str(t) for m, _ in KNOWN_COMPILED)


def compare(cpu: list, tpu: list, compiled: bool = False) -> list[str]:
    """Where tpu differs from CPU: one line per difference ([] when none). Compiled runs are compared
    on values only where CPU succeeds (Dynamo wraps errors in its own types)."""
    diffs = []
    for k, (c, t) in enumerate(zip(cpu[:-1], tpu[:-1])):
        if isinstance(c, Exception):
            if compiled:
                return diffs  # the rest of the program depends on the refused step
            if not isinstance(t, Exception):
                if not _known(c):
                    diffs.append(f"step {k}: CPU raises {type(c).__name__}: {str(c)[:100]}; tpu does not")
                return diffs  # later steps read what only one side made
            elif not isinstance(t, type(c)) and not _known(c):
                diffs.append(f"step {k}: tpu raises {type(t).__name__}: {str(t)[:100]}; CPU {type(c).__name__}: "
                             f"{str(c)[:100]}")
        elif isinstance(t, Exception):
            if compiled and _known_compiled(t):
                return diffs
            diffs.append(f"step {k}: tpu raises {type(t).__name__}: {str(t)[:160]}")
            return diffs
        elif isinstance(c, torch.Tensor):
            d = _close(c, t) if isinstance(t, torch.Tensor) else f"result {type(t).__name__}"
            if d:
                diffs.append(f"step {k}: {d}")
    for k, (c, t) in enumerate(zip(cpu[-1], tpu[-1])):
        if isinstance(c, torch.Tensor) and isinstance(t, torch.Tensor):
            d = _close(c, t)
            if d:
                diffs.append(f"pool tensor {k} at the end: {d}")
    return diffs
