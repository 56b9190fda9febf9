"""The CPU side of a compiled graph: nodes whose results the host itself needs, run with PyTorch's CPU
kernels before the launch, and the host values the program reads, packed into one operand per dtype.

The typical case is an optimizer with `capturable=False` (PyTorch's default): its step counts are
0-dim CPU tensors, one per parameter, that the step increments (`_foreach_add_(state_steps, 1)`).
Per-tensor PyTorch calls on them cost more host time than the device program they feed, so a
foreach op over 0-dim CPU tensors of one dtype runs as ONE op on their packed 1-D tensor (the same
values: the scalar promotes a 0-dim and a 1-D tensor alike), its results stay packed ("lanes"), the
program reads the packed tensor as its operand when the lanes are exactly that operand, and the new
step counts are written back into the inputs with one byte copy each (_C.device.scatter_scalars).
"""
from __future__ import annotations

import operator

import torch

from .. import _C

# foreach op over a list and a Python scalar -> the op that does the same on their stack
_PACKED_FOREACH = {
    torch.ops.aten._foreach_add.Scalar: torch.add, torch.ops.aten._foreach_sub.Scalar: torch.sub,
    torch.ops.aten._foreach_mul.Scalar: torch.mul, torch.ops.aten._foreach_div.Scalar: torch.div,
}


class HostPart:
    """The host nodes of one FX graph as one FX-generated function of the graph's inputs.

    Build: HostPart(placeholders, nodes); then ask for the values the rest needs (slot, pack_slot,
    and finish with the CPU inputs to write back). Run: values = run(inputs) before the launch
    (a tuple indexed by slot), write_back(inputs, values) after it.
    """

    def __init__(self, placeholders, nodes):
        self.nodes = host_nodes(nodes)          # in graph order
        self._g = torch.fx.Graph()
        self._env = {p: self._g.placeholder(p.name) for p in placeholders}
        self._inputs = []      # indices of the graph inputs the function takes (the ones it reads)
        self._packed = {}      # packed foreach node -> its FX value (a 1-D tensor)
        self._lanes = {}       # getitem of a packed foreach -> (that foreach node, lane)
        self._selected = {}    # lane node -> its FX value as a 0-dim tensor (when needed alone)
        self._slots = []       # FX values returned by the function
        self.scatters = []     # (slot of a packed tensor, input index or None per lane)
        self.copies = []       # (input index, slot): written back with _foreach_copy_
        self.fn = None
        for n in self.nodes:
            self._emit(n)

    # -- building ----------------------------------------------------------------------------------
    def _emit(self, n):
        g = self._g
        if n.target is operator.getitem and n.args[0] in self._packed:
            self._lanes[n] = (n.args[0], n.args[1])
            return
        op = _PACKED_FOREACH.get(n.target)
        if op is not None and len(n.args) == 2 and not n.kwargs and _zero_dim_one_dtype(n.args[0]) \
                and not isinstance(n.args[1], torch.fx.Node):
            self._packed[n] = g.call_function(op, (self._stacked(n.args[0]), n.args[1]))
            return
        self._env[n] = g.node_copy(n, self._value)

    def _value(self, n):
        """The FX value of host node or placeholder n (a lane: selected from its packed tensor)."""
        if n in self._env:
            return self._env[n]
        if n in self._packed:  # the whole list (an output, a generic consumer): the packed tensor's rows
            self._env[n] = self._g.call_function(torch.unbind, (self._packed[n],))
            return self._env[n]
        if n not in self._selected:
            src, lane = self._lanes[n]
            sel = self._g.call_function(torch.select, (self._packed[src], 0, lane))
            self._selected[n] = self._g.call_function(torch.clone, (sel,))  # a value of its own, as foreach gives
        return self._selected[n]

    def _stacked(self, members):
        """The FX value of the stack of 0-dim `members`: a packed tensor as is when they are all its
        lanes in order; else one byte-gather."""
        src = _whole_lanes(members, self._lanes)
        if src is not None:
            return self._packed[src]
        return self._g.call_function(_C.device.gather_scalars, ([self._value(m) for m in members],))

    def _slot(self, value) -> int:
        self._slots.append(value)
        return len(self._slots) - 1

    def slot(self, n) -> int:
        """Slot of the value of host node n."""
        return self._slot(self._value(n))

    def order(self, members):
        """`members` (host nodes and CPU placeholders read by the program) with the lanes of each
        packed node together, in lane order, so that a pack of them can be the packed tensor."""
        first = {}
        for m in members:
            if m in self._lanes:
                first.setdefault(self._lanes[m][0], len(first))

        def key(im):
            i, m = im
            if m in self._lanes:
                src, lane = self._lanes[m]
                return (first[src], lane)
            return (len(first), i)
        return [m for _, m in sorted(enumerate(members), key=key)]

    def pack_slot(self, members) -> int:
        """Slot of the 1-D concatenation of `members` (one dtype), the program's operand."""
        vals = [m.meta["val"] for m in members]
        if all(v.dim() == 0 for v in vals):
            return self._slot(self._stacked(members))
        if len(members) == 1:
            return self._slot(self._g.call_function(torch.reshape, (self._value(members[0]), (-1,))))
        flat = [self._g.call_function(torch.reshape, (self._value(m), (-1,))) for m in members]
        return self._slot(self._g.call_function(torch.cat, (flat,)))

    def finish(self, mutations):
        """mutations: (input index, host node) pairs, the CPU inputs whose new values the host
        computed; lanes of one packed node are written back together. Generates the function."""
        by_src = {}
        for i, n in mutations:
            if n in self._lanes:
                src, lane = self._lanes[n]
                by_src.setdefault(src, [None] * len(src.args[0]))[lane] = i
            else:
                self.copies.append((i, self.slot(n)))
        for src, dsts in by_src.items():
            self.scatters.append((self._slot(self._packed[src]), dsts))
        if self._slots:
            self._g.output(tuple(self._slots))
            for i, ph in enumerate(list(self._g.find_nodes(op="placeholder"))):
                if ph.users:
                    self._inputs.append(i)
                else:
                    self._g.erase_node(ph)
            self.fn = torch.fx.GraphModule(torch.nn.Module(), self._g).forward

    # -- running -----------------------------------------------------------------------------------
    def run(self, inputs):
        """The slots' values for the graph's `inputs` (PyTorch's CPU kernels)."""
        return self.fn(*[inputs[i] for i in self._inputs]) if self.fn is not None else ()

    def write_back(self, inputs, values):
        """copy_ of the new host values into the CPU inputs they replace."""
        for slot, dsts in self.scatters:
            targets = [None if i is None else inputs[i] for i in dsts]
            if not _C.device.scatter_scalars(values[slot], targets):  # not a plain byte copy: PyTorch's copy_
                pairs = [(t, v) for t, v in zip(targets, values[slot].unbind()) if t is not None]
                torch._foreach_copy_([t for t, _ in pairs], [v for _, v in pairs])
        if self.copies:
            torch._foreach_copy_([inputs[i] for i, _ in self.copies], [values[s] for _, s in self.copies])


