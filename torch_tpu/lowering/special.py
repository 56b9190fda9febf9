"""Special functions (torch.special and friends): gamma-family (polygamma, zeta, igamma), modified
Bessel functions, error-function relatives, orthogonal polynomials, and small elementwise helpers
(nextafter, hypot, frexp, gcd/lcm, shifts, shrink activations).

Each function follows the algorithm PyTorch's CPU kernel uses (published Cephes-style Chebyshev /
rational approximations, recurrences, series) so that values, special cases (poles, NaN, inf, the
domain edges) and rounding behaviour match; the math is written here in StableHLO (CHLO where it
exists and agrees). Half-precision inputs are computed in float32 and rounded once, as on CPU.
Loops with a data-dependent trip count are `stablehlo.while` over the whole tensor with a
per-element "still running" mask.
"""
from __future__ import annotations

import math

import torch

from .builder import Value
from .elementwise import compute_dtype, digamma as _digamma, operand, rounded_operand
from .registry import register


# -- helpers ------------------------------------------------------------------------------------------
def float_input(ctx, x, shape=None):
    """x converted to the op's float compute dtype (float32 for half types) and broadcast to the
    result shape."""
    return operand(ctx, x, compute_dtype(ctx.out[0].dtype), shape)


def finish(ctx, r):
    """The computed value rounded to the result dtype."""
    return ctx.b.convert(r, ctx.out[0].dtype)


def chlo(b, name, x):
    """A unary CHLO op (chlo.lgamma, chlo.erfc, ...) of x's type."""
    return b.op(f"chlo.{name}", [x], [x.type])[0]


def const(b, like: Value, v):
    """A constant shaped and typed like `like`."""
    return b.constant(v, like.dtype, like.shape)


def polevl(b, x, coeffs):
    """sum coeffs[i] * x**(n-i): a polynomial, highest degree first (Horner)."""
    r = const(b, x, coeffs[0])
    for c in coeffs[1:]:
        r = b.add(b.multiply(r, x), const(b, x, c))
    return r


def chbevl(b, x, coeffs):
    """Chebyshev series sum' coeffs[i] T_i(x/2), zero-order term last (Clenshaw recurrence)."""
    b0, b1, b2 = const(b, x, coeffs[0]), const(b, x, 0.0), const(b, x, 0.0)
    for c in coeffs[1:]:
        b2, b1 = b1, b0
        b0 = b.add(b.subtract(b.multiply(x, b1), b2), const(b, x, c))
    return b.multiply(const(b, x, 0.5), b.subtract(b0, b2))


def any_true(b, mask):
    """Scalar i1: whether some element of the bool tensor is true."""
    return b.reduce([mask], [b.constant(False, torch.bool)], list(range(mask.rank)),
                    lambda s, acc, e: s.or_(acc, e))[0]


def while_loop(b, init, cond, body):
    """stablehlo.while: `cond(b, *state)` returns a scalar bool Value, `body(b, *state)` the new state."""
    types = [v.type for v in init]
    return b.op("stablehlo.while", init, types, regions=[b.region(types, cond), b.region(types, body)])


def eps_of(dtype):
    """Half the machine epsilon of the compute dtype: the relative size of a negligible term."""
    return torch.finfo(dtype).eps / 2


def is_integer(b, x):
    """Bool: x is a finite whole number."""
    return b.compare(b.unary("floor", x), x, "EQ")


def unary_special(*names):
    """Registers a float-valued unary function `fn(b, x)` (x in the compute dtype) for `names`."""
    def deco(fn):
        def lower(ctx, x):
            return finish(ctx, fn(ctx.b, float_input(ctx, x)))
        register(*names)(lower)
        return fn
    return deco


# -- gamma family: polygamma, zeta -------------------------------------------------------------------
def trigamma(b, x):
    """polygamma(1, x): reflection below 1/2, six recurrence steps, then the asymptotic series
    (Bernoulli numbers 1/6, 1/30, 1/42), the CPU algorithm (huge but finite values near negative
    integers, +inf at 0)."""
    one = const(b, x, 1.0)
    reflect = b.compare(x, const(b, x, 0.5), "LT")
    s = b.unary("sine", b.multiply(const(b, x, math.pi), x))
    result = b.select(reflect, b.negate(b.divide(const(b, x, math.pi * math.pi), b.multiply(s, s))),
                      const(b, x, 0.0))
    x = b.select(reflect, b.subtract(one, x), x)
    for _ in range(6):
        result = b.add(result, b.divide(one, b.multiply(x, x)))
        x = b.add(x, one)
    ixx = b.divide(one, b.multiply(x, x))
    series = b.multiply(ixx, b.subtract(const(b, x, 1 / 6), b.multiply(
        ixx, b.subtract(const(b, x, 1 / 30), b.multiply(ixx, const(b, x, 1 / 42))))))
    tail = b.divide(b.add(b.add(one, b.divide(one, b.multiply(const(b, x, 2.0), x))), series), x)
    result = b.add(result, tail)
    return b.select(reflect, b.negate(result), result)


# (2k)! / B_2k for k = 1..12: the Euler-Maclaurin correction terms of the Hurwitz zeta function.
_ZETA_A = [12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
           -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
           1.8152105401943546773e17, -7.1661652561756670113e18]


def zeta(b, x, q):
    """Hurwitz zeta(x, q) = sum_k (k + q)^-x by Euler-Maclaurin summation: direct terms until
    a > 9 (at least 9 of them) or negligible, then up to 12 correction terms. x == 1 gives inf,
    x < 1 NaN, a non-positive integer q inf, a negative q with non-integer x NaN (CPU's cases)."""
    eps = eps_of(x.dtype)
    zero, one = const(b, x, 0.0), const(b, x, 1.0)
    neg_x = b.negate(x)
    s = b.power(q, neg_x)

    def small(bb, v, val):  # |v| < eps * val, written as CPU's two-sided test (false for NaN)
        lim = bb.multiply(bb.constant(eps, val.dtype, val.shape), val)
        return bb.and_(bb.compare(bb.negate(lim), v, "LT"), bb.compare(v, lim, "LT"))

    i0 = b.constant(0, torch.int32, x.shape)
    done0 = b.constant(False, torch.bool, x.shape)

    def running(s_, i, a, done):
        nine = s_.constant(9.0, x.dtype, x.shape)
        more = s_.or_(s_.compare(i, s_.constant(9, torch.int32, x.shape), "LT"), s_.compare(a, nine, "LE"))
        # a cap on the trip count: a q so negative that a += 1 no longer moves it must not hang
        cap = s_.compare(i, s_.constant(1 << 24, torch.int32, x.shape), "LT")
        return s_.and_(s_.and_(s_.not_(done), more), cap)

    def cond(s_, i, a, bv, sv, done, xv, nxv):
        return any_true(s_, running(s_, i, a, done))

    def body(s_, i, a, bv, sv, done, xv, nxv):
        act = running(s_, i, a, done)
        a2 = s_.add(a, s_.constant(1.0, x.dtype, x.shape))
        b2 = s_.power(a2, nxv)
        sv2 = s_.add(sv, b2)
        conv = small(s_, b2, sv2)
        i2 = s_.add(i, s_.constant(1, torch.int32, x.shape))
        return [s_.select(act, i2, i), s_.select(act, a2, a), s_.select(act, b2, bv), s_.select(act, sv2, sv),
                s_.or_(done, s_.and_(act, conv)), xv, nxv]

    _, a, bv, s, done, _, _ = while_loop(b, [i0, q, zero, s, done0, x, neg_x], cond, body)
    w = a
    s2 = b.add(s, b.divide(b.multiply(bv, w), b.subtract(x, one)))
    s2 = b.subtract(s2, b.multiply(const(b, x, 0.5), bv))
    s = b.select(done, s, s2)
    # the correction terms t_j = a_j * b_j / A_j, a_j a rising product of (x + k), b_j = b / w^(2j-1);
    # their product is carried as one value so that neither factor overflows in float32
    ab, k = bv, zero
    for coef in _ZETA_A:
        ab = b.multiply(ab, b.divide(b.add(x, k), w))
        t = b.divide(ab, const(b, x, coef))
        s = b.select(done, s, b.add(s, t))
        done = b.or_(done, b.compare(b.abs(b.divide(t, s)), const(b, x, eps), "LT"))
        k = b.add(k, one)
        ab = b.multiply(ab, b.divide(b.add(x, k), w))
        k = b.add(k, one)
    # domain cases
    q_pole = b.and_(b.compare(q, zero, "LE"), is_integer(b, q))
    x_frac = b.and_(b.compare(q, zero, "LE"), b.not_(is_integer(b, x)))
    s = b.select(x_frac, const(b, x, math.nan), s)
    s = b.select(q_pole, const(b, x, math.inf), s)
    s = b.select(b.compare(x, one, "LT"), const(b, x, math.nan), s)
    return b.select(b.compare(x, one, "EQ"), const(b, x, math.inf), s)


@register("special_zeta", "special_zeta.self_scalar", "special_zeta.other_scalar")
def special_zeta(ctx, x, q):
    return finish(ctx, zeta(ctx.b, float_input(ctx, x), float_input(ctx, q)))


@register("polygamma")
def polygamma(ctx, n, x):
    """n == 0: digamma; n == 1: trigamma; else (-1)^(n+1) n! zeta(n+1, x)."""
    if n == 0:
        return _digamma(ctx, x)
    b = ctx.b
    xv = float_input(ctx, x)
    if n == 1:
        return finish(ctx, trigamma(b, xv))
    factor = (1.0 if n % 2 else -1.0) * math.exp(math.lgamma(n + 1.0))
    return finish(ctx, b.multiply(const(b, xv, factor), zeta(b, const(b, xv, n + 1.0), xv)))


