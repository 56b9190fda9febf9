"""Elementwise ops: arithmetic, comparisons, where, unary math, activations and their backward,
casts, fill and copy. PyTorch's semantics: type promotion from the meta result, integer division
and rounding modes as on CPU, NaN propagation in maximum/minimum/clamp."""
from __future__ import annotations

import math

import torch

from .helpers import arith
from .helpers.checks import not_implemented
from .registry import register


def _is_float(dt):
    return dt.is_floating_point or dt.is_complex


def operand(ctx, x, dtype, shape=None, *, via=None):
    """x (Value) converted to dtype and broadcast to shape (default: the op's first output shape).
    via: the op's common dtype, which x is rounded to first, as CPU's TensorIterator casts a 0-dim
    operand or python number to the common dtype before a half-precision kernel upcasts to float32
    (bf16_t % float64_0dim divides by the bfloat16 rounding of the divisor)."""
    b = ctx.b
    shape = ctx.out[0].shape if shape is None else shape
    if via is not None:
        x = b.convert(x, via)
    return b.broadcast_to(b.convert(x, dtype), shape)


def compute_dtype(dt):
    """Half-precision math is done in float32 and rounded once, as PyTorch's CPU kernels do; float8
    too (CPU has few float8 kernels; CUDA's upcast)."""
    return torch.float32 if dt in (torch.float16, torch.bfloat16) or (dt.is_floating_point and dt.itemsize == 1) else dt


def rounded_operand(ctx, x):
    """x as the op's compute dtype, rounded to its output dtype first (operand's via)."""
    out = ctx.out[0].dtype
    return operand(ctx, x, compute_dtype(out), via=out)


def _finish(ctx, r):
    return ctx.b.convert(r, ctx.out[0].dtype)


# -- add / sub / mul / div --------------------------------------------------------------------------
def _scaled(ctx, y, alpha, cd):
    """alpha * y; alpha rounded to the result dtype first, as CPU's add kernel casts it to scalar_t
    before its half-precision math upcasts (bfloat16 add(alpha=2.0315) scales by 2.03125)."""
    b = ctx.b
    out = ctx.out[0].dtype
    y = operand(ctx, y, cd, via=out)
    if alpha is None:
        return y
    return b.multiply(y, operand(ctx, alpha, cd, via=out))


def _alpha_check(ctx, alpha):
    """CPU's alpha_check (BinaryOps.cpp) on alpha's kind (the eager key fixes it: a Python bool, int,
    float or complex arrives as an i1, i64, float or complex operand), which PyTorch's meta kernels
    skip for bool results: torch.add(bool_t, bool_t, alpha=1.5) ran."""
    if alpha is None:
        return
    dtype, kind = ctx.out[0].dtype, alpha.type.dtype
    if kind == torch.bool and dtype != torch.bool:
        raise RuntimeError("Boolean alpha only supported for Boolean results.")
    if not (dtype.is_floating_point or dtype.is_complex) and (kind.is_floating_point or kind.is_complex):
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating point number.")
    if not dtype.is_complex and kind.is_complex:
        raise RuntimeError("For non-complex input tensors, argument alpha must not be a complex number.")


@register("add.Tensor", "add.Scalar")
def add(ctx, x, y, alpha=None):
    _alpha_check(ctx, alpha)
    cd = compute_dtype(ctx.out[0].dtype)
    b = ctx.b
    if cd == torch.bool:
        return b.or_(operand(ctx, x, cd), _scaled(ctx, y, alpha, cd))
    return _finish(ctx, b.add(rounded_operand(ctx, x), _scaled(ctx, y, alpha, cd)))


def _no_bool_sub(x, y):
    """CPU's sub_check for one bool operand (two are refused by the meta kernel first)."""
    if any(getattr(v, "dtype", None) == torch.bool for v in (x, y)):
        raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying "
                           "to invert a mask, use the `~` or `logical_not()` operator instead.")


@register("sub.Tensor", "sub.Scalar")
def sub(ctx, x, y, alpha=None):
    _no_bool_sub(x, y)
    _alpha_check(ctx, alpha)
    cd = compute_dtype(ctx.out[0].dtype)
    return _finish(ctx, ctx.b.subtract(rounded_operand(ctx, x), _scaled(ctx, y, alpha, cd)))


@register("rsub.Tensor", "rsub.Scalar")
def rsub(ctx, x, y, alpha=None):
    _no_bool_sub(x, y)
    _alpha_check(ctx, alpha)
    cd = compute_dtype(ctx.out[0].dtype)
    return _finish(ctx, ctx.b.subtract(rounded_operand(ctx, y), _scaled(ctx, x, alpha, cd)))


