"""How results leave a program, for every kind torch_tpu builds: an eager op's program
(eager/kernel.py), a fused eager run (eager/fused.py) and a compiled graph (dynamo/lower_graph.py).

A program result is one of two things:
- a **fresh** tensor's buffer: the value laid out in the memory order of the strides CPU would give
  the tensor (a channels-last or transposed result is a dense permutation: the value is transposed
  into memory order and the new tensor gets those strides), described by a _C.eager.FreshSpec that
  the launchers allocate the tensor from;
- a **replacement** of an argument's buffer (an in-place write, a graph's mutated input, the
  device's index-error status): the argument is donated to it (XLA input/output aliasing, so an
  update does not double memory), and where the program's index checks failed the argument's old
  value is returned instead (`failed`), so a failed op writes nothing.
One mechanism for all three keeps their layout and donation rules from drifting apart.
"""
from __future__ import annotations

from .. import _C
from .builder import Builder, TensorType, Value
from .strided import contiguous_strides, dense_order


def fresh_layout(t: TensorType, strides) -> tuple:
    """(spec, order) of a fresh result of type `t` with CPU's `strides` (a meta kernel's or a
    lowering's layout: TensorIterator keeping a channels_last or transposed input's layout, clone's
    memory_format). spec: a _C.eager.FreshSpec (strides None for row-major); order: the transpose that
    puts the value in memory order, None when none is needed. Strides that are not a dense
    permutation (no kernel makes them for a fresh result) fall back to row-major."""
    shape, strides = tuple(t.shape), tuple(strides)
    if strides == tuple(contiguous_strides(shape)):
        return _C.eager.FreshSpec(shape, t.dtype), None
    if t.numel == 0:
        return _C.eager.FreshSpec(shape, t.dtype, strides), None
    order = dense_order(shape, strides)
    if order is None:
        return _C.eager.FreshSpec(shape, t.dtype), None
    return _C.eager.FreshSpec(shape, t.dtype, strides), (None if order == sorted(order) else order)


class ProgramResults:
    """The results of one program under construction, in order. `values`: the @main results;
    `specs`: per result, the FreshSpec of the buffer it is (a replacement's is its argument's type);
    `fresh_specs`: the fresh results' specs only, in order (what an eager plan allocates)."""

    def __init__(self, b: Builder):
        self.b = b
        self.values: list[Value] = []
        self.specs: list = []
        self.fresh_specs: list = []

    def fresh(self, v: Value, strides=None) -> int:
        """Adds v as a new tensor's buffer with CPU's `strides` (None: row-major); returns its
        index among the fresh results."""
        spec, order = fresh_layout(v.type, contiguous_strides(v.shape) if strides is None else strides)
        if order is not None:
            v = self.b.transpose(v, order)
        self._add(v, spec)
        self.fresh_specs.append(spec)
        return len(self.fresh_specs) - 1

    def buffer(self, v: Value) -> int:
        """Adds v as a buffer already laid out by whoever made it (a storage created inside a fused
        run: the op that wrote it put it in memory order); returns its result index."""
        return self._add(v, _C.eager.FreshSpec(tuple(v.shape), v.dtype))

    def replace(self, arg: Value | None, v: Value, failed: Value | None = None, keep: Value | None = None) -> bool:
        """Adds v as the new buffer of program argument `arg` (None: of a buffer the program does not
        take as an argument). `failed` (a bool scalar): where true, `keep` (default: arg) is the
        result instead, the value the buffer had. arg is donated to the result when their types
        agree; returns whether it was."""
        if failed is not None:
            v = self.b.select(self.b.broadcast_to(failed, v.shape), arg if keep is None else keep, v)
        k = self._add(v, _C.eager.FreshSpec(tuple(v.shape), v.dtype))
        donated = arg is not None and arg.type == v.type
        if donated:
            self.b.donate(arg, k)
        return donated

    def module(self, functions=(), name: str = "torch_tpu") -> str:
        """The program text with these results (Builder.module)."""
        return self.b.module(self.values, functions, name)

    @property
    def types(self) -> list:
        return [v.type for v in self.values]

    def _add(self, v: Value, spec) -> int:
        self.values.append(v)
        self.specs.append(spec)
        return len(self.values) - 1