# -- modified Bessel functions of the first kind: i0, i0e, i1, i1e -------------------------------------
# Cephes' Chebyshev coefficients (zero-order term last): exp(-x) I0(x) on [0, 8] ...
_I0E_A = [-4.4153416464793395e-18, 3.3307945188222384e-17, -2.431279846547955e-16, 1.715391285555133e-15,
          -1.1685332877993451e-14, 7.676185498604936e-14, -4.856446783111929e-13, 2.95505266312964e-12,
          -1.726826291441556e-11, 9.675809035373237e-11, -5.189795601635263e-10, 2.6598237246823866e-09,
          -1.300025009986248e-08, 6.046995022541919e-08, -2.670793853940612e-07, 1.1173875391201037e-06,
          -4.4167383584587505e-06, 1.6448448070728896e-05, -5.754195010082104e-05, 0.00018850288509584165,
          -0.0005763755745385824, 0.0016394756169413357, -0.004324309995050576, 0.010546460394594998,
          -0.02373741480589947, 0.04930528423967071, -0.09490109704804764, 0.17162090152220877,
          -0.3046826723431984, 0.6767952744094761]
# ... exp(-x) sqrt(x) I0(x) on the inverted interval [8, inf) ...
_I0E_B = [-7.233180487874754e-18, -4.830504485944182e-18, 4.46562142029676e-17, 3.461222867697461e-17,
          -2.8276239805165836e-16, -3.425485619677219e-16, 1.7725601330565263e-15, 3.8116806693526224e-15,
          -9.554846698828307e-15, -4.150569347287222e-14, 1.54008621752141e-14, 3.8527783827421426e-13,
          7.180124451383666e-13, -1.7941785315068062e-12, -1.3215811840447713e-11, -3.1499165279632416e-11,
          1.1889147107846439e-11, 4.94060238822497e-10, 3.3962320257083865e-09, 2.266668990498178e-08,
          2.0489185894690638e-07, 2.8913705208347567e-06, 6.889758346916825e-05, 0.0033691164782556943,
          0.8044904110141088]
# ... exp(-x) I1(x) / x on [0, 8] ...
_I1E_A = [2.7779141127610464e-18, -2.111421214358166e-17, 1.5536319577362005e-16, -1.1055969477353862e-15,
          7.600684294735408e-15, -5.042185504727912e-14, 3.223793365945575e-13, -1.9839743977649436e-12,
          1.1736186298890901e-11, -6.663489723502027e-11, 3.625590281552117e-10, -1.8872497517228294e-09,
          9.381537386495773e-09, -4.445059128796328e-08, 2.0032947535521353e-07, -8.568720264695455e-07,
          3.4702513081376785e-06, -1.3273163656039436e-05, 4.781565107550054e-05, -0.00016176081582589674,
          0.0005122859561685758, -0.0015135724506312532, 0.004156422944312888, -0.010564084894626197,
          0.024726449030626516, -0.05294598120809499, 0.1026436586898471, -0.17641651835783406,
          0.25258718644363365]
# ... and exp(-x) sqrt(x) I1(x) on [8, inf).
_I1E_B = [7.517296310842105e-18, 4.414348323071708e-18, -4.6503053684893586e-17, -3.209525921993424e-17,
          2.96262899764595e-16, 3.3082023109209285e-16, -1.8803547755107825e-15, -3.8144030724370075e-15,
          1.0420276984128802e-14, 4.272440016711951e-14, -2.1015418427726643e-14, -4.0835511110921974e-13,
          -7.198551776245908e-13, 2.0356285441470896e-12, 1.4125807436613782e-11, 3.2526035830154884e-11,
          -1.8974958123505413e-11, -5.589743462196584e-10, -3.835380385964237e-09, -2.6314688468895196e-08,
          -2.512236237870209e-07, -3.882564808877691e-06, -0.00011058893876262371, -0.009761097491361469,
          0.7785762350182801]


def _bessel_i_scaled(b, x, order):
    """exp(-|x|) I_order(|x|) for order 0 or 1, |x| <= 8 and |x| > 8 approximations selected."""
    ax = b.abs(x)
    near_a, far_b = (_I0E_A, _I0E_B) if order == 0 else (_I1E_A, _I1E_B)
    near = chbevl(b, b.subtract(b.divide(ax, const(b, x, 2.0)), const(b, x, 2.0)), near_a)
    if order == 1:
        near = b.multiply(near, ax)
    far = b.divide(chbevl(b, b.subtract(b.divide(const(b, x, 32.0), ax), const(b, x, 2.0)), far_b), b.sqrt(ax))
    return b.select(b.compare(ax, const(b, x, 8.0), "LE"), near, far)


def _odd(b, x, r):
    """r with x's sign (I1 is odd): negated where x < 0."""
    return b.select(b.compare(x, const(b, x, 0.0), "LT"), b.negate(r), r)


@unary_special("special_i0e")
def i0e(b, x):
    return _bessel_i_scaled(b, x, 0)


@unary_special("special_i1e")
def i1e(b, x):
    return _odd(b, x, _bessel_i_scaled(b, x, 1))


def _bessel_i(b, x, order):
    """I_order(x) = exp(|x|) * (the scaled series), in CPU's order of operations (so that I(inf) is
    inf / inf = NaN beyond 8 as there)."""
    ax = b.abs(x)
    near_a, far_b = (_I0E_A, _I0E_B) if order == 0 else (_I1E_A, _I1E_B)
    e = b.exp(ax)
    near = chbevl(b, b.subtract(b.divide(ax, const(b, x, 2.0)), const(b, x, 2.0)), near_a)
    near = b.multiply(e if order == 0 else b.multiply(e, ax), near)
    far = b.divide(b.multiply(e, chbevl(b, b.subtract(b.divide(const(b, x, 32.0), ax), const(b, x, 2.0)), far_b)),
                   b.sqrt(ax))
    r = b.select(b.compare(ax, const(b, x, 8.0), "LE"), near, far)
    return r if order == 0 else _odd(b, x, r)


@unary_special("i0")
def i0(b, x):
    return _bessel_i(b, x, 0)


@unary_special("special_i1")
def i1(b, x):
    return _bessel_i(b, x, 1)


# -- error-function relatives: erfcx, ndtri, log_ndtr ---------------------------------------------------
def _exp_square(b, x):
    """exp(x*x) without the rounding error of x*x (which exp would multiply by x*x): x is split into
    a high half whose square is exact and the rest (Dekker)."""
    split = const(b, x, 2.0 ** (27 if x.dtype == torch.float64 else 12) + 1.0)
    c = b.multiply(split, x)
    hi = b.subtract(c, b.subtract(c, x))
    lo = b.subtract(x, hi)
    rest = b.add(b.multiply(const(b, x, 2.0), b.multiply(hi, lo)), b.multiply(lo, lo))
    return b.multiply(b.exp(b.multiply(hi, hi)), b.exp(rest))


# (-1)^k (2k-1)!!: the asymptotic series erfcx(x) ~ 1/(x sqrt(pi)) sum_k c_k (2x^2)^-k
_ERFCX_ASYMPTOTIC = [(-1) ** k * math.prod(range(1, 2 * k, 2)) for k in range(13)]


def erfcx(b, x):
    """exp(x^2) erfc(x). x >= 0: exp(x^2) * erfc(x) below 8, the asymptotic series from 8 to 50 and
    CPU's continued fraction (and 1/(x sqrt(pi)) beyond 5e7) above; x < 0: 2 exp(x^2) - erfcx(-x)
    (inf below -26.7, the exponential alone below -6.1), as on CPU."""
    ispi = 1 / math.sqrt(math.pi)
    ax = b.abs(x)
    one = const(b, x, 1.0)
    direct = b.multiply(_exp_square(b, ax), chlo(b, "erfc", ax))
    u = b.divide(one, b.multiply(const(b, x, 2.0), b.multiply(ax, ax)))
    asym = b.divide(polevl(b, u, _ERFCX_ASYMPTOTIC[::-1]), b.multiply(ax, const(b, x, ispi ** -1)))
    x2 = b.multiply(ax, ax)
    cf = b.divide(b.multiply(const(b, x, ispi), b.add(b.multiply(x2, b.add(x2, const(b, x, 4.5))), const(b, x, 2.0))),
                  b.multiply(ax, b.add(b.multiply(x2, b.add(x2, const(b, x, 5.0))), const(b, x, 3.75))))
    pos = b.select(b.compare(ax, const(b, x, 8.0), "LT"), direct, asym)
    pos = b.select(b.compare(ax, const(b, x, 50.0), "GT"), cf, pos)
    pos = b.select(b.compare(ax, const(b, x, 5e7), "GT"), b.divide(const(b, x, ispi), ax), pos)
    two_exp = b.multiply(const(b, x, 2.0), b.exp(b.multiply(x, x)))
    neg = b.select(b.compare(x, const(b, x, -6.1), "LT"), two_exp, b.subtract(two_exp, pos))
    neg = b.select(b.compare(x, const(b, x, -26.7), "LT"), const(b, x, math.inf), neg)
    r = b.select(b.compare(x, const(b, x, 0.0), "GE"), pos, neg)
    return b.select(b.is_nan(x), x, r)


register("special_erfcx")(lambda ctx, x: finish(ctx, erfcx(ctx.b, float_input(ctx, x))))