@register("mul.Tensor", "mul.Scalar")
def mul(ctx, x, y):
    cd = compute_dtype(ctx.out[0].dtype)
    b = ctx.b
    if cd == torch.bool:
        return b.and_(operand(ctx, x, cd), operand(ctx, y, cd))
    # CPU's mul and div kernels read a scalar second operand unrounded (original_scalar_value)
    return _finish(ctx, b.multiply(rounded_operand(ctx, x), operand(ctx, y, cd)))


def _floor_div_float(b, x, y, out):
    """x // y for floats as CPU's div_floor_floating: through fmod, so that an infinite dividend
    gives NaN (-inf // 4 is nan, as in Python) and the quotient is exact where x / y rounds across an
    integer; a zero divisor gives x / y. Each step is rounded to out, as CPU's half-precision kernel
    does."""
    def r(v):
        return b.convert(b.convert(v, out), v.dtype) if out != v.dtype else v
    q = r(b.divide(x, y))
    mod = r(b.remainder(x, y))
    zero, one = b.zeros_like(q), b.full_like(q, 1)
    div = r(b.divide(r(b.subtract(x, mod)), y))
    wrong_sign = b.and_(b.compare(mod, zero, "NE"), b.compare(b.compare(y, zero, "LT"), b.compare(mod, zero, "LT"), "NE"))
    div = b.select(wrong_sign, r(b.subtract(div, one)), div)
    floor = b.unary("floor", div)
    floor = b.select(b.compare(r(b.subtract(div, floor)), b.full_like(q, 0.5), "GT"), r(b.add(floor, one)), floor)
    signed_zero = b.multiply(q, zero)  # copysign(0, x / y): q is finite where it is taken
    result = b.select(b.compare(div, zero, "NE"), floor, signed_zero)
    return b.select(b.compare(y, zero, "EQ"), q, result)


def _div(ctx, x, y, mode):
    b = ctx.b
    out = ctx.out[0].dtype
    if _is_float(out):
        cd = compute_dtype(out)
        q = b.divide(rounded_operand(ctx, x), operand(ctx, y, cd))
        if mode == "trunc":
            q = b.select(b.compare(q, b.zeros_like(q), "LT"), b.unary("ceil", q), b.unary("floor", q))
        elif mode == "floor":
            # CPU's half-precision kernel rounds each step, but its scalar-divisor path (a one-element
            # y, read unrounded) computes in float32
            q = _floor_div_float(b, rounded_operand(ctx, x), operand(ctx, y, cd), cd if math.prod(y.shape) == 1 else out)
        return _finish(ctx, q)
    # Integer inputs: true division is float (out is float then); trunc/floor stay integer.
    xi, yi = operand(ctx, x, out), operand(ctx, y, out)
    return b.divide(xi, yi) if mode == "trunc" else arith.floor_div_int(b, xi, yi)


@register("div.Tensor", "div.Scalar")
def div(ctx, x, y):
    return _div(ctx, x, y, None)


@register("div.Tensor_mode", "div.Scalar_mode")
def div_mode(ctx, x, y, rounding_mode=None):
    return _div(ctx, x, y, rounding_mode)


@register("floor_divide", "floor_divide.Scalar")
def floor_divide(ctx, x, y):
    return _div(ctx, x, y, "floor")


@register("remainder.Tensor", "remainder.Scalar", "remainder.Scalar_Tensor")
def remainder(ctx, x, y):
    """Python-style modulus: the result takes the sign of the divisor."""
    b = ctx.b
    xv, yv = rounded_operand(ctx, x), rounded_operand(ctx, y)
    r = b.remainder(xv, yv)
    zero = b.zeros_like(r)
    fix = b.and_(b.compare(r, zero, "NE"), b.compare(b.compare(r, zero, "LT"), b.compare(yv, zero, "LT"), "NE"))
    return _finish(ctx, b.select(fix, b.add(r, yv), r))


@register("fmod.Tensor", "fmod.Scalar")
def fmod(ctx, x, y):
    return _finish(ctx, ctx.b.remainder(rounded_operand(ctx, x), rounded_operand(ctx, y)))


@register("pow.Tensor_Tensor", "pow.Tensor_Scalar", "pow.Scalar")
def pow_(ctx, x, y):
    b = ctx.b
    out = ctx.out[0].dtype
    if all(getattr(v, "dtype", None) == torch.bool for v in (x, y)):  # CPU has no bool ** bool kernel
        not_implemented("pow", torch.bool)
    cd = compute_dtype(out)
    if not (cd.is_floating_point or cd.is_complex or cd == torch.bool):
        return _finish(ctx, _int_pow(b, operand(ctx, x, cd), operand(ctx, y, cd)))
    xv, yv = rounded_operand(ctx, x), rounded_operand(ctx, y)
    r = b.power(xv, yv)
    if cd.is_complex:
        r = _complex_zero_base(b, xv, yv, r)
    return _finish(ctx, r)


