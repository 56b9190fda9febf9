"""JAX functions (Pallas kernels included) as PyTorch operators on tpu tensors.

Each kernel is a `torch.library.custom_op` whose tpu kernel is an ordinary lowering of the one
registry: the lowering inlines the kernel's StableHLO (program.py) as private functions of the
program that calls it. So an eager call takes the same C++ hot path and plan cache as `aten::add`
(a second call with the same shapes traces and compiles nothing), fused eager records it into its
run, and torch.compile(backend="tpu") inlines it into the graph's module, where XLA fuses around it.

Operator schemas, whatever the JAX function's arity:
- `ns::name(Tensor[] args, int statics=0) -> Tensor[]`: the tensor arguments in order; the
  non-tensor arguments are static (JAX traces them as Python values): `statics` numbers each
  distinct tuple of them, so every combination is keyed and lowered separately.
- with donation (`donate_argnums` / `input_output_aliases`),
  `ns::name(Tensor[] args, Tensor(a!)[] outs, int statics=0) -> ()`: `outs` holds one tensor per
  JAX output, the donated input itself where the output aliases it (its storage receives the
  output, its old buffer donated to the program) and a new tensor otherwise; `args` the other
  inputs. The call returns the outputs (donated inputs updated in place).

Autograd: JAX's vjp of the function, run the same way (another such operator, `name_vjp`), unless
`register_autograd` replaces it; operators with donation have none (they mutate their inputs).
"""
from __future__ import annotations

import itertools
import threading

import torch

from .. import _C
from ..eager import state as _state
from ..eager import register
from ..lowering import registry
from ..lowering.builder import TensorType
from . import _jax
from .program import ModuleProgram, program

_NAMES = itertools.count()
_is_compiling = torch.compiler.is_compiling
_LOCK = threading.Lock()


def _check_name(name: str) -> str:
    ns, sep, op = name.partition("::")
    if not sep or not ns.isidentifier() or not op.isidentifier():
        raise ValueError(f"torch_tpu.pallas: operator name {name!r} must be 'namespace::name' (two identifiers), "
                         "e.g. 'mylib::rms_norm'")
    return name