# Cephes ndtri rational approximations: |y - 1/2| <= 3/8 ...
_NDTRI_P0 = [-59.96335010141079, 98.00107541859997, -56.67628574690703, 13.931260938727968, -1.2391658386738125]
_NDTRI_Q0 = [1.0, 1.9544885833814176, 4.676279128988815, 86.36024213908905, -225.46268785411937,
             200.26021238006066, -82.03722561683334, 15.90562251262117, -1.1833162112133]
# ... z = sqrt(-2 log y) in [2, 8) ...
_NDTRI_P1 = [4.0554489230596245, 31.525109459989388, 57.16281922464213, 44.08050738932008, 14.684956192885803,
             2.1866330685079025, -0.1402560791713545, -0.03504246268278482, -0.0008574567851546854]
_NDTRI_Q1 = [1.0, 15.779988325646675, 45.39076351288792, 41.3172038254672, 15.04253856929075, 2.504649462083094,
             -0.14218292285478779, -0.03808064076915783, -0.0009332594808954574]
# ... and z in [8, 64).
_NDTRI_P2 = [3.2377489177694603, 6.915228890689842, 3.9388102529247444, 1.3330346081580755, 0.20148538954917908,
             0.012371663481782003, 0.00030158155350823543, 2.6580697468673755e-06, 6.239745391849833e-09]
_NDTRI_Q2 = [1.0, 6.02427039364742, 3.6798356385616087, 1.3770209948908132, 0.21623699359449663,
             0.013420400608854318, 0.00032801446468212774, 2.8924786474538068e-06, 6.790194080099813e-09]


@unary_special("special_ndtri")
def ndtri(b, y0):
    """The inverse of the standard normal CDF: a rational function of y - 1/2 in the middle, of
    1/sqrt(-2 log y) in the tails; -inf at 0, inf at 1, NaN outside [0, 1]."""
    one, zero = const(b, y0, 1.0), const(b, y0, 0.0)
    e2 = 0.13533528323661269189  # exp(-2)
    upper = b.compare(y0, const(b, y0, 1.0 - e2), "GT")
    y = b.select(upper, b.subtract(one, y0), y0)
    # middle
    ym = b.subtract(y, const(b, y0, 0.5))
    y2 = b.multiply(ym, ym)
    mid = b.add(ym, b.multiply(ym, b.divide(b.multiply(y2, polevl(b, y2, _NDTRI_P0)), polevl(b, y2, _NDTRI_Q0))))
    mid = b.multiply(mid, const(b, y0, 2.50662827463100050242))
    # tails
    t = b.sqrt(b.multiply(const(b, y0, -2.0), b.log(y)))
    x0 = b.subtract(t, b.divide(b.log(t), t))
    z = b.divide(one, t)
    x1_near = b.divide(b.multiply(z, polevl(b, z, _NDTRI_P1)), polevl(b, z, _NDTRI_Q1))
    x1_far = b.divide(b.multiply(z, polevl(b, z, _NDTRI_P2)), polevl(b, z, _NDTRI_Q2))
    tail = b.subtract(x0, b.select(b.compare(t, const(b, y0, 8.0), "LT"), x1_near, x1_far))
    tail = b.select(upper, tail, b.negate(tail))
    r = b.select(b.compare(y, const(b, y0, e2), "GT"), mid, tail)
    r = b.select(b.or_(b.compare(y0, zero, "LT"), b.compare(y0, one, "GT")), const(b, y0, math.nan), r)
    r = b.select(b.compare(y0, one, "EQ"), const(b, y0, math.inf), r)
    return b.select(b.compare(y0, zero, "EQ"), const(b, y0, -math.inf), r)


@unary_special("special_log_ndtr")
def log_ndtr(b, x):
    """log of the normal CDF: log(erfcx(-t) / 2) - t^2 below -1 (t = x / sqrt 2), else
    log1p(-erfc(t) / 2)."""
    t = b.multiply(x, const(b, x, math.sqrt(0.5)))
    low = b.subtract(b.log(b.divide(erfcx(b, b.negate(t)), const(b, x, 2.0))), b.multiply(t, t))
    high = b.unary("log_plus_one", b.negate(b.divide(chlo(b, "erfc", t), const(b, x, 2.0))))
    return b.select(b.compare(x, const(b, x, -1.0), "LT"), low, high)


# -- bit-level float helpers: nextafter, frexp ----------------------------------------------------------
_INT_OF = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
           torch.bfloat16: torch.int16}


@register("nextafter")
def nextafter(ctx, x, y):
    """The float next to x in the direction of y, on the bit pattern (half types in their own 16
    bits, as CPU): y where x == y, NaN if either is, the smallest subnormal of y's sign from 0."""
    b = ctx.b
    dt = ctx.out[0].dtype
    xv, yv = operand(ctx, x, dt), operand(ctx, y, dt)
    it = _INT_OF[dt]
    bits = b.bitcast_convert(xv, it)
    one = b.constant(1, it, xv.shape)
    zero = b.zeros_like(xv)
    up = b.compare(b.compare(xv, yv, "LT"), b.compare(xv, zero, "GT"), "EQ")
    stepped = b.bitcast_convert(b.select(up, b.add(bits, one), b.subtract(bits, one)), dt)
    tiny = b.bitcast_convert(one, dt)
    from_zero = b.select(b.compare(yv, zero, "LT"), b.negate(tiny), tiny)
    r = b.select(b.compare(xv, zero, "EQ"), from_zero, stepped)
    r = b.select(b.compare(xv, yv, "EQ"), yv, r)
    return b.select(b.or_(b.is_nan(xv), b.is_nan(yv)), b.add(xv, yv), r)


@register("frexp.Tensor")
def frexp(ctx, x):
    """x = mantissa * 2^exponent with |mantissa| in [0.5, 1) (0, inf and NaN: themselves and 0).
    Done on the bit pattern with integer ops only, so subnormals (which float arithmetic on the
    device may flush to zero) are normalized with count_leading_zeros. Half types go through
    float32, as CPU's std::frexp on the converted value."""
    b = ctx.b
    out_dt = ctx.out[0].dtype
    cd = compute_dtype(out_dt)
    xv = b.convert(x, cd)
    it = _INT_OF[cd]
    width, mant_bits, bias = (64, 52, 1023) if cd == torch.float64 else (32, 23, 127)
    k = lambda v: b.constant(v, it, xv.shape)  # noqa: E731
    bits = b.bitcast_convert(xv, it)
    frac_mask = (1 << mant_bits) - 1
    sign = b.and_(bits, k(-(1 << (width - 1))))
    field = b.and_(b.binary("shift_right_logical", bits, k(mant_bits)), k((1 << (width - 1 - mant_bits)) - 1))
    frac = b.and_(bits, k(frac_mask))
    half_exp = k((bias - 1) << mant_bits)  # the exponent field of [0.5, 1)
    # normal numbers: replace the exponent field
    exp_normal = b.subtract(field, k(bias - 1))
    mant_normal = b.or_(b.or_(sign, half_exp), frac)
    # subnormals: value = frac * 2^(1 - bias - mant_bits), leading bit at position p
    p = b.subtract(k(width - 1), b.unary("count_leading_zeros", frac))
    exp_sub = b.subtract(p, k(mant_bits + bias - 2))
    shifted = b.and_(b.binary("shift_left", frac, b.subtract(k(mant_bits), p)), k(frac_mask))
    mant_sub = b.or_(b.or_(sign, half_exp), shifted)
    sub = b.compare(field, k(0), "EQ")
    exponent = b.select(sub, exp_sub, exp_normal)
    mant = b.bitcast_convert(b.select(sub, mant_sub, mant_normal), cd)
    special = b.or_(b.compare(b.or_(field, frac), k(0), "EQ"), b.compare(field, k((1 << (width - 1 - mant_bits)) - 1), "EQ"))
    mant = b.select(special, xv, mant)
    exponent = b.select(special, k(0), exponent)
    return b.convert(mant, out_dt), b.convert(exponent, ctx.out[1].dtype)


# -- xlogy, xlog1py ---------------------------------------------------------------------------------
def _x_times_log(ctx, x, y, log_name):
    """CPU's xlogy / xlog1py kernels (BinaryOpsKernel.cpp): NaN where y is NaN, else 0 where x == 0
    (even for y == 0 or inf), else x * log(y) (log1p). For half and bfloat16 CPU's log returns the
    half type (c10's reduced-float math), so the log is rounded before the multiply: two roundings,
    as CPU (one float32 pass differs from CPU in the last bit of ~30% of elements)."""
    b = ctx.b
    out = ctx.out[0].dtype
    cd = compute_dtype(out)
    xv, yv = rounded_operand(ctx, x), rounded_operand(ctx, y)
    lg = b.unary(log_name, yv)
    if cd != out:
        lg = b.convert(b.convert(lg, out), cd)
    r = b.multiply(xv, lg)
    r = b.select(b.compare(xv, const(b, xv, 0.0), "EQ"), const(b, xv, 0.0), r)
    return finish(ctx, b.select(b.is_nan(yv), const(b, yv, math.nan), r))


@register("xlogy.Tensor", "xlogy.Scalar_Self", "xlogy.Scalar_Other")
def xlogy(ctx, x, y):
    return _x_times_log(ctx, x, y, "log")


@register("special_xlog1py", "special_xlog1py.self_scalar", "special_xlog1py.other_scalar")
def xlog1py(ctx, x, y):
    return _x_times_log(ctx, x, y, "log_plus_one")