def _complex_zero_base(b, x, y, r):
    """0 ** y for complex y as CPU's exp(y * log(0)) with C99's special values: 0 where Re(y) > 0,
    inf+nanj where Re(y) < 0, else nan+nanj (0 ** 0j included); XLA's power gives nan+nanj or 1."""
    part = x.dtype.to_real()
    zero = b.constant(0, x.dtype, x.shape)
    a = b.real_part(y)
    nan = b.constant(math.nan, part, x.shape)
    re = b.select(b.compare(a, b.zeros_like(a), "GT"), b.zeros_like(a),
                  b.select(b.compare(a, b.zeros_like(a), "LT"), b.constant(math.inf, part, x.shape), nan))
    im = b.select(b.compare(a, b.zeros_like(a), "GT"), b.zeros_like(a), nan)
    return b.select(b.compare(x, zero, "EQ"), b.make_complex(re, im), r)


def _int_pow(b, x, e):
    """x ** e for integers, wrapping as CPU's kernel does, by squaring over every bit of the exponent:
    XLA's integer power (CPU plugin) looks at the exponent's low 6 bits only ((-9) ** 129 gave -9).
    A negative exponent gives 1 for x == 1, +-1 for x == -1, else 0 (CPU's)."""
    dt = x.dtype
    shape = x.shape if x.rank >= e.rank else e.shape
    x, e = b.broadcast_to(x, shape), b.broadcast_to(e, shape)

    def k(v):
        return b.constant(v, dt, shape)
    one, zero = k(1), k(0)
    neg = b.compare(e, zero, "LT") if dt.is_signed else None
    rest = b.select(neg, zero, e) if neg is not None else e
    result, base = one, x
    for _ in range(torch.iinfo(dt).bits - (1 if dt.is_signed else 0)):
        odd = b.compare(b.remainder(rest, k(2)), one, "EQ")
        result = b.select(odd, b.multiply(result, base), result)
        base = b.multiply(base, base)
        rest = b.divide(rest, k(2))
    if neg is None:
        return result
    minus_one = b.compare(x, k(-1), "EQ")
    odd_e = b.compare(b.remainder(e, k(2)), zero, "NE")
    small = b.select(b.compare(x, one, "EQ"), one, b.select(minus_one, b.select(odd_e, k(-1), one), zero))
    return b.select(neg, small, result)


# XLA's maximum / minimum propagate NaN on every backend, as torch.maximum / minimum do.
@register("maximum")
def maximum(ctx, x, y):
    if ctx.out[0].dtype.is_complex:
        raise RuntimeError("maximum not implemented for complex tensors.")
    return _finish(ctx, ctx.b.binary("maximum", rounded_operand(ctx, x), rounded_operand(ctx, y)))


@register("minimum")
def minimum(ctx, x, y):
    if ctx.out[0].dtype.is_complex:
        raise RuntimeError("minimum not implemented for complex tensors.")
    return _finish(ctx, ctx.b.binary("minimum", rounded_operand(ctx, x), rounded_operand(ctx, y)))


def _nan_ignoring(name):
    """fmax / fmin: like maximum / minimum, but a NaN loses to a number."""
    op = "fmax" if name == "maximum" else "fmin"

    def lower(ctx, x, y):
        if ctx.out[0].dtype.is_complex:
            raise RuntimeError(f"{op} not implemented for complex tensors.")
        b = ctx.b
        cd = compute_dtype(ctx.out[0].dtype)
        xv, yv = rounded_operand(ctx, x), rounded_operand(ctx, y)
        r = b.binary(name, xv, yv)
        if cd.is_floating_point:
            r = b.select(b.is_nan(xv), yv, b.select(b.is_nan(yv), xv, r))
        return _finish(ctx, r)
    return lower


register("fmax")(_nan_ignoring("maximum"))
register("fmin")(_nan_ignoring("minimum"))


@register("atan2")
def atan2(ctx, x, y):
    return _finish(ctx, ctx.b.binary("atan2", rounded_operand(ctx, x), rounded_operand(ctx, y)))


