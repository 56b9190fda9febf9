"""Random ops: uniform_, normal_, bernoulli, random_, exponential_, normal, native_dropout.

Bits come from stablehlo.rng_bit_generator (Threefry) keyed by the tpu Generator's (seed, offset),
so torch.manual_seed makes every op reproducible and successive calls draw fresh counters. Bits are
turned into values on the device: floats in float32 (float64 for float64 outputs) from the top
mantissa bits, then rounded once to the output dtype. Argument errors are CPU's, raised by `check`
before anything runs (PyTorch's meta kernels miss most of them).
"""
from __future__ import annotations

import math

import torch

from .builder import TensorType
from .elementwise import compute_dtype, operand
from .registry import host_kernel, register

_TYPE_NAME = {torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
              torch.uint8: "Byte", torch.bool: "Bool", torch.uint16: "UInt16", torch.uint32: "UInt32",
              torch.uint64: "UInt64", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}
_DTYPE_TEXT = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
               torch.bfloat16: "c10::BFloat16"}


def _float_dtype(dt):
    """Math dtype of random floats for an output of dtype dt."""
    return torch.float64 if dt == torch.float64 else torch.float32


def uniform01(b, state, shape, dt, open_low=False):
    """Uniform floats of dtype dt (float32/float64) in [0, 1), or (0, 1) when open_low: the top
    mantissa-width bits as an integer m, times 2^-mant (exact), plus half a step when open."""
    wide = dt == torch.float64
    ui, mant = (torch.uint64, 52) if wide else (torch.uint32, 23)
    _, bits = b.rng_bit_generator(state, shape, ui)
    m = b.binary("shift_right_logical", bits, b.constant(64 - mant if wide else 32 - mant, ui, shape))
    u = b.multiply(b.convert(m, dt), b.constant(2.0 ** -mant, dt, shape))
    if open_low:
        u = b.add(u, b.constant(2.0 ** -(mant + 1), dt, shape))
    return u


def _std_normal(b, state, shape, dt):
    """Standard normal samples by inversion: sqrt(2) * erfinv(2u - 1), u in (0, 1)."""
    u = uniform01(b, state, shape, dt, open_low=True)
    x = b.subtract(b.multiply(u, b.constant(2.0, dt, shape)), b.constant(1.0, dt, shape))
    z = b.op("chlo.erf_inv", [x], [x.type])[0]
    return b.multiply(z, b.constant(math.sqrt(2.0), dt, shape))


def _float_only(name, t, complex_ok=False):
    if not (t.dtype.is_floating_point or (complex_ok and t.dtype.is_complex)):
        raise NotImplementedError(f'"{name}" not implemented for \'{_TYPE_NAME.get(t.dtype, t.dtype)}\'')


# -- uniform_ -------------------------------------------------------------------------------------
def _check_uniform(self, frm=0.0, to=1.0, generator=None):
    _float_only("check_uniform_bounds", self, complex_ok=True)
    dtype = self.dtype.to_real()  # a complex tensor draws both parts in its parts' dtype, as on CPU
    fi = torch.finfo(dtype)
    for v, n in ((frm, "from"), (to, "to")):
        if not (fi.min <= v <= fi.max):
            raise RuntimeError(f"{n} is out of bounds for {_DTYPE_TEXT[dtype]}")
    if frm > to:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={frm:g} > to={to:g}")
    if to - frm > fi.max:
        raise RuntimeError(f"uniform_ expects to-from <= std::numeric_limits<{str(dtype)[6:].capitalize()}>"
                           f"::max(), but found to={to:g} and from={frm:g} which result in to-from to exceed "
                           f"the limit")