# -- hypot, shrink activations ----------------------------------------------------------------------
@register("hypot")
def hypot(ctx, x, y):
    """sqrt(x^2 + y^2) without overflow: max * sqrt(1 + (min/max)^2); inf if either is inf (even
    with a NaN), NaN if either is NaN otherwise, 0 for two zeros."""
    b = ctx.b
    ax, ay = b.abs(rounded_operand(ctx, x)), b.abs(rounded_operand(ctx, y))
    hi, lo = b.maximum(ax, ay), b.minimum(ax, ay)
    ratio = b.divide(lo, hi)
    r = b.multiply(hi, b.sqrt(b.add(const(b, hi, 1.0), b.multiply(ratio, ratio))))
    r = b.select(b.compare(hi, const(b, hi, 0.0), "EQ"), const(b, hi, 0.0), r)
    r = b.select(b.or_(b.is_nan(ax), b.is_nan(ay)), const(b, hi, math.nan), r)
    inf = const(b, hi, math.inf)
    r = b.select(b.or_(b.compare(ax, inf, "EQ"), b.compare(ay, inf, "EQ")), inf, r)
    return finish(ctx, r)


def _inside(ctx, x, lambd):
    """Bool: -lambd <= x <= lambd (false for NaN)."""
    b = ctx.b
    lv = operand(ctx, lambd, x.dtype, x.shape)
    return b.and_(b.compare(x, b.negate(lv), "GE"), b.compare(x, lv, "LE"))


@register("hardshrink")
def hardshrink(ctx, x, lambd=0.5):
    b = ctx.b
    return b.select(_inside(ctx, x, lambd), b.zeros_like(x), x)


@register("softshrink")
def softshrink(ctx, x, lambd=0.5):
    """x - lambd above lambd, x + lambd below -lambd, else 0 (x * 0, so NaN stays NaN)."""
    b = ctx.b
    cd = compute_dtype(x.dtype)
    xv = b.convert(x, cd)
    lv = operand(ctx, lambd, cd, x.shape)
    r = b.select(b.compare(xv, lv, "GT"), b.subtract(xv, lv),
                 b.select(b.compare(xv, b.negate(lv), "LT"), b.add(xv, lv), b.multiply(xv, const(b, xv, 0.0))))
    return finish(ctx, r)


@register("hardshrink_backward", "softshrink_backward")
def shrink_backward(ctx, grad, x, lambd):
    """The incoming gradient outside [-lambd, lambd], 0 inside (both shrinks)."""
    b = ctx.b
    g = operand(ctx, grad, ctx.out[0].dtype)
    xv = operand(ctx, x, x.dtype)
    return b.select(_inside(ctx, xv, lambd), b.zeros_like(g), g)


# -- integer ops: gcd, lcm, shifts --------------------------------------------------------------------
def gcd_values(b, x, y):
    """Euclid's algorithm on |x|, |y| elementwise in a stablehlo.while (gcd(0, 0) = 0)."""

    def cond(s, a, c):
        return any_true(s, s.compare(a, s.zeros_like(a), "NE"))

    def body(s, a, c):
        nz = s.compare(a, s.zeros_like(a), "NE")
        safe = s.select(nz, a, s.full_like(a, 1))
        return [s.select(nz, s.remainder(c, safe), a), s.select(nz, a, c)]

    if x.dtype.is_signed:
        x, y = b.abs(x), b.abs(y)
    _, g = while_loop(b, [x, y], cond, body)
    return g


def _integer_only(name, dt):
    """CPU's error for gcd / lcm of a non-integer dtype."""
    if dt.is_floating_point or dt.is_complex or dt == torch.bool:
        raise NotImplementedError(f'"{name}_cpu" not implemented for \'{dt}\'')


@register("gcd")
def gcd(ctx, x, y):
    dt = ctx.out[0].dtype
    _integer_only("gcd", dt)
    return gcd_values(ctx.b, operand(ctx, x, dt), operand(ctx, y, dt))


@register("lcm")
def lcm(ctx, x, y):
    """|x / gcd * y|, 0 when the gcd is 0; types narrower than int multiply in int32 and wrap after
    the abs, as C++'s integer promotion does on CPU."""
    b = ctx.b
    dt = ctx.out[0].dtype
    _integer_only("lcm", dt)
    xv, yv = operand(ctx, x, dt), operand(ctx, y, dt)
    g = gcd_values(b, xv, yv)
    zero = b.zeros_like(g)
    nz = b.compare(g, zero, "NE")
    q = b.divide(xv, b.select(nz, g, b.full_like(g, 1)))
    wide = torch.int32 if torch.iinfo(dt).bits < 32 else dt
    r = b.multiply(b.convert(q, wide), b.convert(yv, wide))
    if wide.is_signed:
        r = b.abs(r)
    return b.select(nz, b.convert(r, dt), zero)


def _shift(direction):
    """bitwise_left_shift / bitwise_right_shift with CPU's out-of-range rule: a negative shift or
    one of at least the bit width gives 0 (left, unsigned right) or the sign fill (signed right)."""
    def lower(ctx, x, y):
        b = ctx.b
        dt = ctx.out[0].dtype
        if dt.is_floating_point or dt.is_complex or dt == torch.bool:
            raise NotImplementedError(f'"{direction[0]}shift_cpu" not implemented for \'{dt}\'')  # as CPU
        xv, yv = operand(ctx, x, dt), operand(ctx, y, dt)
        width = torch.iinfo(dt).bits
        signed = dt.is_signed
        top = width - (1 if direction == "right" and signed else 0)
        out_of_range = b.or_(b.compare(yv, b.constant(top, dt, xv.shape), "GE"),
                             b.compare(yv, b.zeros_like(yv), "LT")) if signed else \
            b.compare(yv, b.constant(top, dt, xv.shape), "GE")
        safe = b.select(out_of_range, b.zeros_like(yv), yv)
        if direction == "left":
            r = b.binary("shift_left", xv, safe)
            fill = b.zeros_like(xv)
        else:
            r = b.binary("shift_right_arithmetic" if signed else "shift_right_logical", xv, safe)
            fill = b.binary("shift_right_arithmetic", xv, b.constant(top, dt, xv.shape)) if signed else b.zeros_like(xv)
        return b.select(out_of_range, fill, r)
    return lower


register("bitwise_left_shift.Tensor", "bitwise_left_shift.Tensor_Scalar", "bitwise_left_shift.Scalar_Tensor",
         "__lshift__.Tensor", "__lshift__.Scalar")(_shift("left"))
register("bitwise_right_shift.Tensor", "bitwise_right_shift.Tensor_Scalar", "bitwise_right_shift.Scalar_Tensor",
         "__rshift__.Tensor", "__rshift__.Scalar")(_shift("right"))



# -- regularized incomplete gamma functions: igamma (P), igammac (Q) ------------------------------------
def masked_iterate(b, active, state, step, max_iter, consts=()):
    """Runs `step(s, *state, *consts) -> (new_state, converged)` in a stablehlo.while on the elements
    still active (the others keep their state) until none is, or max_iter steps; returns the
    final state. `consts` are loop-invariant tensors the step reads."""
    n = len(state)

    def cond(s, i, act, *rest):
        return s.and_(s.compare(i, s.constant(max_iter, torch.int32), "LT"), any_true(s, act))

    def body(s, i, act, *rest):
        cur, cs = list(rest[:n]), list(rest[n:])
        new, conv = step(s, *cur, *cs)
        upd = [s.select(act, nv, ov) for nv, ov in zip(new, cur)]
        return [s.add(i, s.constant(1, torch.int32)), s.and_(act, s.not_(conv)), *upd, *cs]

    out = while_loop(b, [b.constant(0, torch.int32), active, *state, *consts], cond, body)
    return out[2:2 + n]


# Lanczos approximation (g = 6.0246800407767296) of Gamma, scaled by exp(g) for the
# x^a e^-x / Gamma(a) factor: numerator and denominator, highest degree first.
_LANCZOS_G = 6.024680040776729583740234375
_LANCZOS_NUM = [0.006061842346248906525783753964555936883222, 0.5098416655656676188125178644804694509993,
                19.51992788247617482847860966235652136208, 449.9445569063168119446858607650988409623,
                6955.999602515376140356310115515198987526, 75999.29304014542649875303443598909137092,
                601859.6171681098786670226533699352302507, 3481712.15498064590882071018964774556468,
                14605578.08768506808414169982791359218571, 43338889.32467613834773723740590533316085,
                86363131.28813859145546927288977868422342, 103794043.1163445451906271053616070238554,
                56906521.91347156388090791033559122686859]
_LANCZOS_DEN = [1., 66., 1925., 32670., 357423., 2637558., 13339535., 45995730., 105258076., 150917976.,
                120543840., 39916800., 0.]


def _lanczos_sum_expg_scaled(b, a):
    """The Lanczos rational function, evaluated in 1/a above 1 (coefficients reversed) to avoid
    overflow."""
    big = b.compare(b.abs(a), const(b, a, 1.0), "GT")
    inv = b.divide(const(b, a, 1.0), a)
    small_r = b.divide(polevl(b, a, _LANCZOS_NUM), polevl(b, a, _LANCZOS_DEN))
    big_r = b.divide(polevl(b, inv, _LANCZOS_NUM[::-1]), polevl(b, inv, _LANCZOS_DEN[::-1]))
    return b.select(big, big_r, small_r)