@register("copysign.Tensor", "copysign.Scalar")
def copysign(ctx, x, y):
    b = ctx.b
    cd = compute_dtype(ctx.out[0].dtype)
    xv, yv = b.abs(rounded_operand(ctx, x)), rounded_operand(ctx, y)
    # the sign bit of y, -0.0 included
    bits = {torch.float32: torch.int32, torch.float64: torch.int64}[cd]
    neg = b.compare(b.bitcast_convert(yv, bits), b.constant(0, bits, yv.shape), "LT")
    return _finish(ctx, b.select(neg, b.negate(xv), xv))


for _name, _fn in (("bitwise_and", "and_"), ("bitwise_or", "or_"), ("bitwise_xor", "xor")):
    register(f"{_name}.Tensor", f"{_name}.Scalar")(
        (lambda fn: lambda ctx, x, y: getattr(ctx.b, fn)(operand(ctx, x, ctx.out[0].dtype),
                                                          operand(ctx, y, ctx.out[0].dtype)))(_fn))

for _name, _fn in (("logical_and", "and_"), ("logical_or", "or_"), ("logical_xor", "xor")):
    register(_name)((lambda fn: lambda ctx, x, y: ctx.b.convert(getattr(ctx.b, fn)(
        operand(ctx, x, torch.bool), operand(ctx, y, torch.bool)), ctx.out[0].dtype))(_fn))


@register("logical_not")
def logical_not(ctx, x):
    return ctx.b.convert(ctx.b.not_(ctx.b.convert(x, torch.bool)), ctx.out[0].dtype)


@register("bitwise_not")
def bitwise_not(ctx, x):
    return ctx.b.not_(x)


# -- comparisons ------------------------------------------------------------------------------------
def _comparison(direction):
    def lower(ctx, x, y):
        cd = ctx.promote(x, y)
        return ctx.b.compare(operand(ctx, x, cd), operand(ctx, y, cd), direction)
    return lower


for _name, _dir in (("eq", "EQ"), ("ne", "NE"), ("lt", "LT"), ("le", "LE"), ("gt", "GT"), ("ge", "GE")):
    register(f"{_name}.Tensor", f"{_name}.Scalar")(_comparison(_dir))


@register("where.self")
def where(ctx, cond, x, y):
    out = ctx.out[0].dtype
    return ctx.b.select(operand(ctx, cond, torch.bool), operand(ctx, x, out), operand(ctx, y, out))


@register("clamp", "clamp.Tensor")
def clamp(ctx, x, lo=None, hi=None):
    b = ctx.b
    out = ctx.out[0].dtype
    cd = compute_dtype(out)
    r = operand(ctx, x, cd)
    if lo is not None:
        lv = operand(ctx, lo, cd)
        r = b.maximum(r, lv)
    if hi is not None:
        hv = operand(ctx, hi, cd)
        r = b.minimum(r, hv)
    return _finish(ctx, r)


@register("clamp_min", "clamp_min.Tensor")
def clamp_min(ctx, x, lo):
    return clamp(ctx, x, lo, None)


@register("clamp_max", "clamp_max.Tensor")
def clamp_max(ctx, x, hi):
    return clamp(ctx, x, None, hi)


@register("lerp.Scalar", "lerp.Tensor")
def lerp(ctx, x, end, weight):
    b = ctx.b
    if not (ctx.out[0].dtype.is_floating_point or ctx.out[0].dtype.is_complex):
        not_implemented("lerp", ctx.out[0].dtype)
    cd = compute_dtype(ctx.out[0].dtype)
    xv, ev, wv = operand(ctx, x, cd), operand(ctx, end, cd), operand(ctx, weight, cd)
    # PyTorch's formula: weight < 0.5 ? x + w*(e-x) : e - (e-x)*(1-w)
    diff = b.subtract(ev, xv)
    lo = b.add(xv, b.multiply(wv, diff))
    hi = b.subtract(ev, b.multiply(diff, b.subtract(b.full_like(wv, 1), wv)))
    if cd.is_complex:  # |w| < 0.5 on the modulus
        from .builder import TensorType
        aw = b.op("stablehlo.abs", [wv], [TensorType(wv.shape, torch.float64 if cd == torch.complex128 else torch.float32)])[0]
    else:
        aw = b.abs(wv)
    return _finish(ctx, b.select(b.compare(aw, b.full_like(aw, 0.5), "LT"), lo, hi))


def _add_scaled(combine):
    """addcmul / addcdiv: x + value * combine(t1, t2)."""
    def lower(ctx, x, t1, t2, value):
        b = ctx.b
        cd = compute_dtype(ctx.out[0].dtype)
        prod = getattr(b, combine)(operand(ctx, t1, cd), operand(ctx, t2, cd))
        return _finish(ctx, b.add(operand(ctx, x, cd), b.multiply(operand(ctx, value, cd), prod)))
    return lower