def _complex_parts(b, state, dtype, draw):
    """A complex result from `draw(state, part_dtype)` for its real part and a second draw for its
    imaginary part, as CPU draws a complex tensor's two float halves. The second draw uses the same
    counters under another key (key + a fixed odd constant), so it consumes no more of the
    generator's offset than a real tensor of the same shape."""
    k = b.add(b.slice(state, [0], [1]), b.constant(0x9E3779B97F4A7C15, torch.uint64, (1,)))
    other = b.concatenate([k, b.slice(state, [1], [2])], 0)
    re, im = draw(state, dtype.to_real()), draw(other, dtype.to_real())
    return b.op("stablehlo.complex", [re, im], [TensorType(re.shape, dtype)])[0]


@register("uniform_", rng=True, check=_check_uniform, check_per_key=True)
def uniform_(ctx, self, frm=0.0, to=1.0, state=None):
    b, out = ctx.b, ctx.out[0]
    if out.dtype.is_complex:  # each part uniform in [from, to)
        return _complex_parts(b, state, out.dtype, lambda st, dt: _uniform(b, st, out.shape, dt, frm, to))
    return _uniform(b, state, out.shape, out.dtype, frm, to)


def _uniform(b, state, shape, dtype, frm, to):
    dt = _float_dtype(dtype)
    u = uniform01(b, state, shape, dt)
    lo = b.constant(frm, dt, shape)
    v = b.convert(b.add(b.multiply(u, b.constant(to - frm, dt, shape)), lo), dtype)
    # Rounding can reach `to`; the range is half-open, so map it back to `from` (as CUDA does).
    hit = b.compare(v, b.constant(to, dtype, shape), "EQ")
    return b.select(hit, b.constant(frm, dtype, shape), v)


# -- normal ---------------------------------------------------------------------------------------
def _check_normal_(self, mean=0.0, std=1.0, generator=None):
    _float_only("normal_kernel_cpu", self, complex_ok=True)
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std:g}")


@register("normal_", rng=True, check=_check_normal_, check_per_key=True)
def normal_(ctx, self, mean=0.0, std=1.0, state=None):
    b, out = ctx.b, ctx.out[0]
    if out.dtype.is_complex:  # CPU: each part normal(mean, std / sqrt(2)), so E|z - mean|^2 = std^2
        part_std = std / math.sqrt(2.0)
        return _complex_parts(b, state, out.dtype, lambda st, dt: _normal(b, st, out.shape, dt, mean, part_std))
    return _normal(b, state, out.shape, out.dtype, mean, std)


def _normal(b, state, shape, dtype, mean, std):
    dt = _float_dtype(dtype)
    z = _std_normal(b, state, shape, dt)
    return b.convert(b.add(b.multiply(z, b.constant(std, dt, shape)), b.constant(mean, dt, shape)), dtype)


def _check_std_tensor(std):
    if std.numel() and bool((std.detach().cpu() < 0).any()):
        raise RuntimeError("normal expects all elements of std >= 0.0")


def _normal_tensors(ctx, mean, std, state):
    """mean + std * z with either of mean/std a tensor (Value) or a python float."""
    b, out = ctx.b, ctx.out[0]
    dt = _float_dtype(out.dtype)
    z = _std_normal(b, state, out.shape, dt)
    s = operand(ctx, std, dt) if not isinstance(std, float) else b.constant(std, dt, out.shape)
    m = operand(ctx, mean, dt) if not isinstance(mean, float) else b.constant(mean, dt, out.shape)
    return b.convert(b.add(b.multiply(z, s), m), out.dtype)


@register("normal.Tensor_float", rng=True,
          check=lambda mean, std=1.0, generator=None: _check_normal_(mean, 0.0, std), check_per_key=True)
def normal_tensor_float(ctx, mean, std=1.0, state=None):
    return _normal_tensors(ctx, mean, float(std), state)


@register("normal.float_Tensor", rng=True, check=lambda mean, std, generator=None: _check_std_tensor(std))
def normal_float_tensor(ctx, mean, std, state=None):
    return _normal_tensors(ctx, float(mean), std, state)