def _igam_fac(b, a, x):
    """x^a e^-x / Gamma(a): directly from logs when x is far from a (0 below exp's range), else
    through the Lanczos sum, which keeps the cancellation of a log x - x - lgamma(a) exact."""
    maxlog = math.log(torch.finfo(a.dtype).max)
    far = b.compare(b.abs(b.subtract(a, x)), b.multiply(const(b, a, 0.4), b.abs(a)), "GT")
    ax = b.subtract(b.subtract(b.multiply(a, b.log(x)), x), chlo(b, "lgamma", a))
    direct = b.select(b.compare(ax, const(b, a, -maxlog), "LT"), const(b, a, 0.0), b.exp(ax))
    fac = b.add(a, const(b, a, _LANCZOS_G - 0.5))
    res = b.divide(b.sqrt(b.divide(fac, const(b, a, math.e))), _lanczos_sum_expg_scaled(b, a))
    moderate = b.multiply(b.exp(b.subtract(a, x)), b.power(b.divide(x, fac), a))
    numfac = b.divide(b.add(b.subtract(x, a), const(b, a, 0.5 - _LANCZOS_G)), fac)
    large = b.exp(b.add(b.multiply(a, b.subtract(b.unary("log_plus_one", numfac), numfac)),
                        b.divide(b.multiply(x, const(b, a, 0.5 - _LANCZOS_G)), fac)))
    both_small = b.and_(b.compare(a, const(b, a, 200.0), "LT"), b.compare(x, const(b, a, 200.0), "LT"))
    near = b.multiply(res, b.select(both_small, moderate, large))
    return b.select(far, direct, near)


_IGAM_MAXITER = 2000


def _igam_series(b, a, x, active):
    """P(a, x) by its power series (DLMF 8.11.4): fac / a * sum_k x^k / ((a+1)...(a+k))."""
    eps = eps_of(a.dtype)
    ax = _igam_fac(b, a, x)

    def step(s, r, c, ans, a_, x_):
        r2 = s.add(r, s.constant(1.0, r.dtype, r.shape))
        c2 = s.multiply(c, s.divide(x_, r2))
        ans2 = s.add(ans, c2)
        return [r2, c2, ans2], s.compare(c2, s.multiply(s.constant(eps, r.dtype, r.shape), ans2), "LE")

    one = const(b, a, 1.0)
    active = b.and_(active, b.compare(ax, const(b, a, 0.0), "NE"))
    _, _, ans = masked_iterate(b, active, [a, one, one], step, _IGAM_MAXITER, [a, x])
    r = b.divide(b.multiply(ans, ax), a)
    return b.select(b.compare(ax, const(b, a, 0.0), "EQ"), const(b, a, 0.0), r)


def _igamc_series(b, a, x, active):
    """Q(a, x) for small x (DLMF 8.7.3), arranged to avoid the cancellation of 1 - P."""
    eps = eps_of(a.dtype)

    def step(s, n, fac, total, a_, x_):
        n2 = s.add(n, s.constant(1.0, n.dtype, n.shape))
        fac2 = s.multiply(fac, s.divide(s.negate(x_), n2))
        term = s.divide(fac2, s.add(a_, n2))
        total2 = s.add(total, term)
        return [n2, fac2, total2], s.compare(s.abs(term), s.multiply(s.constant(eps, n.dtype, n.shape), s.abs(total2)), "LE")

    zero, one = const(b, a, 0.0), const(b, a, 1.0)
    _, _, total = masked_iterate(b, active, [zero, one, zero], step, _IGAM_MAXITER - 1, [a, x])
    logx = b.log(x)
    lg = lambda v: chlo(b, "lgamma", v)  # noqa: E731
    term = b.negate(b.unary("exponential_minus_one", b.subtract(b.multiply(a, logx), lg(b.add(one, a)))))
    return b.subtract(term, b.multiply(b.exp(b.subtract(b.multiply(a, logx), lg(a))), total))


def _igamc_continued_fraction(b, a, x, active):
    """Q(a, x) by Legendre's continued fraction (DLMF 8.9.2), convergents rescaled when large."""
    dt = a.dtype
    eps = eps_of(dt)
    big, biginv = (4.503599627370496e15, 2.22044604925031308085e-16) if dt == torch.float64 else \
        (16777216., 5.9604644775390625E-8)
    ax = _igam_fac(b, a, x)
    one = const(b, a, 1.0)
    y = b.subtract(one, a)
    z = b.add(b.add(x, y), one)
    pkm1 = b.add(x, one)
    qkm1 = b.multiply(z, x)
    ans = b.divide(pkm1, qkm1)

    def step(s, c, y_, z_, pkm2, pkm1_, qkm2, qkm1_, ans_):
        k = lambda v: s.constant(v, dt, c.shape)  # noqa: E731
        c2, y2, z2 = s.add(c, k(1.0)), s.add(y_, k(1.0)), s.add(z_, k(2.0))
        yc = s.multiply(y2, c2)
        pk = s.subtract(s.multiply(pkm1_, z2), s.multiply(pkm2, yc))
        qk = s.subtract(s.multiply(qkm1_, z2), s.multiply(qkm2, yc))
        nz = s.compare(qk, k(0.0), "NE")
        r = s.divide(pk, qk)
        t = s.select(nz, s.abs(s.divide(s.subtract(ans_, r), r)), k(1.0))
        ans2 = s.select(nz, r, ans_)
        rescale = s.compare(s.abs(pk), k(big), "GT")
        sc = lambda v: s.select(rescale, s.multiply(v, k(biginv)), v)  # noqa: E731
        return [c2, y2, z2, sc(pkm1_), sc(pk), sc(qkm1_), sc(qk), ans2], s.compare(t, k(eps), "LE")

    active = b.and_(active, b.compare(ax, const(b, a, 0.0), "NE"))
    state = [const(b, a, 0.0), y, z, one, pkm1, x, qkm1, ans]
    ans = masked_iterate(b, active, state, step, _IGAM_MAXITER)[-1]
    return b.select(b.compare(ax, const(b, a, 0.0), "EQ"), const(b, a, 0.0), b.multiply(ans, ax))


def _igamma_pieces(b, a, x, upper):
    """P(a, x) (upper=False) or Q(a, x) (upper=True) following CPU's choice of method by region.
    Where CPU uses the uniform asymptotic expansion (a > 20 and x close to a), the power series
    (x < a) or the continued fraction are used instead; they converge there too, and the factor
    x^a e^-x / Gamma(a) comes from the Lanczos sum, so the results agree to rounding."""
    one, zero = const(b, a, 1.0), const(b, a, 0.0)
    # which method each element needs
    ratio = b.divide(b.abs(b.subtract(x, a)), a)
    asym = b.or_(b.and_(b.and_(b.compare(a, const(b, a, 20.0), "GT"), b.compare(a, const(b, a, 200.0), "LT")),
                        b.compare(ratio, const(b, a, 0.3), "LT")),
                 b.and_(b.compare(a, const(b, a, 200.0), "GT"),
                        b.compare(ratio, b.divide(const(b, a, 4.5), b.sqrt(a)), "LT")))
    x_lt_a = b.compare(x, a, "LT")
    # Q's own choice (used by Q, and by P where x > 1 and x > a): 1 - P by series, the continued
    # fraction, or Q's series
    q_by_p = b.or_(b.and_(b.compare(x, const(b, a, 1.1), "GT"), x_lt_a),
                   b.or_(b.and_(b.compare(x, const(b, a, 0.5), "LE"),
                                b.compare(b.divide(const(b, a, -0.4), b.log(x)), a, "LT")),
                         b.and_(b.and_(b.compare(x, const(b, a, 0.5), "GT"), b.compare(x, const(b, a, 1.1), "LE")),
                                b.compare(b.multiply(x, const(b, a, 1.1)), a, "LT"))))
    q_by_cf = b.and_(b.compare(x, const(b, a, 1.1), "GT"), b.not_(x_lt_a))
    q_by_series = b.and_(b.not_(q_by_p), b.not_(q_by_cf))
    q_by_p = b.or_(b.and_(asym, x_lt_a), b.and_(b.not_(asym), q_by_p))
    q_by_cf = b.or_(b.and_(asym, b.not_(x_lt_a)), b.and_(b.not_(asym), q_by_cf))
    q_by_series = b.and_(b.not_(asym), q_by_series)
    p_by_q = b.and_(b.and_(b.compare(x, one, "GT"), b.compare(x, a, "GT")), b.not_(b.and_(asym, x_lt_a)))
    if upper:
        need_p, need_cf, need_qs = q_by_p, q_by_cf, q_by_series
    else:
        need_p = b.not_(p_by_q)
        need_cf, need_qs = b.and_(p_by_q, q_by_cf), b.and_(p_by_q, q_by_series)
    p = _igam_series(b, a, x, need_p)
    q = b.select(need_cf, _igamc_continued_fraction(b, a, x, need_cf), _igamc_series(b, a, x, need_qs))
    if upper:
        r = b.select(need_p, b.subtract(one, p), q)
    else:
        r = b.select(p_by_q, b.subtract(one, q), p)
    # boundary values (SciPy's): NaN outside a, x >= 0; a == 0 is a step at x > 0; x == 0; infinities
    nan = const(b, a, math.nan)
    inf = const(b, a, math.inf)
    at_zero, at_inf = (one, zero) if upper else (zero, one)
    r = b.select(b.compare(x, inf, "EQ"), at_inf, r)
    r = b.select(b.compare(a, inf, "EQ"), b.select(b.compare(x, inf, "EQ"), nan, at_zero), r)
    r = b.select(b.compare(x, zero, "EQ"), at_zero, r)
    r = b.select(b.compare(a, zero, "EQ"), b.select(b.compare(x, zero, "GT"), at_inf, nan), r)
    return b.select(b.or_(b.compare(x, zero, "LT"), b.compare(a, zero, "LT")), nan, r)


@register("igamma")
def igamma(ctx, a, x):
    return finish(ctx, _igamma_pieces(ctx.b, float_input(ctx, a), float_input(ctx, x), upper=False))