class JaxOp:
    """A JAX function as the PyTorch operator `name` ("ns::op"); call it with tensors (tpu) and static
    values as you would the function. Returns tpu tensors shaped as JAX's outputs (one tensor, or a
    tuple / the same pytree). `donate`: {input position: output position} of donated inputs.

    Raises RuntimeError for a non-tpu tensor argument (naming it), and for a JAX tracing error
    (naming the op and JAX's message); no tensor is changed then."""

    def __init__(self, name: str, fn, donate: dict[int, int] | None = None, jit_kwargs: dict | None = None,
                 autograd: bool = True):
        self.name = _check_name(name)
        self.fn = fn
        self.donate = dict(donate or {})
        self.jit_kwargs = dict(jit_kwargs or {})
        self._statics: dict = {}       # static tuple -> its number (the operator's `statics`)
        self._static_values: list = []
        self._out_trees: dict = {}     # statics number -> JAX's output tree (the same for any shapes)
        # With donation: the same function without it (name_functional), which compiled graphs call.
        self._twin = JaxOp(name + "_functional", fn, jit_kwargs=jit_kwargs, autograd=False) if donate else None
        schema = ("(Tensor[] args, Tensor(a!)[] outs, int statics=0) -> ()" if self.donate
                  else "(Tensor[] args, int statics=0) -> Tensor[]")
        ns, _, op = name.partition("::")
        self._lib = _library(ns)
        self._lib.define(op + schema)
        self._lib.impl(op, self._not_on_tpu, "CompositeExplicitAutograd")
        torch.library.register_fake(name, self._fake, lib=self._lib)
        registry.register(name)(self._lower)
        register.register_lowering(name, registry.REGISTRY[name])
        self.overload = getattr(getattr(torch.ops, ns), op).default
        self._raw = self.overload._op   # the dispatcher entry OpOverload.__call__ calls
        self._plain = None              # statics number of all-tensor calls, once seen
        self._plain_one = False         # ... and whether they return one tensor
        # Autograd: JAX's vjp of the function (one more operator, name_vjp) unless register_autograd
        # replaces it. Operators with donation mutate their inputs and have none.
        self._autograd = autograd and not self.donate
        self._vjp = JaxOp(name + "_vjp", self._vjp_fn, jit_kwargs=jit_kwargs, autograd=False) \
            if self._autograd else None
        self._backward_fn = self._default_backward
        self._setup_fn = None
        self._function = _autograd_function(self)
        if not self.donate:
            _C.eager.register_custom_autograd(name, self._with_grad)
            _state.run_as_is(self._with_grad)

    # -- calling ---------------------------------------------------------------------------------
    def __call__(self, *args):
        number = self._plain
        if number is not None and not _is_compiling():
            # the common call, all arguments tensors and no donation: straight to the operator
            for a in args:
                if not isinstance(a, torch.Tensor):
                    break
            else:
                flat = self._raw(list(args), number)
                return flat[0] if self._plain_one else self._unflatten(number, flat)
        return self._call(args)

    def _call(self, args):
        tensors, statics = self._split(args)
        number = self._static_number(statics, [i for i, a in enumerate(args) if not isinstance(a, torch.Tensor)])
        if not self.donate:
            flat = self.overload(tensors, number)
            if not statics and number in self._out_trees:
                self._plain_one = self._out_trees[number] == "one"
                self._plain = number
            return self._unflatten(number, flat)
        positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        by_pos = dict(zip(positions, tensors))
        for i in self.donate:
            if i not in by_pos:
                raise ValueError(f"{self.name}: donated argument {i} is not a tensor")
        types = self._out_types(tuple((tuple(t.shape), t.dtype) for t in tensors), number)
        if max(self.donate.values()) >= len(types):
            raise ValueError(f"{self.name}: an input is donated to output {max(self.donate.values())}, and the "
                             f"function has {len(types)} outputs")
        donated_at = {o: i for i, o in self.donate.items()}
        for k, i in donated_at.items():
            src, (shape, dtype) = by_pos[i], types[k]
            if tuple(src.shape) != shape or src.dtype != dtype:
                raise ValueError(f"{self.name}: input {i} ({tuple(src.shape)}, {src.dtype}) is donated "
                                 f"to output {k} ({shape}, {dtype}): they must have the same shape and dtype")
        if _is_compiling():
            # A mutating custom op reaches a compiled graph wrapped in auto_functionalized; the
            # functional twin plus copy_ into the donated inputs is what functionalization makes of
            # an in-place update, and the graph lowering donates those inputs' buffers.
            twin = self._twin
            flat = twin.overload(tensors, twin._static_number(statics, [i for i, a in enumerate(args)
                                                                         if not isinstance(a, torch.Tensor)]))
            for k, i in donated_at.items():
                by_pos[i].copy_(flat[k])
            return self._unflatten(number, [by_pos[donated_at[k]] if k in donated_at else flat[k]
                                            for k in range(len(types))])
        outs = [by_pos[donated_at[k]] if k in donated_at else torch.empty(shape, dtype=dtype, device=tensors[0].device)
                for k, (shape, dtype) in enumerate(types)]
        rest = [by_pos[i] for i in positions if i not in self.donate]
        self.overload(rest, outs, number)
        return self._unflatten(number, outs)

    @torch._dynamo.assume_constant_result  # torch.compile: traced by JAX here, a constant to Dynamo
    def _out_types(self, in_specs, number) -> tuple:
        """(shape, dtype) per output for inputs of `in_specs` ((shape, dtype) pairs)."""
        return tuple((t.shape, t.dtype) for t in self._program([TensorType(*x) for x in in_specs], number).out_types)

    def _split(self, args):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors:
            raise ValueError(f"{self.name}: needs at least one tensor argument")
        statics = tuple(a for a in args if not isinstance(a, torch.Tensor))
        return tensors, statics

    @torch._dynamo.assume_constant_result  # torch.compile: a constant of the traced call
    def _static_number(self, statics, positions) -> int:
        key = (tuple(positions), statics)
        n = self._statics.get(key)
        if n is None:
            try:
                hash(key)
            except TypeError:
                raise TypeError(f"{self.name}: non-tensor arguments are static (traced as Python values) and must "
                                f"be hashable; got {statics!r}") from None
            with _LOCK:
                n = self._statics.setdefault(key, len(self._static_values))
                if n == len(self._static_values):
                    self._static_values.append(key)
        return n

    def _unflatten(self, number, flat):
        """JAX's output structure from the flat list: one tensor, a tuple, or (nested) the pytree."""
        tree = self._out_trees[number]
        if tree == "one":
            return flat[0]
        if tree == "tuple":
            return tuple(flat)
        if tree == "list":
            return list(flat)
        return tree.unflatten(list(flat))

    # -- tracing ---------------------------------------------------------------------------------
    def _bound(self, number):
        """The JAX function of the tensor arguments alone, the statics of `number` put back."""
        positions, statics = self._static_values[number]
        fn = self.fn
        if not positions:
            return fn

        def bound(*tensors):
            it_t, it_s = iter(tensors), iter(statics)
            n = len(tensors) + len(statics)
            return fn(*[next(it_s) if i in positions else next(it_t) for i in range(n)])
        return bound

    def _program(self, in_types, number):
        p = program(self.name, self._bound(number), in_types, (), self.jit_kwargs, key=(self, number))
        if number not in self._out_trees:
            self._out_trees[number] = _structure(p.out_tree)
        return p

    def _inputs(self, args, outs, number):
        """The JAX function's tensor inputs in order: `args`, with each donated input taken from the
        output slot it is donated to (donate_argnums count every argument, statics included)."""
        static_pos = set(self._static_values[number][0])
        total = len(args) + len(self.donate) + len(static_pos)
        it = iter(args)
        return [outs[self.donate[p]] if p in self.donate else next(it) for p in range(total) if p not in static_pos]

    def _lower(self, ctx, args, *rest):
        """The registry lowering: the kernel's functions called on the argument Values."""
        if self.donate:
            outs, number = rest
            inputs = self._inputs(args, outs, number)
        else:
            (number,) = rest
            inputs = args
        p = self._program([TensorType(tuple(v.shape), v.dtype) for v in inputs], number)
        return p.call(ctx.b, inputs)

    def _fake(self, args, *rest):
        """Shapes only (meta / fake tensors): JAX's abstract evaluation of the function."""
        if self.donate:
            return None
        (number,) = rest if rest else (0,)
        p = self._program([TensorType(tuple(t.shape), t.dtype) for t in args], number)
        return [args[0].new_empty(t.shape, dtype=t.dtype) for t in p.out_types]

    def _not_on_tpu(self, args, *rest):
        """The kernel for every device but tpu: a clear error."""
        tensors = list(args) + (list(rest[0]) if self.donate and rest else [])
        where = next((f"argument {i} is on {t.device}" for i, t in enumerate(tensors) if t.device.type != "tpu"),
                     "no tpu tensor")
        raise RuntimeError(f"{self.name} is a torch_tpu.pallas kernel: it runs on tpu tensors, and {where}. "
                           "Move the tensors with .to('tpu').")

    # -- autograd ---------------------------------------------------------------------------------
    def _with_grad(self, args, number=0):
        """The operator's call when a gradient is needed (csrc/python/custom_autograd.cc)."""
        if not self._autograd:
            raise RuntimeError(f"{self.name} has no backward (it is a backward itself, donates its inputs, or is a "
                               "serialized kernel); call it on tensors that do not require grad")
        return list(self._function.apply(number, *args))

    def _default_backward(self, ctx, grads):
        """JAX's vjp: grads, one per output (None for unused ones) -> one per tensor argument."""
        primals = list(ctx.saved_tensors)
        diff = [t.dtype.is_floating_point or t.dtype.is_complex for t in primals]
        cts = [g if g is not None else torch.zeros(shape, dtype=dtype, device=primals[0].device)
               for g, (shape, dtype) in zip(grads, ctx.out_specs)]
        got = iter(self._vjp(*primals, *cts, ctx.number, tuple(diff), len(primals)))
        return [next(got) if d else None for d in diff]

    def _vjp_fn(self, *args):
        """JAX's vjp of the function: (primals..., cotangents..., statics number, differentiable
        mask, number of primals) -> the cotangents of the differentiable primals."""
        jax = _jax.require()
        *tensors, number, diff, n = args
        primals, cts = tensors[:n], tensors[n:]
        fwd = self._bound(number)
        out, pullback = jax.vjp(fwd, *primals)
        flat, tree = jax.tree_util.tree_flatten(out)
        grads = pullback(jax.tree_util.tree_unflatten(tree, list(cts)))
        return tuple(g for g, d in zip(grads, diff) if d)

    # -- torch.library's registration, for the user to override ------------------------------------
    def register_autograd(self, backward, /, *, setup_context=None):
        """Replaces the default JAX-vjp backward, with torch.library.register_autograd's conventions:
        setup_context(ctx, inputs, output) with inputs = (args, statics number) and output the list of
        results (default: the tensor arguments are saved); backward(ctx, grads) with one gradient per
        result returns one per tensor of `args` (a list, or torch.library's ([...],))."""
        if not self._autograd:
            raise RuntimeError(f"{self.name}: an operator with donation has no autograd")
        self._backward_fn = backward
        self._setup_fn = setup_context

    def register_fake(self, fn, /):
        """Replaces the shape function (JAX's abstract evaluation by default)."""
        torch.library.register_fake(self.name, fn, lib=self._lib, allow_override=True)
        return fn