@register("normal.Tensor_Tensor", rng=True, check=lambda mean, std, generator=None: _check_std_tensor(std))
def normal_tensor_tensor(ctx, mean, std, state=None):
    return _normal_tensors(ctx, mean, std, state)


# -- bernoulli ------------------------------------------------------------------------------------
def _bernoulli(ctx, p, state):
    """1 where u < p, u uniform in [0, 1); p a Value (broadcast to the output) or python float."""
    b, out = ctx.b, ctx.out[0]
    dt = torch.float64 if out.dtype == torch.float64 or (not isinstance(p, float) and p.dtype == torch.float64) \
        else torch.float32
    u = uniform01(b, state, out.shape, dt)
    pv = b.constant(p, dt, out.shape) if isinstance(p, float) else operand(ctx, p, dt)
    return b.convert(b.compare(u, pv, "LT"), out.dtype)


def _check_p(p, generator=None):
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p:g}")


def _check_p_tensor(p):
    if p.numel():
        pc = p.detach().cpu()
        if not bool(((pc >= 0) & (pc <= 1)).all()):
            raise RuntimeError("Expected p_in >= 0 && p_in <= 1 to be true, but got false.  (Could this error "
                               "message be improved?  If so, please report an enhancement request to PyTorch.)")


@register("bernoulli_.float", rng=True, check=lambda self, p=0.5, generator=None: _check_p(p), check_per_key=True)
def bernoulli_float_(ctx, self, p=0.5, state=None):
    return _bernoulli(ctx, float(p), state)


@register("bernoulli.p", rng=True, check=lambda self, p=0.5, generator=None: _check_p(p), check_per_key=True)
def bernoulli_p(ctx, self, p=0.5, state=None):
    return _bernoulli(ctx, float(p), state)


@register("bernoulli_.Tensor", rng=True, check=lambda self, p, generator=None: _check_p_tensor(p))
def bernoulli_tensor_(ctx, self, p, state=None):
    return _bernoulli(ctx, p, state)


@register("bernoulli", rng=True, check=lambda self, generator=None: _check_p_tensor(self))
def bernoulli(ctx, self, state=None):
    """Each element of self is the probability of a 1."""
    return _bernoulli(ctx, self, state)


# -- exponential_ ---------------------------------------------------------------------------------
def _check_exponential(self, lambd=1.0, generator=None):
    _float_only("exponential_cpu", self)
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd:g}")


@register("exponential_", rng=True, check=_check_exponential, check_per_key=True)
def exponential_(ctx, self, lambd=1.0, state=None):
    """-log(u) / lambda with u in (0, 1]: never 0 nor inf."""
    b, out = ctx.b, ctx.out[0]
    dt = _float_dtype(out.dtype)
    u = uniform01(b, state, out.shape, dt, open_low=True)
    return b.convert(b.divide(b.negate(b.log(u)), b.constant(lambd, dt, out.shape)), out.dtype)


# -- random_ --------------------------------------------------------------------------------------
def _digits(dt):
    return {torch.float32: 24, torch.float64: 53, torch.float16: 11, torch.bfloat16: 8}[dt]


def _cast_int(v, dt):
    """int64 -> dt -> int64, as C++'s static_cast round trip."""
    return int(torch.tensor(v, dtype=torch.int64).to(dt).to(torch.int64).item())


def _update_from(frm, dt):
    """PyTorch's update_from: the smallest value >= from that dt represents (large |from| only)."""
    fp1 = _cast_int(frm + 1, dt)
    if fp1 < frm:
        n = abs(frm + 1).bit_length() - 1
        frm = fp1 + (1 << (n - _digits(dt) + 1))
    return frm


def _update_to(to, dt):
    tm1 = _cast_int(to - 1, dt)
    if tm1 >= to:
        n = abs(to - 1).bit_length() - 1
        to = tm1 - (1 << (n - _digits(dt) + 1))
    return to