register("addcmul")(_add_scaled("multiply"))
register("addcdiv")(_add_scaled("divide"))


# -- unary math -------------------------------------------------------------------------------------
def unary_float(op_name):
    """Float-valued unary op; integer inputs are promoted to the float result dtype first."""
    def lower(ctx, x):
        cd = compute_dtype(ctx.out[0].dtype)
        return _finish(ctx, ctx.b.op(op_name, [ctx.b.convert(x, cd)], [ctx.b.convert(x, cd).type])[0])
    return lower


for _name, _op in (("exp", "stablehlo.exponential"), ("expm1", "stablehlo.exponential_minus_one"),
                   ("log", "stablehlo.log"), ("log1p", "stablehlo.log_plus_one"), ("sqrt", "stablehlo.sqrt"),
                   ("rsqrt", "stablehlo.rsqrt"), ("sin", "stablehlo.sine"), ("cos", "stablehlo.cosine"),
                   ("tan", "chlo.tan"), ("tanh", "stablehlo.tanh"), ("sigmoid", "stablehlo.logistic"),
                   ("asin", "chlo.asin"), ("acos", "chlo.acos"), ("atan", "chlo.atan"), ("sinh", "chlo.sinh"),
                   ("cosh", "chlo.cosh"), ("asinh", "chlo.asinh"), ("acosh", "chlo.acosh"),
                   ("atanh", "chlo.atanh"), ("erf", "chlo.erf"), ("erfc", "chlo.erfc"), ("erfinv", "chlo.erf_inv"),
                   ("lgamma", "chlo.lgamma")):
    register(_name)(unary_float(_op))


@register("digamma")
def digamma(ctx, x):
    """CPU's poles: digamma(+0) = -inf, digamma(-0) = +inf (chlo.digamma gives NaN there)."""
    b = ctx.b
    cd = compute_dtype(ctx.out[0].dtype)
    xv = b.convert(x, cd)
    r = b.op("chlo.digamma", [xv], [xv.type])[0]
    bits = torch.int64 if cd == torch.float64 else torch.int32
    neg = b.compare(b.bitcast_convert(xv, bits), b.constant(0, bits, xv.shape), "LT")
    pole = b.select(neg, b.full_like(xv, math.inf), b.full_like(xv, -math.inf))
    return _finish(ctx, b.select(b.compare(xv, b.zeros_like(xv), "EQ"), pole, r))


@register("exp2")
def exp2(ctx, x):
    b = ctx.b
    cd = compute_dtype(ctx.out[0].dtype)
    xv = b.convert(x, cd)
    return _finish(ctx, b.power(b.full_like(xv, 2.0), xv))


def _log_base(base):
    """log2 / log10: ln(x) / ln(base)."""
    def lower(ctx, x):
        b = ctx.b
        xv = b.convert(x, compute_dtype(ctx.out[0].dtype))
        return _finish(ctx, b.divide(b.log(xv), b.full_like(xv, math.log(base))))
    return lower


register("log2")(_log_base(2.0))
register("log10")(_log_base(10.0))


@register("reciprocal")
def reciprocal(ctx, x):
    b = ctx.b
    cd = compute_dtype(ctx.out[0].dtype)
    xv = b.convert(x, cd)
    return _finish(ctx, b.divide(b.full_like(xv, 1), xv))


@register("_conj_physical")
def conj_physical(ctx, x):
    b = ctx.b
    if not x.dtype.is_complex:
        return x
    from .builder import TensorType
    rt = TensorType(x.shape, torch.float64 if x.dtype == torch.complex128 else torch.float32)
    re = b.op("stablehlo.real", [x], [rt])[0]
    im = b.op("stablehlo.imag", [x], [rt])[0]
    return b.op("stablehlo.complex", [re, b.negate(im)], [x.type])[0]


@register("neg")
def neg(ctx, x):
    return ctx.b.negate(x)


@register("abs")
def abs_(ctx, x):
    if x.dtype == torch.bool:
        not_implemented("abs", x.dtype)
    if x.dtype.is_complex:  # the modulus: a real result, inf where a part is inf, NaN or not (hypot, as CPU)
        b = ctx.b
        m = b.op("stablehlo.abs", [x], [ctx.out[0]])[0]
        return b.select(_per_part(b, x, lambda v: _is_inf(b, v), b.or_), b.full_like(m, math.inf), m)
    if x.dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):  # StableHLO's abs is signed only
        return x
    return ctx.b.abs(x)