def _autograd_function(op: JaxOp):
    """The torch.autograd.Function that records op's backward: forward(number, *tensors)."""

    class JaxOpFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, number, *tensors):
            outs = op.overload(list(tensors), number)
            ctx.number = number
            ctx.out_specs = [(tuple(o.shape), o.dtype) for o in outs]
            if op._setup_fn is not None:
                op._setup_fn(ctx, (list(tensors), number), outs)
            else:
                ctx.save_for_backward(*tensors)
            return tuple(outs)

        @staticmethod
        def backward(ctx, *grads):
            got = op._backward_fn(ctx, list(grads))
            if isinstance(got, tuple) and len(got) == 1 and isinstance(got[0], (list, tuple)):
                got = got[0]  # torch.library's convention: a tuple holding the list for `args`
            return (None, *got)

    JaxOpFunction.__name__ = JaxOpFunction.__qualname__ = "JaxOp_" + op.name.replace("::", "_")
    return JaxOpFunction


_LIBS: dict = {}


def _library(ns: str) -> torch.library.Library:
    """The FRAGMENT library defining custom kernels' operators in namespace `ns`."""
    lib = _LIBS.get(ns)
    if lib is None:
        lib = _LIBS[ns] = torch.library.Library(ns, "FRAGMENT")
    return lib