def _check_in_range(frm, last, dt):
    if dt.is_floating_point:
        fi = torch.finfo(dt)
        for v, n in ((frm, "from"), (last, "to - 1")):
            if not fi.min <= v <= fi.max:
                raise RuntimeError(f"{n} is out of bounds for {str(dt)[6:]}")
        # CPU only warns when |value| > 2^digits (precision), which is not an error.
    elif dt != torch.bool:
        ii = torch.iinfo(dt)
        names = {torch.uint8: "unsigned char", torch.int8: "signed char", torch.int16: "short", torch.int32: "int",
                 torch.int64: "long int"}
        for v, n in ((frm, "from"), (last, "to - 1")):
            if not ii.min <= v <= ii.max:
                raise RuntimeError(f"{n} is out of bounds for {names.get(dt, str(dt)[6:])}")


def _random_range(dt, frm, to):
    """(base, range) of random_'s integers: base + (bits % range); range None means all 64 bits."""
    if to is not None:
        if frm >= to:
            raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={frm} >= to={to}")
        if dt.is_floating_point:
            frm, to = _update_from(frm, dt), _update_to(to, dt)
            if frm >= to:
                raise RuntimeError(f"random_ expects 'from' casted to dtype to be less than 'to' casted to dtype, "
                                   f"but got from={frm} >= to={to}")
        _check_in_range(frm, to - 1, dt)
        return frm, to - frm
    if frm == -2 ** 63:
        return frm, None
    if dt.is_floating_point:
        to_inc = min(1 << _digits(dt), 2 ** 63 - 1)
        frm = _update_from(frm, dt)
        if frm >= to_inc:
            raise RuntimeError(f"random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' casted "
                               f"to dtype, but got from={frm} > to_inc={to_inc}")
    elif dt == torch.bool:
        to_inc = 1
    elif dt in _TYPE_NAME and not dt.is_complex:
        to_inc = torch.iinfo(dt).max
    else:
        raise RuntimeError("random_from_to_impl handles only integral, floating-point and boolean types")
    _check_in_range(frm, to_inc, dt)
    return frm, to_inc - frm + 1


def _random_values(ctx, state, base, rng):
    b, out = ctx.b, ctx.out[0]
    shape = out.shape
    if rng is None:  # the whole int64 range
        _, bits = b.rng_bit_generator(state, shape, torch.uint64)
        return b.convert(b.bitcast_convert(bits, torch.int64), out.dtype)
    ui = torch.uint64 if rng >= 2 ** 32 else torch.uint32
    _, bits = b.rng_bit_generator(state, shape, ui)
    r = b.remainder(bits, b.constant(rng, ui, shape))
    r = b.bitcast_convert(r, torch.int64) if ui == torch.uint64 else b.convert(r, torch.int64)
    v = b.add(r, b.constant(base, torch.int64, shape))  # wraps like CPU's uint64 arithmetic
    return b.convert(v, out.dtype)


@register("random_.from", rng=True,
          check=lambda self, frm, to=None, generator=None: _random_range(self.dtype, frm, to), check_per_key=True)
def random_from(ctx, self, frm, to=None, state=None):
    base, rng = _random_range(ctx.out[0].dtype, frm, to)
    return _random_values(ctx, state, base, rng)


@register("random_.to", rng=True, check=lambda self, to, generator=None: _random_range(self.dtype, 0, to),
          check_per_key=True)
def random_to(ctx, self, to, state=None):
    base, rng = _random_range(ctx.out[0].dtype, 0, to)
    return _random_values(ctx, state, base, rng)


@register("random_", rng=True)
def random_(ctx, self, state=None):
    """[0, 2^digits] for floats, [0, max] for integers, {False, True} for bool."""
    dt = ctx.out[0].dtype
    if dt == torch.bool:
        rng = 2
    elif dt.is_floating_point:
        rng = (1 << _digits(dt)) + 1
    else:
        rng = torch.iinfo(dt).max + 1
    return _random_values(ctx, state, 0, rng)