@register("sign", "sgn")
def sign(ctx, x):
    b = ctx.b
    if x.dtype == torch.bool:
        return x
    if x.dtype.is_complex:  # sgn: z / |z|, 0 at 0 (StableHLO's complex sign)
        return b.unary("sign", x)
    if x.dtype.is_floating_point:  # NaN -> 0 as on CPU ((0 < x) - (x < 0)); StableHLO gives NaN
        zero = b.zeros_like(x)
        return b.select(b.or_(b.is_nan(x), b.compare(x, zero, "EQ")), zero, b.unary("sign", x))
    zero = b.zeros_like(x)
    one = b.full_like(x, 1)
    return b.select(b.compare(x, zero, "GT"), one, b.select(b.compare(x, zero, "LT"), b.negate(one), zero))


def _int_identity_or(op_name, name):
    def lower(ctx, x):
        if x.dtype == torch.bool:  # PyTorch rounds integers (identity), not bools
            not_implemented(name, x.dtype)
        if not x.dtype.is_floating_point:
            return x
        return ctx.b.unary(op_name, x)
    return lower


register("floor")(_int_identity_or("floor", "floor"))
register("ceil")(_int_identity_or("ceil", "ceil"))
register("round")(_int_identity_or("round_nearest_even", "round"))


@register("trunc")
def trunc(ctx, x):
    b = ctx.b
    if x.dtype == torch.bool:
        not_implemented("trunc", x.dtype)
    if not x.dtype.is_floating_point:
        return x
    return b.select(b.compare(x, b.zeros_like(x), "LT"), b.unary("ceil", x), b.unary("floor", x))


@register("frac")
def frac(ctx, x):
    if not x.dtype.is_floating_point:  # PyTorch's frac is for floating types only
        not_implemented("frac", x.dtype)
    return ctx.b.subtract(x, trunc(ctx, x))


@register("round.decimals")
def round_decimals(ctx, x, decimals=0):
    b = ctx.b
    if not x.dtype.is_floating_point:
        not_implemented("round", x.dtype)
    cd = compute_dtype(x.dtype)
    xv = b.convert(x, cd)
    scale = b.full_like(xv, 10.0 ** decimals)
    return _finish(ctx, b.divide(b.unary("round_nearest_even", b.multiply(xv, scale)), scale))


def _is_inf(b, v):
    """+-inf of a real value."""
    return b.compare(b.abs(v), b.full_like(v, math.inf), "EQ")


def _per_part(b, x, test, join):
    """A float predicate of x; of a complex x, the predicate of its real and imaginary parts joined
    by `join` (CPU: isnan / isinf of either part, isfinite of both)."""
    if x.dtype.is_complex:
        return join(test(b.real_part(x)), test(b.imag_part(x)))
    return test(x)


@register("isnan")
def isnan(ctx, x):
    b = ctx.b
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        return b.constant(False, torch.bool, x.shape)
    return _per_part(b, x, b.is_nan, b.or_)


@register("isinf")
def isinf(ctx, x):
    b = ctx.b
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        return b.constant(False, torch.bool, x.shape)
    return _per_part(b, x, lambda v: _is_inf(b, v), b.or_)


@register("isfinite")
def isfinite(ctx, x):
    b = ctx.b
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        return b.constant(True, torch.bool, x.shape)
    return _per_part(b, x, lambda v: b.unary("is_finite", v, torch.bool), b.and_)


@register("signbit")
def signbit(ctx, x):
    b = ctx.b
    if x.dtype == torch.bool:
        return b.constant(False, torch.bool, x.shape)
    if not x.dtype.is_floating_point:
        return b.compare(x, b.zeros_like(x), "LT")
    xv = b.convert(x, torch.float32) if x.dtype != torch.float64 else x
    bits = torch.int64 if xv.dtype == torch.float64 else torch.int32
    return b.compare(b.bitcast_convert(xv, bits), b.constant(0, bits, x.shape), "LT")


@register("nan_to_num")
def nan_to_num(ctx, x, nan=None, posinf=None, neginf=None):
    """NaN, +inf, -inf replaced (defaults: 0, the dtype's largest and lowest finite values); a complex
    x part by part, with its parts' dtype's limits (CPU's kernel)."""
    b = ctx.b
    if x.dtype.is_complex:
        return b.make_complex(*[_replace_nonfinite(b, p, nan, posinf, neginf) for p in (b.real_part(x), b.imag_part(x))])
    if not x.dtype.is_floating_point:
        return x
    return _replace_nonfinite(b, x, nan, posinf, neginf)


