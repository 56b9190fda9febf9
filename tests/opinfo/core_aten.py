"""How each op of PyTorch's core ATen opset (the overloads tagged `torch.Tag.core`, the set that
PyTorch's decompositions reduce everything else to) runs on tpu.

    python -m tests.opinfo.core_aten          # the table and the totals
    python -m tests.opinfo.core_aten --missing

Each core overload is one of:
  lowered    a StableHLO lowering in torch_tpu/lowering (its in-place/out= variants derive from it)
  kernel     a tpu kernel registered directly: C++ views and metadata (as_strided, view, empty, ...),
             small Python kernels over lowered ops (nonzero's data-dependent size, batch norm's
             running-stat update)
  composite  PyTorch's own CompositeExplicit/Implicit kernel, i.e. other ATen ops on tpu tensors
             (expand/permute/select are as_strided views, full is empty + fill_, ...);
             tests/test_core_aten.py runs each of these and fails if any reaches the CPU fallback
  decomposed a decomposition from PyTorch's table run on tpu tensors (fallback chain step 2)
  missing    nothing but the counted CPU fallback
"""
from __future__ import annotations

import argparse
import collections

import torch

KINDS = ("lowered", "kernel", "composite", "decomposed", "missing")


def core_overloads() -> list:
    """Every aten OpOverload tagged core, sorted by name."""
    ops = []
    for packet_name in dir(torch.ops.aten):
        try:
            packet = getattr(torch.ops.aten, packet_name)
        except (AttributeError, RuntimeError):
            continue
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for ov in packet.overloads():
            op = getattr(packet, ov)
            if torch.Tag.core in op.tags:
                ops.append(op)
    return sorted(ops, key=overload_name)


def overload_name(op) -> str:
    base = op._schema.name.split("::")[1]
    return base if op._overloadname == "default" else f"{base}.{op._overloadname}"


def classify(op) -> str:
    """One of KINDS for an aten OpOverload (torch_tpu must be imported)."""
    from torch_tpu.eager import register
    from torch_tpu.eager.kernel import Kernel
    from torch_tpu.lowering.registry import REGISTRY

    name = overload_name(op)
    if name in REGISTRY:
        return "lowered"
    fn = register._registered.get(name)
    if fn is not None:
        return "lowered" if isinstance(fn, Kernel) or name in ("copy_", "_copy_from") else "decomposed"
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "PrivateUse1"):
        return "kernel"
    for key in ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional", "CompositeImplicitAutograd"):
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key):
            return "composite"
    return "missing"


def table() -> dict:
    """{kind: [overload names]} over the core opset."""
    import torch_tpu  # noqa: F401
    out = collections.defaultdict(list)
    for op in core_overloads():
        out[classify(op)].append(overload_name(op))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--missing", action="store_true", help="list only what is decomposed or missing")
    args = p.parse_args(argv)
    t = table()
    total = sum(len(v) for v in t.values())
    for kind in KINDS:
        if args.missing and kind not in ("decomposed", "missing"):
            continue
        names = t.get(kind, [])
        print(f"{kind} ({len(names)}): {', '.join(names)}\n")
    native = sum(len(t.get(k, [])) for k in ("lowered", "kernel", "composite"))
    print(f"core ATen overloads: {total}; on tpu without decomposition or fallback: {native} "
          f"({100.0 * native / max(total, 1):.1f}%)")


if __name__ == "__main__":
    main()
