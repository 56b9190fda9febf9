"""Seeded programs that update an operand in place and then use it again, at the sizes real layers
have (issue 50: XLA:CPU's XNNPACK dot reused weights it had packed from an earlier buffer at the same
address, so `g @ w` after `w.add_(1)` returned the old product).

A program is a consumer (a matrix product or convolution of two or three operands, sizes up to
1024 per dim; an operand may be a view at a nonzero storage offset) and a few rounds of: run the consumer, then update one operand in place (a scalar
add_, mul_, copy_ from a fresh tensor, a write through a view, an out= write, a foreach op, an
optimizer step, or the operand freed and a new tensor of its size made in its place). Every
consumer result and the final operands are compared with CPU's by relative error: a stale
operand changes a result by O(1) of its norm, rounding by about 1e-6.

    python -m tests.fuzz --kind reuse --programs 200 --modes strict,debug,fused,compiled
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

SIZES = [1, 3, 64, 100, 128, 256, 400, 512, 784, 1024]
MAX_ELEMENTS = 1 << 20  # per operand: keeps a program under a second on CPU


def _linear(x, w, b):
    return torch.nn.functional.linear(x, w, b)


def _conv(x, w, b):
    return torch.nn.functional.conv2d(x, w, b, padding=1)


# consumer -> (fn(*operands), operand shapes from (m, k, n) dims)
CONSUMERS = {
    "mm": (torch.mm, lambda m, k, n: [(m, k), (k, n)]),
    "matmul_3d": (torch.matmul, lambda m, k, n: [(2, m, k), (k, n)]),
    "linear": (_linear, lambda m, k, n: [(m, k), (n, k), (n,)]),
    "addmm": (lambda b, x, w: torch.addmm(b, x, w), lambda m, k, n: [(n,), (m, k), (k, n)]),
    "bmm": (torch.bmm, lambda m, k, n: [(2, m, k), (2, k, n)]),
    "t_mm": (lambda x, w: x @ w.t(), lambda m, k, n: [(m, k), (n, k)]),
    "conv2d": (_conv, lambda m, k, n: [(2, min(k, 16), 8, 8), (min(n, 32), min(k, 16), 3, 3), (min(n, 32),)]),
}

# The optimizers' three implementations: foreach, fused and single-tensor.
OPTIMIZERS = {
    "sgd_foreach": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True),
    "adam_fused": lambda ps: torch.optim.Adam(ps, lr=0.1, fused=True),
    "adamw_single": lambda ps: torch.optim.AdamW(ps, lr=0.1, foreach=False),
}
UPDATES = ["add_", "mul_", "copy_", "view_row", "view_col", "out", "foreach", *OPTIMIZERS, "realloc"]


@dataclass
class ReuseProgram:
    seed: int
    consumer: str
    shapes: list
    values: list  # CPU base values of the operands
    rounds: list = field(default_factory=list)  # (update kind, operand index, value seed)
    # per operand: "plain", or "offset" (a view of a larger storage at a nonzero offset, which eager
    # programs take as a runtime operand: the update writes through it)
    layouts: list = field(default_factory=list)

    def __str__(self):
        return f"reuse seed {self.seed}: {self.consumer} {self.shapes} {self.layouts} rounds {self.rounds}"


def generate(seed: int) -> ReuseProgram:
    """The program of `seed` (the same on every machine)."""
    rng = random.Random(seed)
    consumer = rng.choice(sorted(CONSUMERS))
    while True:
        m, k, n = (rng.choice(SIZES) for _ in range(3))
        shapes = CONSUMERS[consumer][1](m, k, n)
        if all(torch.Size(s).numel() <= MAX_ELEMENTS for s in shapes):
            break
    g = torch.Generator().manual_seed(seed)
    values = [torch.randn(s, generator=g) for s in shapes]
    prog = ReuseProgram(seed, consumer, shapes, values)
    weight = max(range(len(shapes)), key=lambda i: (len(shapes[i]) >= 2, i))  # mostly the rhs/weight
    for _ in range(rng.randint(2, 3)):
        which = weight if rng.random() < 0.75 else rng.randrange(len(shapes))
        prog.rounds.append((rng.choice(UPDATES), which, rng.randrange(2 ** 31)))
    prog.layouts = [rng.choice(["plain", "plain", "offset"]) for _ in shapes]
    return prog


def _place(value: torch.Tensor, layout: str, device) -> torch.Tensor:
    """The operand on `device` in its layout: "offset" is rows 1.. of a storage one row longer."""
    if layout == "offset":
        big = torch.cat([torch.full_like(value[:1] if value.dim() else value.reshape(1), 7.0),
                         value.reshape(-1, *value.shape[1:]) if value.dim() else value.reshape(1)])
        return big.to(device)[1:].reshape(value.shape)
    return value.clone().to(device)


def _update(kind: str, ops: list, i: int, value_seed: int, device) -> None:
    """Applies one in-place update of ops[i] (or, for realloc, replaces it by a new tensor)."""
    t = ops[i]
    g = torch.Generator().manual_seed(value_seed)
    fresh = torch.randn(t.shape, generator=g).to(device)
    if kind == "add_":
        t.add_(1.0)
    elif kind == "mul_":
        t.mul_(-0.5)
    elif kind == "copy_":
        t.copy_(fresh)
    elif kind == "view_row":
        t[: max(1, t.shape[0] // 2)].add_(fresh[: max(1, t.shape[0] // 2)])
    elif kind == "view_col":
        t.select(-1, 0).mul_(3.0)
    elif kind == "out":
        torch.add(t, fresh, alpha=0.5, out=t)
    elif kind == "foreach":
        torch._foreach_add_([t], [fresh])
    elif kind in OPTIMIZERS:
        p = torch.nn.Parameter(t)  # shares t's storage: the step writes t
        opt = OPTIMIZERS[kind]([p])
        for _ in range(2):  # the second step reads the state the first wrote
            p.grad = fresh
            opt.step()
    elif kind == "realloc":
        ops[i] = None
        del t
        ops[i] = fresh  # a new tensor of the same size, often at the freed address
    else:
        raise KeyError(kind)


def run(prog: ReuseProgram, device, compiled: bool = False) -> list:
    """The consumer's result of every round (CPU copies), then the operands at the end."""
    fn = CONSUMERS[prog.consumer][0]
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, backend="tpu", dynamic=False)
    ops = [_place(v, layout, device) for v, layout in zip(prog.values, prog.layouts)]
    out = []
    for kind, i, value_seed in prog.rounds:
        out.append(fn(*ops).cpu())
        _update(kind, ops, i, value_seed, device)
    out.append(fn(*ops).cpu())
    out.extend(o.detach().cpu() for o in ops)
    return out


def compare(cpu: list, tpu: list) -> list[str]:
    """One line per result whose relative error (Frobenius) against CPU's is over 1e-4."""
    diffs = []
    for k, (c, t) in enumerate(zip(cpu, tpu)):
        if c.shape != t.shape:
            diffs.append(f"result {k}: shape {tuple(t.shape)} != CPU {tuple(c.shape)}")
            continue
        err = (t.double() - c.double()).norm() / max(c.double().norm().item(), 1e-12)
        if not err <= 1e-4:
            diffs.append(f"result {k}: relative error {float(err):.2e} against CPU")
    return diffs