def _replace_nonfinite(b, x, nan, posinf, neginf):
    fi = torch.finfo(x.dtype)
    r = b.select(b.is_nan(x), b.full_like(x, 0.0 if nan is None else nan), x)
    r = b.select(b.compare(r, b.full_like(x, math.inf), "EQ"), b.full_like(x, fi.max if posinf is None else posinf), r)
    r = b.select(b.compare(r, b.full_like(x, -math.inf), "EQ"), b.full_like(x, fi.min if neginf is None else neginf), r)
    return r


# -- activations and their backward ---------------------------------------------------------------
@register("relu")
def relu(ctx, x):
    if x.dtype == torch.bool:
        raise RuntimeError("Boolean inputs not supported for relu")
    b = ctx.b
    return b.select(b.compare(x, b.zeros_like(x), "GT"), x, b.select(b.is_nan(x), x, b.zeros_like(x))) \
        if x.dtype.is_floating_point else b.maximum(x, b.zeros_like(x))


@register("threshold")
def threshold(ctx, x, threshold, value):
    """x <= threshold ? value : x, compared in the compute dtype as CPU's half-precision kernel does
    (a bfloat16 0.33398 stays above threshold 0.3337, which bfloat16 would round to 0.33398)."""
    b = ctx.b
    cd = compute_dtype(x.dtype)
    t = operand(ctx, threshold, cd, x.shape)
    below = b.compare(b.convert(x, cd), t, "LE")
    return b.select(below, operand(ctx, value, x.dtype, x.shape), x)


@register("threshold_backward")
def threshold_backward(ctx, grad, x, threshold):
    b = ctx.b
    cd = compute_dtype(x.dtype)
    t = operand(ctx, threshold, cd)
    g = operand(ctx, grad, ctx.out[0].dtype)
    return b.select(b.compare(operand(ctx, x, cd), t, "LE"), b.zeros_like(g), g)


@register("gelu")
def gelu(ctx, x, approximate="none"):
    b = ctx.b
    cd = compute_dtype(x.dtype)
    xv = b.convert(x, cd)
    half = b.full_like(xv, 0.5)
    one = b.full_like(xv, 1.0)
    if approximate == "tanh":
        inner = b.multiply(b.full_like(xv, math.sqrt(2 / math.pi)),
                           b.add(xv, b.multiply(b.full_like(xv, 0.044715), b.multiply(xv, b.multiply(xv, xv)))))
        r = b.multiply(b.multiply(half, xv), b.add(one, b.tanh(inner)))
    else:
        erf = b.op("chlo.erf", [b.multiply(xv, b.full_like(xv, 1 / math.sqrt(2)))], [xv.type])[0]
        r = b.multiply(b.multiply(half, xv), b.add(one, erf))
    return _finish(ctx, r)


@register("gelu_backward")
def gelu_backward(ctx, grad, x, approximate="none"):
    b = ctx.b
    cd = compute_dtype(x.dtype)
    xv, g = operand(ctx, x, cd), operand(ctx, grad, cd)  # (both at the result's shape: CPU broadcasts them)
    one, half = b.full_like(xv, 1.0), b.full_like(xv, 0.5)
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        x2 = b.multiply(xv, xv)
        inner = b.multiply(b.full_like(xv, k), b.add(xv, b.multiply(b.full_like(xv, 0.044715), b.multiply(xv, x2))))
        t = b.tanh(inner)
        dinner = b.multiply(b.full_like(xv, k), b.add(one, b.multiply(b.full_like(xv, 3 * 0.044715), x2)))
        d = b.add(b.multiply(half, b.add(one, t)),
                  b.multiply(b.multiply(half, xv), b.multiply(b.subtract(one, b.multiply(t, t)), dinner)))
    else:
        cdf = b.multiply(half, b.add(one, b.op("chlo.erf", [b.multiply(xv, b.full_like(xv, 1 / math.sqrt(2)))],
                                               [xv.type])[0]))
        pdf = b.multiply(b.full_like(xv, 1 / math.sqrt(2 * math.pi)),
                         b.exp(b.multiply(b.full_like(xv, -0.5), b.multiply(xv, xv))))
        d = b.add(cdf, b.multiply(xv, pdf))
    return _finish(ctx, b.multiply(g, d))


@register("silu")
def silu(ctx, x):
    b = ctx.b
    cd = compute_dtype(x.dtype)
    xv = b.convert(x, cd)
    return _finish(ctx, b.multiply(xv, b.unary("logistic", xv)))


@register("silu_backward")
def silu_backward(ctx, grad, x):
    b = ctx.b
    cd = compute_dtype(x.dtype)
    xv, g = operand(ctx, x, cd), operand(ctx, grad, cd)
    s = b.unary("logistic", xv)
    one = b.full_like(xv, 1.0)
    return _finish(ctx, b.multiply(g, b.multiply(s, b.add(one, b.multiply(xv, b.subtract(one, s))))))