@register("igammac")
def igammac(ctx, a, x):
    return finish(ctx, _igamma_pieces(ctx.b, float_input(ctx, a), float_input(ctx, x), upper=True))


# -- orthogonal polynomials of a tensor degree n ----------------------------------------------------
# CPU truncates n to int64 (NaN, inf: the x86 conversion's minimum, so n < 0 and the value 0), then
# takes special cases, a closed form in angles for large n inside (-1, 1), or the three-term
# recurrence up to n. The recurrence runs in a stablehlo.while up to the largest n among the
# elements that need it, stopping early once all of them are NaN (as CPU's loop does per element).
def _recurrence(b, x, n_i, k0, last, kstep, p0, q0, step, active):
    """q after iterating (p, q) <- (q, step(s, k, x, p, q)) for k = k0, k0+kstep, ... <= last
    (int64 tensors), on the `active` elements; NaN stops an element."""
    i64 = torch.int64
    k_init = b.constant(k0, i64, x.shape)
    active = b.and_(active, b.and_(b.compare(k_init, last, "LE"), b.not_(b.is_nan(q0))))

    def body(s, k, p, q, x_, last_):
        r = step(s, s.convert(k, x_.dtype), x_, p, q)
        k2 = s.add(k, s.constant(kstep, i64, k.shape))
        stop = s.or_(s.compare(k2, last_, "GT"), s.is_nan(r))
        return [k2, q, r], stop

    _, _, q = masked_iterate(b, active, [k_init, p0, q0], body, 2 ** 31 - 1, [x, last])
    return q


def _degree(b, n):
    """n (float) truncated to int64 as CPU's static_cast (NaN / inf / out of range -> int64 min)."""
    return b.convert(n, torch.int64)


def _kf(b, n_i, like):
    """int64 n as a float of like's type."""
    return b.convert(n_i, like.dtype)


def _chebyshev(kind, shifted):
    """Chebyshev polynomials T, U, V, W of y = x (or y = 2x - 1 for the shifted ones)."""
    def fn(b, x, n):
        n_i = _degree(b, n)
        one, zero = const(b, x, 1.0), const(b, x, 0.0)
        y = b.subtract(b.add(x, x), one) if shifted else x
        nf = _kf(b, n_i, x)
        even = b.compare(b.remainder(n_i, b.constant(2, torch.int64, x.shape)), b.constant(0, torch.int64, x.shape), "EQ")
        n1 = _kf(b, b.add(n_i, b.constant(1, torch.int64, x.shape)), x)       # n + 1
        n21 = _kf(b, b.add(b.add(n_i, n_i), b.constant(1, torch.int64, x.shape)), x)  # 2n + 1
        pm = lambda v: b.select(even, v, b.negate(v))  # noqa: E731
        # the values at y = 1 and y = -1
        hi = {"t": one, "u": n1, "v": one, "w": n21}[kind]
        lo = {"t": pm(one), "u": pm(n1), "v": pm(n21), "w": pm(one)}[kind]
        if shifted:
            at_hi, at_lo = b.compare(x, one, "EQ"), b.compare(x, zero, "EQ")
        else:
            at_hi = b.compare(x, one, "EQ")
            at_lo = b.compare(x, b.negate(one), "EQ")
        # closed forms in theta = acos(y)
        theta = chlo(b, "acos", y)
        if kind == "t":
            closed = b.unary("cosine", b.multiply(nf, theta))
        elif kind == "u":
            st = b.unary("sine", theta)
            closed = b.select(b.compare(st, zero, "NE"), b.divide(b.unary("sine", b.multiply(n1, theta)), st),
                              b.divide(b.multiply(n1, b.unary("cosine", b.multiply(n1, theta))), y))
        else:
            half = b.divide(theta, const(b, x, 2.0))
            nh = b.add(nf, const(b, x, 0.5))
            if kind == "v":
                closed = b.select(b.compare(b.unary("sine", half), one, "NE"),
                                  b.divide(b.unary("cosine", b.multiply(nh, theta)), b.unary("cosine", half)), pm(n21))
            else:
                degenerate = pm(one) if shifted else b.select(b.compare(x, zero, "GT"), n21, pm(one))
                closed = b.select(b.compare(b.unary("cosine", half), one, "NE"),
                                  b.divide(b.unary("sine", b.multiply(nh, theta)), b.unary("sine", half)), degenerate)
        threshold = {"t": 6, "u": 8, "v": 8, "w": 8}[kind] if not shifted else {"t": 6, "u": 6, "v": 6, "w": 4}[kind]
        use_closed = b.and_(b.compare(n_i, b.constant(threshold, torch.int64, x.shape), "GT"),
                            b.compare(b.abs(y), one, "LT"))
        two_y = b.add(y, y)
        q1 = {"t": y, "u": two_y, "v": b.subtract(two_y, one), "w": b.add(two_y, one)}[kind]
        n_is = lambda v: b.compare(n_i, b.constant(v, torch.int64, x.shape), "EQ")  # noqa: E731
        special = b.or_(b.or_(at_hi, at_lo), b.or_(use_closed, b.compare(n_i, b.constant(1, torch.int64, x.shape), "LE")))
        rec = _recurrence(b, y, n_i, 2, n_i, 1, one, q1,
                          lambda s, k, y_, p, q: s.subtract(s.multiply(s.add(y_, y_), q), p), b.not_(special))
        r = b.select(n_is(1), q1, rec)
        r = b.select(n_is(0), one, r)
        r = b.select(use_closed, closed, r)
        r = b.select(at_lo, lo, r)
        r = b.select(at_hi, hi, r)
        return b.select(b.compare(n_i, b.constant(0, torch.int64, x.shape), "LT"), zero, r)
    return fn


def _hermite(physicists):
    """Hermite H (physicists') or He (probabilists'); NaN above degree 128 (float32) / 512."""
    def fn(b, x, n):
        n_i = _degree(b, n)
        one, zero = const(b, x, 1.0), const(b, x, 0.0)
        i64 = lambda v: b.constant(v, torch.int64, x.shape)  # noqa: E731
        q1 = b.add(x, x) if physicists else x
        if physicists:  # k = 2, 4, ... < 2n: r = 2x q - k p
            rec = _recurrence(b, x, n_i, 2, b.subtract(b.add(n_i, n_i), i64(1)), 2, one, q1,
                              lambda s, k, x_, p, q: s.subtract(s.multiply(s.add(x_, x_), q), s.multiply(k, p)),
                              b.compare(n_i, i64(1), "GT"))
        else:  # k = 1 .. n-1: r = x q - k p
            rec = _recurrence(b, x, n_i, 1, b.subtract(n_i, i64(1)), 1, one, q1,
                              lambda s, k, x_, p, q: s.subtract(s.multiply(x_, q), s.multiply(k, p)),
                              b.compare(n_i, i64(1), "GT"))
        limit = 512 if x.dtype == torch.float64 else 128
        r = b.select(b.compare(n_i, i64(limit), "GT"), const(b, x, math.nan), rec)
        r = b.select(b.compare(n_i, i64(1), "EQ"), q1, r)
        r = b.select(b.compare(n_i, i64(0), "EQ"), one, r)
        return b.select(b.compare(n_i, i64(0), "LT"), zero, r)
    return fn


def _laguerre(b, x, n):
    """Laguerre L_n: 1 at x = 0; ((2k + 1 - x) q - k p) / (k + 1)."""
    n_i = _degree(b, n)
    one, zero = const(b, x, 1.0), const(b, x, 0.0)
    i64 = lambda v: b.constant(v, torch.int64, x.shape)  # noqa: E731
    q1 = b.subtract(one, x)

    def step(s, k, x_, p, q):
        o = s.constant(1.0, x_.dtype, x_.shape)
        return s.divide(s.subtract(s.multiply(s.add(s.add(k, k), s.subtract(o, x_)), q), s.multiply(k, p)), s.add(k, o))

    x_zero = b.compare(b.abs(x), zero, "EQ")
    rec = _recurrence(b, x, n_i, 1, b.subtract(n_i, i64(1)), 1, one, q1, step,
                      b.and_(b.not_(x_zero), b.compare(n_i, i64(1), "GT")))
    r = b.select(b.compare(n_i, i64(1), "EQ"), q1, rec)
    r = b.select(b.or_(x_zero, b.compare(n_i, i64(0), "EQ")), one, r)
    return b.select(b.compare(n_i, i64(0), "LT"), zero, r)


def _legendre(b, x, n):
    """Legendre P_n: +-1 at |x| = 1; ((2k + 1) x q - k p) / (k + 1)."""
    n_i = _degree(b, n)
    one, zero = const(b, x, 1.0), const(b, x, 0.0)
    i64 = lambda v: b.constant(v, torch.int64, x.shape)  # noqa: E731

    def step(s, k, x_, p, q):
        o = s.constant(1.0, x_.dtype, x_.shape)
        return s.divide(s.subtract(s.multiply(s.multiply(s.add(s.add(k, k), o), x_), q), s.multiply(k, p)), s.add(k, o))

    edge = b.compare(b.abs(x), one, "EQ")
    rec = _recurrence(b, x, n_i, 1, b.subtract(n_i, i64(1)), 1, one, x, step,
                      b.and_(b.not_(edge), b.compare(n_i, i64(1), "GT")))
    r = b.select(b.compare(n_i, i64(1), "EQ"), x, rec)
    r = b.select(b.compare(n_i, i64(0), "EQ"), one, r)
    even = b.compare(b.remainder(n_i, i64(2)), i64(0), "EQ")
    r = b.select(edge, b.select(b.or_(b.compare(x, zero, "GT"), even), one, b.negate(one)), r)
    return b.select(b.compare(n_i, i64(0), "LT"), zero, r)


