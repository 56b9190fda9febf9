"""ATen overloads <-> registry entries: which lowering computes an overload's value.

A lowering is registered under one overload, normally the functional one ("add.Tensor"). Its
in-place variant ("add_.Tensor": F's name with a trailing underscore, same overload, same
arguments) and its out= variants ("add.out": F's arguments plus kwarg-only written outputs) have the
same value, so eager registers one kernel per variant (eager/register.py) and a compiled graph, which
calls functional overloads, also finds lowerings registered under an in-place name (uniform_) or an
out= name only (eye.out). Resolutions are computed once per overload.
"""
from __future__ import annotations

import torch

from .registry import REGISTRY, Lowering


def overload_name(op) -> str:
    """Registry key of an OpOverload: "add.Tensor", "abs" (default overload: the bare name); an op
    outside aten keeps its namespace ("mylib::scale", a custom kernel's)."""
    ns, base = op._schema.name.split("::")
    base = base if ns == "aten" else f"{ns}::{base}"
    return base if op._overloadname == "default" else f"{base}.{op._overloadname}"


def overload(name: str):
    """The OpOverload of a registry key ("add.Tensor" -> torch.ops.aten.add.Tensor,
    "mylib::scale" -> torch.ops.mylib.scale.default)."""
    ns, _, rest = name.rpartition("::")
    packet, _, ov = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns or "aten"), packet), ov or "default")


def _arg_sig(op, skip=()):
    return [(a.name, str(a.type)) for a in op._schema.arguments if a.name not in skip]


def _out_args(op) -> list[str]:
    return [a.name for a in op._schema.arguments if a.kwarg_only and a.alias_info is not None
            and a.alias_info.is_write]


def variants(f) -> list:
    """The in-place and out= overloads whose value is functional overload f's."""
    packet_name = f._schema.name.split("::")[1]
    out = []
    if not packet_name.endswith("_"):
        inplace = getattr(torch.ops.aten, packet_name + "_", None)
        if inplace is not None and f._overloadname in inplace.overloads():
            k = getattr(inplace, f._overloadname)
            if _arg_sig(k) == _arg_sig(f):
                out.append(k)
    packet = getattr(torch.ops.aten, packet_name)
    for ov in packet.overloads():
        k = getattr(packet, ov)
        outs = _out_args(k)
        if outs and _arg_sig(k, outs) == _arg_sig(f):
            out.append(k)
    return out


_RESOLVED: dict = {}


def resolve(op) -> tuple[Lowering, tuple | None] | None:
    """(Lowering, out) for an aten OpOverload as a compiled graph calls it, or None: `out` is None
    when the lowering takes op's arguments, or (out= overload, its output's name) when the lowering
    is registered under an out= overload only (eye -> eye.out: called with op's arguments by name)."""
    if op in _RESOLVED:
        return _RESOLVED[op]
    found = None
    if op.namespace != "aten":
        low = REGISTRY.get(overload_name(op))
        found = None if low is None else (low, None)
    else:
        name = overload_name(op)
        base, _, ov = name.partition(".")
        # registered under this name, or in-place only (uniform -> uniform_)
        low = REGISTRY.get(name) or REGISTRY.get(base + "_" + ("." + ov if ov else ""))
        if low is not None:
            found = (low, None)
        else:
            names = {a.name for a in op._schema.arguments}
            packet = getattr(torch.ops.aten, base)
            for key, low in REGISTRY.items():
                if key.partition(".")[0] != base:
                    continue
                k = getattr(packet, key.partition(".")[2] or "default")
                outs = _out_args(k)
                if len(outs) == 1 and all(n in names for n, _ in _arg_sig(k, outs)):
                    found = (low, (k, outs[0]))
                    break
    _RESOLVED[op] = found
    return found