class ModuleOp(JaxOp):
    """A serialized StableHLO module (program.ModuleProgram) as the operator `name`: called with
    tensors of its @main's argument types, returns a list of its results. No static arguments and
    no autograd (its producer, e.g. Inductor, differentiates around it)."""

    def __init__(self, name: str, serialized: bytes):
        self.module = ModuleProgram(name, serialized)
        super().__init__(name, None, autograd=False)

    def _program(self, in_types, number):
        if list(in_types) != self.module.in_types:
            got = [(t.shape, t.dtype) for t in in_types]
            want = [(t.shape, t.dtype) for t in self.module.in_types]
            raise ValueError(f"{self.name}: called with arguments {got}; the kernel takes {want}")
        self._out_trees.setdefault(number, "list")
        return self.module


def _structure(tree):
    """"one" (a single array), "tuple" (a flat tuple of arrays) or the tree itself: the common two
    are rebuilt without JAX, so torch.compile traces the call through."""
    jax = _jax.require()
    if jax.tree_util.treedef_is_leaf(tree):
        return "one"
    if tree == jax.tree_util.tree_structure(tuple(range(tree.num_leaves))):
        return "tuple"
    return tree


def jax_op(name: str, fn=None, *, donate_argnums=()):
    """Wraps JAX function `fn` (it may call `pl.pallas_call`) as the PyTorch operator `name`
    ("namespace::op"); usable as a decorator (`@jax_op("mylib::f")`) or a call. `donate_argnums`:
    input i's buffer is given to output i (the function returns an input's new value in its
    position), and the input is updated in place.
    Returns a JaxOp (callable; keeps register_autograd / register_fake)."""
    def wrap(f):
        return JaxOp(name, f, donate={int(i): int(i) for i in donate_argnums})
    return wrap if fn is None else wrap(fn)


def custom_jax_kernel(jax_fn, name: str | None = None, static_argnums=(), input_output_aliases=None, **jit_kwargs):
    """A function from a JAX kernel library (Tokamax, a Pallas kernel) callable on tpu tensors:
    `custom_jax_kernel(f, name="mylib::f")(x, y, block=128)`. Non-tensor arguments are static
    (static_argnums is accepted for JAX's spelling; every non-tensor argument is static anyway);
    input_output_aliases {input: output} donates inputs to outputs as pallas_call's does; other
    keyword arguments go to jax.jit. Returns a JaxOp."""
    if name is None:
        base = "".join(c if c.isalnum() else "_" for c in getattr(jax_fn, "__name__", "kernel")).strip("_") or "kernel"
        name = f"torch_tpu_jax::{base}_{next(_NAMES)}"
    del static_argnums  # every non-tensor argument is static
    return JaxOp(name, jax_fn, donate=input_output_aliases, jit_kwargs=jit_kwargs)