def _register_polynomial(name, fn):
    def lower(ctx, x, n):
        return finish(ctx, fn(ctx.b, float_input(ctx, x), float_input(ctx, n)))
    register(f"special_{name}", f"special_{name}.x_scalar", f"special_{name}.n_scalar")(lower)


for _kind in "tuvw":
    _register_polynomial(f"chebyshev_polynomial_{_kind}", _chebyshev(_kind, False))
    _register_polynomial(f"shifted_chebyshev_polynomial_{_kind}", _chebyshev(_kind, True))
_register_polynomial("hermite_polynomial_h", _hermite(True))
_register_polynomial("hermite_polynomial_he", _hermite(False))
_register_polynomial("laguerre_polynomial_l", _laguerre)
_register_polynomial("legendre_polynomial_p", _legendre)


# -- Bessel functions of real argument: j0, j1, y0, y1, modified i0, i1, k0, k1 (and scaled k), airy_ai
# Cephes' rational / Chebyshev coefficients, highest degree (or, for Chebyshev series, the highest
# order term) first. J/Y: R for |x| <= 5 (j), Y for x <= 5 (y), P/Q the asymptotic amplitude and
# phase corrections beyond 5 (shared by j and y of the same order).
_BESSEL = {
    "J0_PP": [0.0007969367292973471, 0.08283523921074408, 1.239533716464143, 5.447250030587687, 8.74716500199817,
            5.303240382353949, 1.0],
    "J0_PQ": [0.0009244088105588637, 0.08562884743544745, 1.2535274390105895, 5.470977403304171,
            8.761908832370695, 5.306052882353947, 1.0],
    "J0_QP": [-0.011366383889846916, -1.2825271867050931, -19.553954425773597, -93.20601521237683,
            -177.68116798048806, -147.07750515495118, -51.41053267665993, -6.050143506007285],
    "J0_QQ": [64.3178256118178, 856.4300259769806, 3882.4018360540163, 7240.467741956525, 5930.727011873169,
            2062.0933166032783, 242.0057402402914],
    "J0_RP": [-4794432209.782018, 1956174919465.5657, -249248344360967.72, 9708622510473064.0],
    "J0_RQ": [499.563147152651, 173785.4016763747, 48440965.83399621, 11185553704.535683, 2112775201154.892,
            310518229857422.56, 3.1812195594320496e+16, 1.7108629408104315e+18],
    "J1_PP": [0.0007621256162081731, 0.07313970569409176, 1.1271960812968493, 5.112079511468076,
            8.424045901417724, 5.214515986823615, 1.0],
    "J1_PQ": [0.0005713231280725487, 0.06884559087544954, 1.105142326340617, 5.073863861286015, 8.399855543276042,
            5.209828486823619, 1.0],
    "J1_QP": [0.05108625947501766, 4.982138729512334, 75.82382841325453, 366.7796093601508, 710.8563049989261,
            597.4896124006136, 211.68875710057213, 25.207020585802372],
    "J1_QQ": [74.23732770356752, 1056.4488603826283, 4986.410583376536, 9562.318924047562, 7997.041604473507,
            2826.1927851763908, 336.0936078106983],
    "J1_RP": [-899971225.7055594, 452228297998.19403, -72749424522181.83, 3682957328638529.0],
    "J1_RQ": [620.8364781180543, 256987.25675774884, 83514679.14319493, 22151159547.97925, 4749141220799.914,
            784369607876235.9, 8.952223361846274e+16, 5.322786203326801e+18],
    "Y0_YP": [15592.436785523574, -14663929.59039716, 5435264770.518765, -982136065717.9115, 87590639439536.7,
            -3466283033847297.0, 4.4273326857256984e+16, -1.8495080043698668e+16],
    "Y0_YQ": [1041.2835366425984, 626107.330137135, 268919633.39381415, 86400248710.3935, 20297961275010.555,
            3171577528429750.5, 2.5059625617265306e+17],
    "Y1_YP": [1263204747.9017804, -647355876379.1603, 114509511541823.73, -8127702555013251.0,
            2.024394757135949e+17, -7.788771962659501e+17],
    "Y1_YQ": [594.3015923461282, 235564.09294306856, 73481194.44597217, 18760131610.870617, 3882312774962.3857,
            620557727146953.8, 6.871410873553005e+16, 3.9727060811656064e+18],
    "K0_A": [1.374465435613523e-16, 4.25981614279661e-14, 1.0349695257633842e-11, 1.904516377220209e-09,
            2.5347910790261494e-07, 2.286212103119452e-05, 0.001264615411446926, 0.0359799365153615,
            0.3442898999246285, -0.5353273932339028],
    "K0_B": [5.300433772686263e-18, -1.6475804301524212e-17, 5.2103915050390274e-17, -1.678231096805412e-16,
            5.512055978524319e-16, -1.848593377343779e-15, 6.3400764774050706e-15, -2.2275133269916698e-14,
            8.032890775363575e-14, -2.9800969231727303e-13, 1.140340588208475e-12, -4.514597883373944e-12,
            1.8559491149547177e-11, -7.957489244477107e-11, 3.577397281400301e-10, -1.69753450938906e-09,
            8.574034017414225e-09, -4.660489897687948e-08, 2.766813639445015e-07, -1.8317555227191195e-06,
            1.39498137188765e-05, -0.00012849549581627802, 0.0015698838857300533, -0.0314481013119645,
            2.4403030820659555],
    "K1_A": [-7.023863479386288e-18, -2.427449850519366e-15, -6.666901694199329e-13, -1.4114883926335278e-10,
            -2.213387630734726e-08, -2.4334061415659684e-06, -0.0001730288957513052, -0.006975723859639864,
            -0.12261118082265715, -0.3531559607765449, 1.5253002273389478],
    "K1_B": [-5.756744483665017e-18, 1.7940508731475592e-17, -5.689462558442859e-17, 1.838093544366639e-16,
            -6.057047248373319e-16, 2.038703165624334e-15, -7.019837090418314e-15, 2.4771544244813043e-14,
            -8.976705182324994e-14, 3.3484196660784293e-13, -1.2891739609510289e-12, 5.13963967348173e-12,
            -2.1299678384275683e-11, 9.218315187605006e-11, -4.1903547593418965e-10, 2.015049755197033e-09,
            -1.0345762465678097e-08, 5.7410841254500495e-08, -3.5019606030878126e-07, 2.406484947837217e-06,
            -1.936197974166083e-05, 0.00019521551847135162, -0.002857816859622779, 0.10392373657681724,
            2.7206261904844427],
    "AIRY_AN": [0.346538101525629, 12.007595273964581, 76.27960536152345, 168.08922493463058, 159.75639135016442,
            70.53609068404442, 14.026469116338967, 1.0],
    "AIRY_AD": [0.5675945326387702, 14.75625625848472, 84.51389701414746, 177.31808814540045, 164.2346928715297,
            71.47784008255756, 14.095913560783403, 1.0],
    "AIRY_AFN": [-0.1316963234183318, -0.6264565444319123, -0.6931580360369335, -0.2797799815451191,
            -0.04919001326095003, -0.004062659235948854, -0.0001592764962392621, -2.776491081552329e-06,
            -1.6778769848911465e-08],
    "AIRY_AFD": [13.356042070655324, 32.682503279522464, 26.736704094149957, 9.187074029072596, 1.4752914677166642,
            0.11568717379518804, 0.004402916416152112, 7.547203482874142e-05, 4.5185009297058035e-07],
    "AIRY_AGN": [0.01973399320916857, 0.39110302961568827, 1.0657989759959559, 0.9391692298166502,
            0.35146565610554764, 0.06338889196289255, 0.005858041130483885, 0.000282851600836737,
            6.98793669997261e-06, 8.117892395543892e-08, 3.415517847659236e-10],
    "AIRY_AGD": [9.30892908077442, 19.835292871831214, 15.564662893286462, 5.476860694229755, 0.9542936116189619,
            0.08645808263523921, 0.004126565238242226, 0.00010125908511650914, 1.1716673321441352e-06,
            4.9183457006293e-09],
}
_B = _BESSEL
_SQRT_2_PI = 0.797884560802865355879892119868763737   # sqrt(2 / pi)
_TWO_PI = 0.636619772367581343075535053490057448      # 2 / pi


def _ratio(b, z, num, den):
    """polevl(z, num) / polevl(z, den)."""
    return b.divide(polevl(b, z, num), polevl(b, z, den))


def _bessel_asymptotic(b, x, order, kind):
    """Beyond 5: sqrt(2 / (pi x)) (P cos(x - phase) - 5/x Q sin(x - phase)) for J, (P sin + 5/x Q cos)
    for Y, with phase pi/4 (order 0) or 3 pi/4 (order 1)."""
    g = "J0" if order == 0 else "J1"
    five_x = b.divide(const(b, x, 5.0), x)
    w = b.divide(const(b, x, 25.0), b.multiply(x, x)) if order == 0 else b.multiply(five_x, five_x)
    amp = _ratio(b, w, _B[g + "_PP"], _B[g + "_PQ"])
    phase = b.multiply(five_x, _ratio(b, w, _B[g + "_QP"], _B[g + "_QQ"]))
    shifted = b.subtract(x, const(b, x, math.pi / 4 if order == 0 else 3 * math.pi / 4))
    c, s = b.unary("cosine", shifted), b.unary("sine", shifted)
    if kind == "j":
        r = b.subtract(b.multiply(amp, c), b.multiply(phase, s))
    else:
        r = b.add(b.multiply(amp, s), b.multiply(phase, c))
    return b.divide(b.multiply(r, const(b, x, _SQRT_2_PI)), b.sqrt(x))


