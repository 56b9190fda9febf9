"""Compiled graphs that contain collectives (PyTorch's functional collectives, which DTensor, FSDP2
and user code emit under torch.compile: `_c10d_functional.all_reduce`, `all_gather_into_tensor`,
`reduce_scatter_tensor`, `all_to_all_single`, `broadcast`, `wait_tensor`, ...).

Where the plugin has device collectives (libtpu over ICI, NCCL in the CUDA plugin) these would be
lowered into the graph's StableHLO module (`stablehlo.all_reduce` with replica groups over the
group's ranks; the group name resolves to its ranks through c10d's group registry), so XLA can
overlap them with compute. The CPU plugin has none, so a graph is cut at its collectives: each run
of compute between them becomes one compiled program (through the same lowering and executable
cache as any graph), and each run of collectives is executed by the process group's backend
(tpu_dist) in order, between the programs. Results are identical; the cost is one program launch
per compute segment.
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