def _zero_dim_one_dtype(items) -> bool:
    vals = [n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in items]
    return len(vals) > 1 and all(isinstance(v, torch.Tensor) and v.dim() == 0 and v.device.type == "cpu"
                                 for v in vals) and len({v.dtype for v in vals}) == 1


def _whole_lanes(members, lanes):
    """The packed node whose lanes `members` are, all of them in order; else None."""
    first = lanes.get(members[0]) if members else None
    if first is None:
        return None
    src = first[0]
    if len(members) != len(src.args[0]):
        return None
    return src if all(lanes.get(m) == (src, k) for k, m in enumerate(members)) else None


def host_nodes(nodes) -> dict:
    """Nodes whose CPU results the host itself needs: new values of CPU inputs the graph mutates (an
    optimizer's step counts) and CPU outputs, with what they are computed from. They run on the host
    with PyTorch's CPU kernels, as the user placed them there; no device round trip. Every other node
    on CPU tensors (the bias corrections derived from the step counts) is lowered into the program,
    which reads the host values it needs as operands."""
    on_host = _cpu_only_nodes(nodes)
    need = []
    for n in nodes:
        if n.op == "call_function" and n.target is torch.ops.aten.copy_.default and \
                n.args[0].op == "placeholder" and n.args[1] in on_host:
            need.append(n.args[1])
        elif n.op == "output":
            outs = n.args[0] if isinstance(n.args[0], (list, tuple)) else [n.args[0]]
            need.extend(o for o in outs if isinstance(o, torch.fx.Node) and o in on_host)
    keep = set()
    while need:
        n = need.pop()
        if n in keep:
            continue
        keep.add(n)
        need.extend(d for d in n.all_input_nodes if d in on_host)
    return {n: True for n in on_host if n in keep}


def _cpu_only_nodes(nodes) -> dict:
    """Nodes that compute CPU tensors from CPU tensors only."""
    host = {}
    on_cpu = set()
    for n in nodes:
        val = n.meta.get("val")
        if n.op == "placeholder":
            if isinstance(val, torch.Tensor) and val.device.type == "cpu":
                on_cpu.add(n)
            continue
        if n.op != "call_function" or n.target is torch.ops.aten.copy_.default:
            continue
        if not (isinstance(n.target, torch._ops.OpOverload) or n.target is operator.getitem):
            continue
        vals = val if isinstance(val, (list, tuple)) else [val]
        if not vals or not all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in vals):
            continue
        if all(d in on_cpu for d in n.all_input_nodes):
            host[n] = True
            on_cpu.add(n)
    return host