def _j0(b, x):
    x = b.abs(x)
    x2 = b.multiply(x, x)
    tiny = b.subtract(const(b, x, 1.0), b.divide(x2, const(b, x, 4.0)))
    near = b.multiply(b.subtract(x2, const(b, x, 5.78318596294678452118)),
                      b.subtract(x2, const(b, x, 30.4712623436620863991)))
    near = b.divide(b.multiply(near, polevl(b, x2, _B["J0_RP"])), polevl(b, x2, _B["J0_RQ"]))
    near = b.select(b.compare(x, const(b, x, 1e-5), "LT"), tiny, near)
    return b.select(b.compare(x, const(b, x, 5.0), "LE"), near, _bessel_asymptotic(b, x, 0, "j"))


def _j1(b, x):
    ax = b.abs(x)
    x2 = b.multiply(ax, ax)
    near = b.multiply(b.multiply(_ratio(b, x2, _B["J1_RP"], _B["J1_RQ"]), ax),
                      b.subtract(x2, const(b, x, 14.6819706421238932572)))
    near = b.multiply(near, b.subtract(x2, const(b, x, 49.2184563216946036703)))
    r = b.select(b.compare(ax, const(b, x, 5.0), "LE"), near, _bessel_asymptotic(b, ax, 1, "j"))
    return _odd(b, x, r)


def _y_edges(b, x, r):
    """-inf at 0, NaN below (y0, y1 are real only for x > 0)."""
    zero = const(b, x, 0.0)
    r = b.select(b.compare(x, zero, "LT"), const(b, x, math.nan), r)
    return b.select(b.compare(x, zero, "EQ"), const(b, x, -math.inf), r)


def _y0(b, x):
    x2 = b.multiply(x, x)
    near = b.add(_ratio(b, x2, _B["Y0_YP"], _B["Y0_YQ"]),
                 b.multiply(b.multiply(const(b, x, _TWO_PI), b.log(x)), _j0(b, x)))
    r = b.select(b.compare(x, const(b, x, 5.0), "LE"), near, _bessel_asymptotic(b, x, 0, "y"))
    return _y_edges(b, x, r)


def _y1(b, x):
    x2 = b.multiply(x, x)
    one = const(b, x, 1.0)
    near = b.add(b.multiply(x, _ratio(b, x2, _B["Y1_YP"], _B["Y1_YQ"])),
                 b.multiply(const(b, x, _TWO_PI), b.subtract(b.multiply(_j1(b, x), b.log(x)), b.divide(one, x))))
    r = b.select(b.compare(x, const(b, x, 5.0), "LE"), near, _bessel_asymptotic(b, x, 1, "y"))
    return _y_edges(b, x, r)


unary_special("special_bessel_j0")(_j0)
unary_special("special_bessel_j1")(_j1)
unary_special("special_bessel_y0")(_y0)
unary_special("special_bessel_y1")(_y1)
unary_special("special_modified_bessel_i0")(lambda b, x: _bessel_i(b, x, 0))
unary_special("special_modified_bessel_i1")(lambda b, x: _bessel_i(b, x, 1))


def _bessel_k(b, x, order, scaled):
    """K0 / K1 (times exp(x) when scaled): near 0 a Chebyshev series in x^2 - 2 plus the
    log(x/2) I term; beyond 2 exp(-x) / sqrt(x) times a Chebyshev series in 8/x - 2. inf at 0,
    NaN below."""
    g = "K0" if order == 0 else "K1"
    zero = const(b, x, 0.0)
    near_series = chbevl(b, b.subtract(b.multiply(x, x), const(b, x, 2.0)), _B[g + "_A"])
    log_half = b.log(b.multiply(const(b, x, 0.5), x))
    if order == 0:
        near = b.subtract(near_series, b.multiply(log_half, _bessel_i(b, x, 0)))
    else:
        near = b.add(b.multiply(log_half, _bessel_i(b, x, 1)), b.divide(near_series, x))
    far = chbevl(b, b.subtract(b.divide(const(b, x, 8.0), x), const(b, x, 2.0)), _B[g + "_B"])
    if scaled:
        near = b.multiply(near, b.exp(x))
    else:
        far = b.multiply(b.exp(b.negate(x)), far)
    far = b.divide(far, b.sqrt(x))
    r = b.select(b.compare(x, const(b, x, 2.0), "LE"), near, far)
    r = b.select(b.compare(x, zero, "LT"), const(b, x, math.nan), r)
    return b.select(b.compare(x, zero, "EQ"), const(b, x, math.inf), r)


unary_special("special_modified_bessel_k0")(lambda b, x: _bessel_k(b, x, 0, False))
unary_special("special_modified_bessel_k1")(lambda b, x: _bessel_k(b, x, 1, False))
unary_special("special_scaled_modified_bessel_k0")(lambda b, x: _bessel_k(b, x, 0, True))
unary_special("special_scaled_modified_bessel_k1")(lambda b, x: _bessel_k(b, x, 1, True))

# 1, -1/6, 1/120, ...: the Taylor series of sin(x)/x in x^2, highest degree first
_SINC_TAYLOR = [1 / 6227020800.0, -1 / 39916800.0, 1 / 362880.0, -1 / 5040.0, 1 / 120.0, -1 / 6.0, 1.0]


@unary_special("special_spherical_bessel_j0")
def spherical_bessel_j0(b, x):
    """sin(x) / x; its Taylor series below 1/2; 0 at +-inf."""
    series = polevl(b, b.multiply(x, x), _SINC_TAYLOR)
    r = b.select(b.compare(b.abs(x), const(b, x, 0.5), "LT"), series, b.divide(b.unary("sine", x), x))
    return b.select(b.compare(b.abs(x), const(b, x, math.inf), "EQ"), const(b, x, 0.0), r)


@unary_special("special_airy_ai")
def airy_ai(b, x):
    """Ai(x): the Maclaurin series f(x) c1 - g(x) c2 on [-2.09, 2.09) (summed in a while loop to
    machine precision), Cephes' rational asymptotic forms beyond; 0 above 103.892, NaN at +-inf."""
    one = const(b, x, 1.0)
    ispi = 5.64189583547756286948e-01  # 1 / sqrt(pi)
    # x < -2.09: oscillating asymptotic form
    sq = b.sqrt(b.negate(x))
    zeta_n = b.divide(b.multiply(b.multiply(const(b, x, -2.0), x), sq), const(b, x, 3.0))
    z = b.divide(one, zeta_n)
    zz = b.multiply(z, z)
    f_corr = b.add(one, b.divide(b.multiply(zz, polevl(b, zz, _B["AIRY_AFN"])), polevl(b, zz, _B["AIRY_AFD"])))
    g_corr = b.multiply(z, _ratio(b, zz, _B["AIRY_AGN"], _B["AIRY_AGD"]))
    t = b.add(zeta_n, const(b, x, 0.25 * math.pi))
    st, ct = b.unary("sine", t), b.unary("cosine", t)
    neg = b.multiply(b.divide(const(b, x, ispi), b.sqrt(sq)),
                     b.subtract(b.multiply(st, f_corr), b.multiply(ct, g_corr)))
    # x >= 2.09: exponentially decaying form
    zeta_p = b.divide(b.multiply(b.multiply(const(b, x, 2.0), x), b.sqrt(x)), const(b, x, 3.0))
    inv = b.divide(one, zeta_p)
    pos = b.divide(b.multiply(const(b, x, ispi), _ratio(b, inv, _B["AIRY_AN"], _B["AIRY_AD"])),
                   b.multiply(b.multiply(const(b, x, 2.0), b.sqrt(b.sqrt(x))), b.exp(zeta_p)))
    # the power series: f = sum 3^k (1/3)_k x^3k / (3k)!, g likewise with (2/3)_k x^(3k+1) / (3k+1)!
    eps = torch.finfo(x.dtype).eps
    mid = b.and_(b.compare(x, const(b, x, -2.09), "GE"), b.compare(x, const(b, x, 2.09), "LT"))
    cube = b.multiply(b.multiply(x, x), x)

    def step(s, f, g, k, m, n, z_):
        c = lambda v: s.constant(v, x.dtype, x.shape)  # noqa: E731
        m2 = s.multiply(m, z_)
        k2 = s.add(k, c(1.0))
        m2 = s.divide(m2, k2)
        n2 = s.multiply(n, z_)
        k2 = s.add(k2, c(1.0))
        n2 = s.divide(n2, k2)
        m2 = s.divide(m2, k2)
        f2 = s.add(f, m2)
        k2 = s.add(k2, c(1.0))
        n2 = s.divide(n2, k2)
        g2 = s.add(g, n2)
        conv = s.not_(s.compare(s.abs(s.divide(m2, f2)), c(eps), "GT"))
        return [f2, g2, k2, m2, n2], conv

    f, g, _, _, _ = masked_iterate(b, mid, [one, x, one, one, x], step, 2 ** 31 - 1, [cube])
    series = b.subtract(b.multiply(const(b, x, 0.355028053887817239260), f),
                        b.multiply(const(b, x, 0.258819403792806798405), g))
    r = b.select(mid, series, b.select(b.compare(x, const(b, x, -2.09), "LT"), neg, pos))
    r = b.select(b.compare(x, const(b, x, 103.892), "GT"), const(b, x, 0.0), r)
    return b.select(b.compare(b.abs(x), const(b, x, math.inf), "EQ"), const(b, x, math.nan), r)