@register("sigmoid_backward")
def sigmoid_backward(ctx, grad, y):
    b = ctx.b
    cd = compute_dtype(y.dtype)
    yv, g = operand(ctx, y, cd), operand(ctx, grad, cd)
    return _finish(ctx, b.multiply(g, b.multiply(yv, b.subtract(b.full_like(yv, 1.0), yv))))


@register("tanh_backward")
def tanh_backward(ctx, grad, y):
    b = ctx.b
    cd = compute_dtype(y.dtype)
    yv, g = operand(ctx, y, cd), operand(ctx, grad, cd)
    return _finish(ctx, b.multiply(g, b.subtract(b.full_like(yv, 1.0), b.multiply(yv, yv))))


@register("hardtanh")
def hardtanh(ctx, x, min_val=-1, max_val=1):
    return clamp(ctx, x, min_val, max_val)


@register("hardtanh_backward")
def hardtanh_backward(ctx, grad, x, min_val, max_val):
    b = ctx.b
    g = operand(ctx, grad, ctx.out[0].dtype)
    lo, hi = operand(ctx, min_val, x.dtype), operand(ctx, max_val, x.dtype)
    x = operand(ctx, x, x.dtype)
    inside = b.and_(b.compare(x, lo, "GT"), b.compare(x, hi, "LT"))
    return b.select(inside, g, b.zeros_like(g))


@register("leaky_relu")
def leaky_relu(ctx, x, negative_slope=0.01):
    """x > 0 ? x : x * slope, the product in the compute dtype with the slope unrounded, rounded
    once (CPU's half-precision kernel)."""
    b = ctx.b
    cd = compute_dtype(x.dtype)
    s = operand(ctx, negative_slope, cd)
    return b.select(b.compare(x, b.zeros_like(x), "GT"), x, b.convert(b.multiply(b.convert(x, cd), s), x.dtype))


def _check_inplace_negative_slope(grad, x, negative_slope, self_is_result):
    """CPU refuses the backward of an in-place leaky_relu_ with a negative slope (its result cannot
    tell the input's sign: the gradient would be wrong); its error, from CPU's kernel. Per call: the
    slope is a Scalar, which the eager key leaves out."""
    if self_is_result and negative_slope < 0:
        torch.ops.aten.leaky_relu_backward(torch.ones(1), torch.ones(1), negative_slope, True)


@register("leaky_relu_backward", check=_check_inplace_negative_slope)
def leaky_relu_backward(ctx, grad, x, negative_slope, self_is_result):
    b = ctx.b
    out = ctx.out[0].dtype
    cd = compute_dtype(out)
    g = operand(ctx, grad, out)
    s = operand(ctx, negative_slope, cd)
    x = operand(ctx, x, x.dtype)
    return b.select(b.compare(x, b.zeros_like(x), "GT"), g, b.convert(b.multiply(b.convert(g, cd), s), out))


@register("elu")
def elu(ctx, x, alpha=1, scale=1, input_scale=1):
    b = ctx.b
    cd = compute_dtype(x.dtype)
    xv = b.convert(x, cd)
    a, s, i = operand(ctx, alpha, cd), operand(ctx, scale, cd), operand(ctx, input_scale, cd)
    neg = b.multiply(a, b.unary("exponential_minus_one", b.multiply(xv, i)))
    return _finish(ctx, b.multiply(s, b.select(b.compare(xv, b.zeros_like(xv), "GT"), xv, neg)))


@register("softplus")
def softplus(ctx, x, beta=1, threshold=20):
    b = ctx.b
    cd = compute_dtype(x.dtype)
    xv = b.convert(x, cd)
    bv, tv = operand(ctx, beta, cd), operand(ctx, threshold, cd)
    bx = b.multiply(xv, bv)
    soft = b.divide(b.unary("log_plus_one", b.exp(bx)), bv)
    return _finish(ctx, b.select(b.compare(bx, tv, "GT"), xv, soft))


# -- fill and copy ----------------------------------------------------------------------------------
@register("fill.Scalar", "fill.Tensor")
def fill(ctx, x, value):
    return operand(ctx, value, ctx.out[0].dtype)


@register("zero")
def zero(ctx, x):
    return ctx.b.zeros_like(x) if x.dtype == ctx.out[0].dtype else ctx.b.constant(0, ctx.out[0].dtype, x.shape)


@register("copy")
def copy(ctx, x, src, non_blocking=False):
    return operand(ctx, src, ctx.out[0].dtype)


@register("clone")
def clone(ctx, x, memory_format=None):
    return x
