"""A typed SSA builder that prints StableHLO as MLIR text (generic op syntax, no MLIR dependency).

Every value has a `TensorType` (shape, torch dtype); each op method infers its result type, so a
lowering never writes a type by hand. The text is compiled by the PJRT plugin (format "mlir").
Op names and attributes follow the StableHLO specification
(https://openxla.org/stablehlo/spec); the builder method names are those op names.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Sequence

import torch

# torch dtype -> StableHLO element type name (the pallas launcher reads it back the other way).
ELEMENT_TYPES = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
    torch.uint8: "ui8", torch.uint16: "ui16", torch.uint32: "ui32", torch.uint64: "ui64",
    torch.bool: "i1", torch.complex64: "complex<f32>", torch.complex128: "complex<f64>",
    torch.float8_e4m3fn: "f8E4M3FN", torch.float8_e5m2: "f8E5M2", torch.float8_e4m3fnuz: "f8E4M3FNUZ",
    torch.float8_e5m2fnuz: "f8E5M2FNUZ", torch.float8_e8m0fnu: "f8E8M0FNU",
}
_FLOAT_BITS = {torch.float32: ("<f", "<I", 8), torch.float64: ("<d", "<Q", 16),
               torch.float16: ("<e", "<H", 4)}


def element_type(dtype: torch.dtype) -> str:
    """MLIR element type of a torch dtype; raises TypeError for dtypes StableHLO cannot hold."""
    try:
        return ELEMENT_TYPES[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} is not supported on the tpu device") from None


@dataclass(frozen=True)
class TensorType:
    """A ranked tensor type: `shape` (tuple of ints, () for 0-dim) and a torch dtype."""
    shape: tuple
    dtype: torch.dtype

    def __str__(self):
        dims = "".join(f"{d}x" for d in self.shape)
        return f"tensor<{dims}{element_type(self.dtype)}>"

    @property
    def rank(self):
        return len(self.shape)

    @property
    def numel(self):
        return math.prod(self.shape)


class Value:
    """An SSA value of a program: its printed name and its TensorType."""
    __slots__ = ("name", "type", "example", "sizes")

    def __init__(self, name: str, type: TensorType, example=None, sizes=None):
        self.name = name
        self.type = type
        # What this value stood for in the op call, for PyTorch's type promotion: a meta tensor
        # (tensor arguments) or a python number (Scalar arguments); None inside programs.
        self.example = example
        # In a bucketed graph (dynamo/buckets.py): per dimension, the int32 scalar Value of its true
        # size where it is symbolic (the type's shape holds its bound), else None. None: all static.
        self.sizes = sizes

    def true_size(self, dim: int):
        """The int32 scalar Value of the true size of dimension `dim` where it is symbolic in a
        bucketed graph (the type holds its bound), None where it is static."""
        return self.sizes[dim] if self.sizes else None

    @property
    def shape(self):
        return self.type.shape

    @property
    def dtype(self):
        return self.type.dtype

    @property
    def rank(self):
        return len(self.type.shape)

    def __repr__(self):
        return f"Value({self.name}: {self.type})"


def i64_array(xs):
    return "array<i64" + ("" if not xs else ": " + ", ".join(str(int(x)) for x in xs)) + ">"


def scalar_literal(value, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_complex:
        c = complex(value)
        return f"({scalar_literal(c.real, torch.float32)}, {scalar_literal(c.imag, torch.float32)})" \
            if dtype == torch.complex64 else \
            f"({scalar_literal(c.real, torch.float64)}, {scalar_literal(c.imag, torch.float64)})"
    if dtype.is_floating_point:
        v = float(value)
        if dtype == torch.bfloat16:  # bits of the float32 rounded to bfloat16 (round to nearest even)
            bits = torch.tensor(v, dtype=torch.bfloat16).view(torch.int16).item() & 0xFFFF
            return f"0x{bits:04X}"
        if dtype.itemsize == 1:  # float8: the bits of PyTorch's rounding of the value
            bits = torch.tensor(v).to(dtype).view(torch.uint8).item()
            return f"0x{bits:02X}"
        fmt, ifmt, width = _FLOAT_BITS[dtype]
        if dtype == torch.float16:
            bits = torch.tensor(v, dtype=torch.float16).view(torch.int16).item() & 0xFFFF
        else:
            bits = struct.unpack(ifmt, struct.pack(fmt, v))[0]
        return f"0x{bits:0{width}X}"
    return str(int(value))


class Builder:
    """Builds one `func.func @main` of a StableHLO module.

    `arg()` adds a parameter; op methods append operations and return Values; `donate(arg, k)`
    lets result k reuse a parameter's buffer; `module(results)` prints the whole module. Regions
    (reduce, sort, scatter bodies) are built by nested builders that share the name counter.
    """

    def __init__(self, counter=None):
        self._lines: list[str] = []
        self._args: list[tuple[Value, str]] = []
        self._donated: dict[str, int] = {}  # parameter name -> result index
        self._counter = counter if counter is not None else [0]
        self._functions: dict[str, str] = {}  # private functions of the module (add_function)

    # -- plumbing ---------------------------------------------------------------------------------
    def _fresh(self) -> str:
        self._counter[0] += 1
        return f"%v{self._counter[0]}"

    def arg(self, type: TensorType, attrs: str = "") -> Value:
        """Adds a parameter of @main; `attrs` is its MLIR attribute dictionary body, if any."""
        v = Value(f"%arg{len(self._args)}", type)
        self._args.append((v, attrs))
        return v

    def donate(self, arg: Value, result: int) -> None:
        """Result `result` of @main may take over parameter `arg`'s buffer (XLA input/output
        aliasing: an in-place update does not double memory). Ignored when their types differ."""
        self._donated[arg.name] = result

    def add_function(self, name: str, text: str) -> None:
        """Adds the private func.func @name (its whole text, e.g. a custom kernel's StableHLO) to the
        module, once; ops call it with `call`."""
        self._functions.setdefault(name, text)

    @property
    def functions(self) -> list[str]:
        """The texts of the functions added with add_function."""
        return list(self._functions.values())

    def call(self, callee: str, operands: Sequence[Value], results: Sequence[TensorType]) -> list[Value]:
        """func.call of the private function @callee (a recorded op, in a fused program)."""
        return self.op("func.call", operands, results, {"callee": "@" + callee})

    def op(self, name: str, operands: Sequence[Value], results: Sequence[TensorType], attrs: dict | None = None,
           regions: Sequence[str] = ()) -> list[Value]:
        """Appends a generic-syntax op `name` and returns its results."""
        operand_list = ", ".join(v.name for v in operands)
        attr_text = ""
        if attrs:
            attr_text = " {" + ", ".join(f"{k} = {v}" for k, v in attrs.items()) + "}"
        region_text = ""
        if regions:
            region_text = " (" + ", ".join(regions) + ")"
        sig = f"({', '.join(str(v.type) for v in operands)}) -> "
        sig += f"({', '.join(str(t) for t in results)})" if len(results) != 1 else str(results[0])
        if len(results) == 0:
            self._lines.append(f'"{name}"({operand_list}){region_text}{attr_text} : {sig}')
            return []
        base = self._fresh()
        lhs = base if len(results) == 1 else f"{base}:{len(results)}"
        self._lines.append(f'{lhs} = "{name}"({operand_list}){region_text}{attr_text} : {sig}')
        if len(results) == 1:
            return [Value(base, results[0])]
        return [Value(f"{base}#{i}", t) for i, t in enumerate(results)]

    def region(self, arg_types: Sequence[TensorType], body) -> str:
        """A single-block region: `body(builder, *block_args)` returns the values to return."""
        sub = Builder(self._counter)
        sub._functions = self._functions  # a region's calls need their functions in the module
        args = [Value(sub._fresh(), t) for t in arg_types]
        results = body(sub, *args)
        if isinstance(results, Value):
            results = [results]
        sub.op("stablehlo.return", results, [])
        head = "^bb0(" + ", ".join(f"{a.name}: {a.type}" for a in args) + "):"
        return "{\n  " + head + "\n    " + "\n    ".join(sub._lines) + "\n  }"

    def function(self, name: str, results: Sequence[Value], public: bool = True) -> str:
        """The func.func text; a private one (for inlining into a bigger program) drops the argument
        attributes (donation hints only mean something on @main)."""
        def attrs(v, a):
            k = self._donated.get(v.name)
            if k is not None and k < len(results) and results[k].type == v.type:
                a = ", ".join(x for x in (a, f"tf.aliasing_output = {k} : i32") if x)
            return f" {{{a}}}" if a and public else ""
        params = ", ".join(f"{v.name}: {v.type}" + attrs(v, a) for v, a in self._args)
        rtypes = ", ".join(str(r.type) for r in results)
        body = "\n    ".join(self._lines)
        ret = f'"func.return"({", ".join(r.name for r in results)}) : ({rtypes}) -> ()'
        return (f"func.func {'public' if public else 'private'} @{name}({params}) -> ({rtypes}) {{\n    {body}\n"
                f"    {ret}\n  }}")

    def module(self, results: Sequence[Value], functions: Sequence[str] = (), name: str = "torch_tpu") -> str:
        """The module: @main returning `results`, and the private `functions` it calls (with those
        added by add_function)."""
        extra = [f for f in self._functions.values() if f not in functions]
        return f"module @{name} {{\n  " + "\n  ".join([self.function("main", results), *functions, *extra]) + "\n}\n"

    def arg_types(self) -> list:
        return [v.type for v, _ in self._args]

    # -- constants and shapes -----------------------------------------------------------------------
    def constant(self, value, dtype: torch.dtype, shape: tuple = ()) -> Value:
        """A splat constant of `shape` (python number, inf and nan included)."""
        t = TensorType(tuple(shape), dtype)
        return self.op("stablehlo.constant", [], [t], {"value": f"dense<{scalar_literal(value, dtype)}> : {t}"})[0]

    def iota(self, shape, dim: int, dtype=torch.int64) -> Value:
        return self.op("stablehlo.iota", [], [TensorType(tuple(shape), dtype)], {"iota_dimension": f"{dim} : i64"})[0]

    def convert(self, x: Value, dtype: torch.dtype) -> Value:
        if x.dtype == dtype:
            return x
        if dtype == torch.bool and not x.dtype == torch.bool:  # nonzero test, as torch's bool cast
            return self.compare(x, self.zeros_like(x), "NE")
        if x.dtype.is_floating_point and not (dtype.is_floating_point or dtype.is_complex):
            return self._float_to_int(x, dtype)
        return self.op("stablehlo.convert", [x], [TensorType(x.shape, dtype)])[0]

    def _float_to_int(self, x: Value, dtype: torch.dtype) -> Value:
        """Float -> integer as PyTorch's CPU kernels do on x86: truncate into int64 (for int64) or
        int32 (for narrower types, then wrap to the width); NaN, inf and values out of that range
        become the minimum integer (XLA would saturate, NaN -> 0)."""
        wide = torch.int64 if dtype == torch.int64 else torch.int32
        if x.dtype in (torch.float16, torch.bfloat16):
            x = self.convert(x, torch.float32)
        bound = float(2 ** (63 if wide == torch.int64 else 31))
        ok = self.and_(self.compare(x, self.full_like(x, -bound), "GE"), self.compare(x, self.full_like(x, bound), "LT"))
        r = self.op("stablehlo.convert", [x], [TensorType(x.shape, wide)])[0]
        r = self.select(ok, r, self.constant(torch.iinfo(wide).min, wide, x.shape))
        return r if wide == dtype else self.op("stablehlo.convert", [r], [TensorType(x.shape, dtype)])[0]

    def bitcast_convert(self, x: Value, dtype: torch.dtype) -> Value:
        return self.op("stablehlo.bitcast_convert", [x], [TensorType(x.shape, dtype)])[0]

    def reshape(self, x: Value, shape) -> Value:
        shape = tuple(int(s) for s in shape)
        if x.shape == shape:
            return x
        return self.op("stablehlo.reshape", [x], [TensorType(shape, x.dtype)])[0]

    def set_dimension_size(self, x: Value, size: Value, dim: int) -> Value:
        """x whose dimension `dim` holds `size` (an int32 scalar Value) valid elements, for XLA's
        dynamic padder; the type keeps the bound (XLA infers the dynamic size from here)."""
        return self.op("stablehlo.set_dimension_size", [x, size], [x.type], {"dimension": f"{dim} : i64"})[0]

    def broadcast_in_dim(self, x: Value, shape, dims) -> Value:
        shape = tuple(shape)
        if x.shape == shape and list(dims) == list(range(len(shape))):
            return x
        return self.op("stablehlo.broadcast_in_dim", [x], [TensorType(shape, x.dtype)],
                       {"broadcast_dimensions": i64_array(dims)})[0]

    def broadcast_to(self, x: Value, shape) -> Value:
        """numpy-style broadcast of x to `shape` (trailing dimensions aligned)."""
        shape = tuple(shape)
        if x.shape == shape:
            return x
        lead = len(shape) - x.rank
        keep = [i for i, s in enumerate(x.shape) if s == shape[lead + i]]
        if len(keep) != x.rank:  # size-1 dims being expanded: drop them first
            x = self.reshape(x, [x.shape[i] for i in keep])
        return self.broadcast_in_dim(x, shape, [lead + i for i in keep])

    def transpose(self, x: Value, perm) -> Value:
        perm = list(perm)
        if perm == list(range(x.rank)):
            return x
        return self.op("stablehlo.transpose", [x], [TensorType(tuple(x.shape[p] for p in perm), x.dtype)],
                       {"permutation": i64_array(perm)})[0]

    def slice(self, x: Value, start, limit, strides=None) -> Value:
        strides = strides or [1] * x.rank
        shape = tuple(max(0, -(-(l - s) // st)) for s, l, st in zip(start, limit, strides))
        if shape == x.shape:
            return x
        return self.op("stablehlo.slice", [x], [TensorType(shape, x.dtype)],
                       {"start_indices": i64_array(start), "limit_indices": i64_array(limit),
                        "strides": i64_array(strides)})[0]

    def concatenate(self, xs: Sequence[Value], dim: int) -> Value:
        if len(xs) == 1:
            return xs[0]
        shape = list(xs[0].shape)
        shape[dim] = sum(x.shape[dim] for x in xs)
        return self.op("stablehlo.concatenate", xs, [TensorType(tuple(shape), xs[0].dtype)],
                       {"dimension": f"{dim} : i64"})[0]

    def pad(self, x: Value, value: Value, low, high, interior=None) -> Value:
        interior = interior or [0] * x.rank
        shape = tuple(lo + hi + s + max(0, s - 1) * it for s, lo, hi, it in zip(x.shape, low, high, interior))
        return self.op("stablehlo.pad", [x, value], [TensorType(shape, x.dtype)],
                       {"edge_padding_low": i64_array(low), "edge_padding_high": i64_array(high),
                        "interior_padding": i64_array(interior)})[0]

    def reverse(self, x: Value, dims) -> Value:
        return self.op("stablehlo.reverse", [x], [x.type], {"dimensions": i64_array(dims)})[0]

    def dynamic_update_slice(self, x: Value, update: Value, starts: Sequence[Value]) -> Value:
        return self.op("stablehlo.dynamic_update_slice", [x, update, *starts], [x.type])[0]

    def dynamic_slice(self, x: Value, starts: Sequence[Value], sizes) -> Value:
        return self.op("stablehlo.dynamic_slice", [x, *starts], [TensorType(tuple(sizes), x.dtype)],
                       {"slice_sizes": i64_array(sizes)})[0]

    # -- elementwise ----------------------------------------------------------------------------------
    def unary(self, name: str, x: Value, dtype=None) -> Value:
        return self.op(f"stablehlo.{name}", [x], [TensorType(x.shape, dtype or x.dtype)])[0]

    def binary(self, name: str, x: Value, y: Value) -> Value:
        return self.op(f"stablehlo.{name}", [x, y], [x.type])[0]

    def add(self, x, y): return self.binary("add", x, y)
    def subtract(self, x, y): return self.binary("subtract", x, y)
    def multiply(self, x, y): return self.binary("multiply", x, y)
    def divide(self, x, y): return self.binary("divide", x, y)
    def maximum(self, x, y): return self.binary("maximum", x, y)
    def minimum(self, x, y): return self.binary("minimum", x, y)
    def power(self, x, y): return self.binary("power", x, y)
    def remainder(self, x, y): return self.binary("remainder", x, y)
    def and_(self, x, y): return self.binary("and", x, y)
    def or_(self, x, y): return self.binary("or", x, y)
    def xor(self, x, y): return self.binary("xor", x, y)
    def negate(self, x): return self.unary("negate", x)
    def not_(self, x): return self.unary("not", x)
    def abs(self, x): return self.unary("abs", x)
    def exp(self, x): return self.unary("exponential", x)
    def log(self, x): return self.unary("log", x)
    def sqrt(self, x): return self.unary("sqrt", x)
    def rsqrt(self, x): return self.unary("rsqrt", x)
    def tanh(self, x): return self.unary("tanh", x)

    def compare(self, x: Value, y: Value, direction: str) -> Value:
        """direction: EQ NE LT LE GT GE. Floats compare as IEEE (NaN is unordered)."""
        if x.dtype == torch.bool or (not x.dtype.is_floating_point and not x.dtype.is_complex and
                                     x.dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64)):
            ctype = "UNSIGNED"
        elif x.dtype.is_floating_point or x.dtype.is_complex:
            ctype = "FLOAT"
        else:
            ctype = "SIGNED"
        return self.op("stablehlo.compare", [x, y], [TensorType(x.shape, torch.bool)],
                       {"comparison_direction": f"#stablehlo<comparison_direction {direction}>",
                        "compare_type": f"#stablehlo<comparison_type {ctype}>"})[0]

    def select(self, pred: Value, on_true: Value, on_false: Value) -> Value:
        return self.op("stablehlo.select", [pred, on_true, on_false], [on_true.type])[0]

    def clamp(self, lo: Value, x: Value, hi: Value) -> Value:
        return self.op("stablehlo.clamp", [lo, x, hi], [x.type])[0]

    def zeros_like(self, x: Value) -> Value:
        return self.constant(0, x.dtype, x.shape)

    def full_like(self, x: Value, value) -> Value:
        return self.constant(value, x.dtype, x.shape)

    def is_nan(self, x: Value) -> Value:
        return self.compare(x, x, "NE")

    def real_part(self, x: Value) -> Value:
        """stablehlo.real of a complex value (a real value is its own real part)."""
        if not x.dtype.is_complex:
            return x
        return self.op("stablehlo.real", [x], [TensorType(x.shape, x.dtype.to_real())])[0]

    def imag_part(self, x: Value) -> Value:
        """stablehlo.imag of a complex value (zeros for a real value)."""
        if not x.dtype.is_complex:
            return self.zeros_like(x)
        return self.op("stablehlo.imag", [x], [TensorType(x.shape, x.dtype.to_real())])[0]

    def make_complex(self, re: Value, im: Value) -> Value:
        """stablehlo.complex of two float32 / float64 values of one shape and dtype."""
        return self.op("stablehlo.complex", [re, im], [TensorType(re.shape, re.dtype.to_complex())])[0]

    # -- reductions, contractions, windows -----------------------------------------------------------
    def reduce(self, xs: Sequence[Value], inits: Sequence[Value], dims, body) -> list[Value]:
        """stablehlo.reduce over `dims`; `body(b, *accs, *elems)` returns the new accumulators."""
        dims = sorted(dims)
        out_shape = tuple(s for i, s in enumerate(xs[0].shape) if i not in dims)
        scalar_types = [TensorType((), x.dtype) for x in xs]
        region = self.region(scalar_types + scalar_types, body)
        return self.op("stablehlo.reduce", [*xs, *inits], [TensorType(out_shape, x.dtype) for x in xs],
                       {"dimensions": i64_array(dims)}, regions=[region])

    def reduce_window(self, xs, inits, window, strides, padding, body, base_dilations=None,
                      window_dilations=None) -> list[Value]:
        rank = xs[0].rank
        base_dilations = base_dilations or [1] * rank
        window_dilations = window_dilations or [1] * rank
        shape = []
        for i in range(rank):
            size = (xs[0].shape[i] - 1) * base_dilations[i] + 1 + padding[i][0] + padding[i][1]
            eff = (window[i] - 1) * window_dilations[i] + 1
            shape.append(max(0, (size - eff) // strides[i] + 1))
        scalar_types = [TensorType((), x.dtype) for x in xs]
        region = self.region(scalar_types + scalar_types, body)
        pad = ", ".join(f"[{lo}, {hi}]" for lo, hi in padding)
        return self.op("stablehlo.reduce_window", [*xs, *inits], [TensorType(tuple(shape), x.dtype) for x in xs],
                       {"window_dimensions": i64_array(window), "window_strides": i64_array(strides),
                        "base_dilations": i64_array(base_dilations),
                        "window_dilations": i64_array(window_dilations),
                        "padding": f"dense<[{pad}]> : tensor<{rank}x2xi64>"}, regions=[region])

    # -- indexing ---------------------------------------------------------------------------------------
    def gather(self, x: Value, idx: Value, offset_dims, collapsed, start_index_map, index_vector_dim,
               slice_sizes, out_shape) -> Value:
        attr = (f"#stablehlo.gather<offset_dims = [{', '.join(map(str, offset_dims))}], "
                f"collapsed_slice_dims = [{', '.join(map(str, collapsed))}], "
                f"start_index_map = [{', '.join(map(str, start_index_map))}], "
                f"index_vector_dim = {index_vector_dim}>")
        return self.op("stablehlo.gather", [x, idx], [TensorType(tuple(out_shape), x.dtype)],
                       {"dimension_numbers": attr, "slice_sizes": i64_array(slice_sizes),
                        "indices_are_sorted": "false"})[0]

    def scatter(self, x: Value, idx: Value, upd: Value, update_window_dims, inserted_window_dims,
                scatter_dims_to_operand_dims, index_vector_dim, combine=None) -> Value:
        """stablehlo.scatter; `combine(b, old, new)` (default: take the update)."""
        combine = combine or (lambda b, old, new: new)
        region = self.region([TensorType((), x.dtype)] * 2, combine)
        attr = (f"#stablehlo.scatter<update_window_dims = [{', '.join(map(str, update_window_dims))}], "
                f"inserted_window_dims = [{', '.join(map(str, inserted_window_dims))}], "
                f"scatter_dims_to_operand_dims = [{', '.join(map(str, scatter_dims_to_operand_dims))}], "
                f"index_vector_dim = {index_vector_dim}>")
        return self.op("stablehlo.scatter", [x, idx, upd], [x.type],
                       {"scatter_dimension_numbers": attr, "indices_are_sorted": "false",
                        "unique_indices": "false"}, regions=[region])[0]

    def sort(self, xs: Sequence[Value], dim: int, comparator, stable=True) -> list[Value]:
        region = self.region([TensorType((), x.dtype) for x in xs for _ in (0, 1)], comparator)
        return self.op("stablehlo.sort", xs, [x.type for x in xs],
                       {"dimension": f"{dim} : i64", "is_stable": "true" if stable else "false"},
                       regions=[region])

    def rng_bit_generator(self, state: Value, shape, dtype=torch.uint32) -> tuple[Value, Value]:
        """Threefry random bits of `shape`; state is a ui64 tensor<2> (key, counter)."""
        out = self.op("stablehlo.rng_bit_generator", [state], [state.type, TensorType(tuple(shape), dtype)],
                      {"rng_algorithm": "#stablehlo<rng_algorithm THREE_FRY>"})
        return out[0], out[1]