# -- dropout --------------------------------------------------------------------------------------
@register("native_dropout", rng=True)
def native_dropout(ctx, x, p, train, state):
    """(x * mask * 1/(1-p), mask) with mask ~ Bernoulli(1-p); identity and all-true mask when not
    training. The state is the default generator's (the op takes no Generator)."""
    b = ctx.b
    out, mask_t = ctx.out
    if train is False:
        return x, b.constant(True, mask_t.dtype, mask_t.shape)
    keep = 1.0 - p
    scale = 0.0 if keep == 0 else 1.0 / keep
    u = uniform01(b, state, out.shape, _float_dtype(out.dtype))
    mask = b.compare(u, b.constant(keep, u.dtype, out.shape), "LT")
    cd = compute_dtype(out.dtype)
    xv = b.convert(x, cd)
    y = b.multiply(b.select(mask, xv, b.zeros_like(xv)), b.constant(scale, cd, out.shape))
    return b.convert(y, out.dtype), b.convert(mask, mask_t.dtype)


@register("native_dropout_backward")
def native_dropout_backward(ctx, grad, mask, scale):
    b, out = ctx.b, ctx.out[0]
    cd = compute_dtype(out.dtype)
    g = operand(ctx, grad, cd)
    g = b.select(operand(ctx, mask, torch.bool), g, b.zeros_like(g))
    return b.convert(b.multiply(g, b.constant(scale, cd, out.shape)), out.dtype)


# -- geometric_ / cauchy_ / log_normal_ -----------------------------------------------------------
def _check_geometric(self, p, generator=None):
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p:g}")


@register("geometric_", rng=True, check=_check_geometric, check_per_key=True)
def geometric_(ctx, self, p, state=None):
    """Number of Bernoulli(p) trials up to the first success: ceil(log(u) / log1p(-p)), u in (0, 1]
    (u = 1 - open-low uniform, so log(u) is finite and the result at least 1)."""
    b, out = ctx.b, ctx.out[0]
    dt = torch.float64 if out.dtype in (torch.float64, torch.int64) else torch.float32
    u = uniform01(b, state, out.shape, dt, open_low=True)
    denom = b.unary("log_plus_one", b.constant(-p, dt, out.shape))
    k = b.unary("ceil", b.divide(b.log(u), denom))
    k = b.maximum(k, b.constant(1.0, dt, out.shape))  # log(u) may round to 0 for u just below 1
    return b.convert(k, out.dtype)


def _scale_check(op, kernel, param, pos):
    """check= of a distribution on floats whose parameter `param` (number pos after self) must be
    positive, with CPU's messages."""
    def check(self, *args):
        _float_only(kernel, self)
        if not args[pos] > 0:
            raise RuntimeError(f"{op} expects {param} > 0.0, but found {param}={float(args[pos]):g}")
    return check


@register("cauchy_", rng=True, check=_scale_check("cauchy_", "cauchy_cpu", "sigma", 1), check_per_key=True)
def cauchy_(ctx, self, median=0.0, sigma=1.0, state=None):
    """median + sigma * tan(pi * (u - 1/2)), u in (0, 1) (never +-pi/2)."""
    b, out = ctx.b, ctx.out[0]
    dt = _float_dtype(out.dtype)
    u = uniform01(b, state, out.shape, dt, open_low=True)
    t = b.unary("tan", b.multiply(b.subtract(u, b.constant(0.5, dt, out.shape)), b.constant(math.pi, dt, out.shape)))
    med, sig = b.constant(median, dt, out.shape), b.constant(sigma, dt, out.shape)
    return b.convert(b.add(med, b.multiply(sig, t)), out.dtype)


@register("log_normal_", rng=True, check=_scale_check("log_normal_", "log_normal_cpu", "std", 1),
          check_per_key=True)
