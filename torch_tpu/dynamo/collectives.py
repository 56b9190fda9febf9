"""Compiled graphs that contain collectives (PyTorch's functional collectives, which DTensor, FSDP2
and user code emit under torch.compile: `_c10d_functional.all_reduce`, `all_gather_into_tensor`,
`reduce_scatter_tensor`, `all_to_all_single`, `broadcast`, `wait_tensor`, ...).

Where tpu_dist runs the world's collectives on the devices (its device path: libtpu over ICI, NCCL
in the CUDA plugin, or ranks as threads of one process), the graph is lowered whole into one
StableHLO module over the devices of the ranks that run it (lowering/collectives.py: replica groups
from c10d's group registry), so XLA overlaps the collectives with compute; every rank of that span
launches it. Elsewhere (the CPU plugin, one process per device) a graph is cut at its collectives:
each run of compute between them becomes one compiled program (through the same lowering and
executable cache as any graph), and each run of collectives is executed by the process group's
backend (tpu_dist) in order, between the programs. Results are identical; the cost is one program
launch per compute segment.
"""
from __future__ import annotations

import torch
from torch.fx.passes.split_module import split_module

# Namespaces whose ops are collectives (or wait for one): never lowered into a program here.
_NAMESPACES = frozenset({"_c10d_functional", "_c10d_functional_autograd", "c10d", "_dtensor"})


def is_collective(node: torch.fx.Node) -> bool:
    t = node.target
    return node.op == "call_function" and isinstance(t, torch._ops.OpOverload) and t.namespace in _NAMESPACES


def has_collectives(gm: torch.fx.GraphModule) -> bool:
    return any(is_collective(n) for n in gm.graph.nodes)


def group_names(gm: torch.fx.GraphModule) -> list[str]:
    """The process groups (c10d group names) the graph's collectives use, in first-use order."""
    names = []
    for n in gm.graph.nodes:
        if not is_collective(n):
            continue
        for i, a in enumerate(n.target._schema.arguments):
            if a.name != "group_name":
                continue
            v = n.kwargs.get("group_name", n.args[i] if i < len(n.args) else None)
            if isinstance(v, str) and v not in names:
                names.append(v)
    return names


def graph_span(gm: torch.fx.GraphModule) -> list[int] | None:
    """The global ranks whose devices run `gm` as one program (lowering/collectives.py's
    replica_span), or None for a graph without collectives. Raises ValueError where a group does not
    tile the world as a mesh dimension does."""
    if not has_collectives(gm):
        return None
    from ..lowering.collectives import replica_span
    return replica_span(group_names(gm))


class _Program(torch.nn.Module):
    """A compiled compute segment, called as the split graph calls its submodules."""

    def __init__(self, run, single: bool):
        super().__init__()
        self.run, self.single = run, single

    def forward(self, *args):
        out = self.run(list(args))
        return out[0] if self.single else tuple(out)


def split_at_collectives(gm: torch.fx.GraphModule, compile_segment, name: str):
    """A boxed callable running `gm`: its compute segments compiled by `compile_segment(sub_gm, name)`
    (which returns a boxed callable), its collectives run eagerly by the process group's backend."""
    part, last_kind = [0], [None]

    def partition(node):
        kind = is_collective(node)
        if last_kind[0] is not None and kind != last_kind[0]:
            part[0] += 1
        last_kind[0] = kind
        return part[0]

    split = split_module(gm, gm, partition, keep_original_order=True)
    for child_name, child in list(split.named_children()):
        if not isinstance(child, torch.fx.GraphModule) or has_collectives(child):
            continue  # collectives: the submodule runs them eagerly
        out = next(n for n in child.graph.nodes if n.op == "output")
        single = not isinstance(out.args[0], (tuple, list))
        if single:  # the lowering returns a list of outputs: give it a one-element tuple
            out.args = ((out.args[0],),)
            child.recompile()
        setattr(split, child_name, _Program(compile_segment(child, f"{name} segment {child_name}"), single))

    def run(args):
        return split(*args)
    run._boxed_call = True
    return run