def log_normal_(ctx, self, mean=1.0, std=2.0, state=None):
    """exp(mean + std * z), z standard normal."""
    b, out = ctx.b, ctx.out[0]
    dt = _float_dtype(out.dtype)
    z = _std_normal(b, state, out.shape, dt)
    m, s = b.constant(mean, dt, out.shape), b.constant(std, dt, out.shape)
    return b.convert(b.exp(b.add(m, b.multiply(s, z))), out.dtype)


# -- multinomial ------------------------------------------------------------------------------------
def _prepare_multinomial(self, n, replacement=False, generator=None):
    """The argument errors (before the program is built for them)."""
    if not self.dtype.is_floating_point:
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: "
                           f"{_TYPE_NAME.get(self.dtype, self.dtype)}")
    if self.dim() not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if n <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and n > self.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    return [self, n, replacement, generator]


def _check_multinomial(self, n, replacement=False, generator=None):
    p = self.detach().cpu().double().reshape(-1, self.shape[-1])  # the distribution's validity needs its values
    if not bool(torch.isfinite(p).all()) or bool((p < 0).any()):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if bool((p.sum(1) <= 0).any()):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")


def _stream(b, state, k):
    """A state for k draws per output element: the counter scaled by k (the generator advances by
    one draw per output element) and the key moved to a stream of its own."""
    key = b.slice(state, [0], [1])
    ctr = b.slice(state, [1], [2])
    key = b.xor(key, b.constant(0x6D756C74696E6F6D, torch.uint64, (1,)))  # "multinom"
    return b.concatenate([key, b.multiply(ctr, b.constant(k, torch.uint64, (1,)))], 0)


@register("multinomial", rng=True, check=_check_multinomial, prepare=_prepare_multinomial)
def multinomial(ctx, self, n, replacement=False, state=None):
    """With replacement: each sample is the first category whose running sum exceeds u * total.
    Without: the n largest log(p) + Gumbel noise (the exponential race), in decreasing key order;
    zero-probability categories come last (CPU also returns them once the others are used up)."""
    b, out = ctx.b, ctx.out[0]
    k = self.shape[-1]
    rows = self.type.numel // k if k else 0
    dt = torch.float64 if self.dtype == torch.float64 else torch.float32
    p = b.reshape(b.convert(self, dt), [rows, k])
    st = _stream(b, state, k)
    if replacement:
        csum = b.reduce_window([p], [b.constant(0, dt)], [1, k], [1, 1], [(0, 0), (k - 1, 0)],
                               lambda s, x, y: s.add(x, y))[0]
        total = b.slice(csum, [0, k - 1], [rows, k])
        u = uniform01(b, st, (rows, n), dt)
        target = b.multiply(u, b.broadcast_in_dim(b.reshape(total, [rows]), (rows, n), [0]))
        # index = number of categories whose running sum is <= target (strictly above picks it)
        le = b.compare(b.broadcast_in_dim(csum, (rows, n, k), [0, 2]),
                       b.broadcast_in_dim(target, (rows, n, k), [0, 1]), "LE")
        idx = b.reduce([b.convert(le, torch.int64)], [b.constant(0, torch.int64)], [2], lambda s, x, y: s.add(x, y))[0]
        last_pos = b.constant(k - 1, torch.int64, (rows, n))
        return b.reshape(b.minimum(idx, last_pos), out.shape)
    u = uniform01(b, st, (rows, k), dt, open_low=True)
    gumbel = b.negate(b.log(b.negate(b.log(u))))
    key = b.add(b.log(p), gumbel)  # log(0) = -inf: never ahead of a possible category
    _, order = b.sort([key, b.iota((rows, k), 1)], 1,
                      lambda s, a, c, i, j: s.compare(a, c, "GT"), stable=True)
    return b.reshape(b.slice(order, [0, 0], [rows, n]), out.shape)


# -- rrelu -------------------------------------------------------------------------------------------


def rrelu_with_noise(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    """Training: each element <= 0 is scaled by a slope drawn uniformly from [lower, upper] (on the
    device, from the generator), and noise records the slopes (1 elsewhere). Otherwise
    leaky_relu with the mean slope."""
    if not training:
        return torch.ops.aten.leaky_relu.default(self, (lower + upper) / 2)
    r = torch.empty_like(self).uniform_(lower, upper, generator=generator)
    slope = torch.where(self <= 0, r, torch.ones_like(r))
    noise.copy_(slope)
    return self * slope


def rrelu_with_noise_(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    """nn.RReLU(inplace=True) / F.rrelu_: rrelu_with_noise written into self."""
    return self.copy_(rrelu_with_noise(self, noise, lower, upper, training, generator))


host_kernel("rrelu_with_noise", rrelu_with_noise)
host_kernel("rrelu_with_noise_", rrelu_with_noise_)


@register("rrelu_with_noise_backward")
def rrelu_with_noise_backward(ctx, grad, self, noise, lower, upper, training, self_is_result):
    """grad * noise when training with a real range, else leaky_relu's backward with the mean slope
    (lower and upper are runtime Scalars: the choice is made in the program)."""
    b, out = ctx.b, ctx.out[0]
    cd = compute_dtype(out.dtype)
    g = operand(ctx, grad, cd)
    lo, hi = b.convert(lower, torch.float64), b.convert(upper, torch.float64)
    x = operand(ctx, self, cd)
    slope = b.broadcast_to(b.convert(b.divide(b.add(lo, hi), b.constant(2.0, torch.float64)), cd), out.shape)
    leaky = b.select(b.compare(x, b.zeros_like(x), "GT"), g, b.multiply(g, slope))
    if not training:
        return b.convert(leaky, out.dtype)
    ranged = b.compare(b.subtract(hi, lo), b.constant(1e-6, torch.float64), "GT")
    noisy = b.multiply(g, operand(ctx, noise, cd))
    return b.convert(b.select(b.broadcast_to(ranged, out.shape), noisy, leaky), out.dtype)


def _check_randperm(n, generator=None, out=None):
    """CPU's checks of n against the result's dtype (check_supported_max_int_with_precision): n - 1
    must fit it, and floats must hold every integer up to it."""
    if n < 0:
        raise RuntimeError(f"n must be non-negative, got{n}")
    dt = out.dtype
    if not (dt.is_floating_point or dt.is_complex) and dt != torch.bool:
        info = torch.iinfo(dt)
        if max(n - 1, 0) > info.max:
            raise RuntimeError(f"value cannot be converted to type {_C_INT_NAMES.get(dt, str(dt))} without overflow")
    limits = {torch.float16: (2 ** 11 + 1, "2049", "Half"), torch.float32: (2 ** 24 + 1, "2^24+1", "Float"),
              torch.float64: (2 ** 53 + 1, "2^53+1", "Double")}
    if dt in limits and n > limits[dt][0]:
        raise RuntimeError(f"n cannot be greater than {limits[dt][1]} for {limits[dt][2]} type.")


_C_INT_NAMES = {torch.uint8: "uint8_t", torch.int8: "int8_t", torch.int16: "int16_t", torch.int32: "int32_t",
                torch.uint16: "uint16_t", torch.uint32: "uint32_t"}


@register("randperm.generator_out", rng=True, check=_check_randperm, check_per_key=True)
def randperm_generator_out(ctx, n, state, out):
    """A uniformly random permutation of 0..n-1: iota sorted by 64-bit random keys (a tie, which
    would favour the original order, has probability about n^2 / 2^65)."""
    b, out = ctx.b, ctx.out[0]
    if n == 0:
        return b.constant(0, out.dtype, (0,))
    _, keys = b.rng_bit_generator(state, (n,), torch.uint64)
    perm = b.sort([keys, b.iota((n,), 0)], 0, lambda sb, a, c, i, j: sb.compare(a, c, "LT"), stable=True)[1]
    return b.convert(perm, out.dtype)
