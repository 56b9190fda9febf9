"""Discrete Fourier transforms: the core ATen ops _fft_c2c, _fft_r2c and _fft_c2r, lowered to
stablehlo.fft. Every torch.fft function (fft, ifft2, rfftn, irfft, hfft, ihfftn, ...), stft / istft,
and the backward formulas of the three ops (which call them again) are built on these.

stablehlo.fft transforms the innermost 1 to 3 dimensions of its operand: the transformed dims are
moved last (in the order given, since the one-sided dim of r2c / c2r is `dim[-1]`), transformed in
passes of at most three dims, and moved back. FFT / RFFT are unnormalized and IFFT / IRFFT divide by
the signal size, so one final scale gives each of PyTorch's normalization modes
(0: none, 1: 1/sqrt(n), 2: 1/n, with n the product of the signal sizes).
"""
from __future__ import annotations

import math

import torch

from .builder import Builder, TensorType, Value, i64_array
from .registry import in_format, register

_MAX_FFT_RANK = 3  # stablehlo.fft transforms at most the three innermost dims


def _fft(b: Builder, x: Value, kind: str, lengths) -> Value:
    """One stablehlo.fft of `kind` (FFT, IFFT, RFFT, IRFFT) over the innermost len(lengths) dims."""
    shape = list(x.shape)
    k = len(lengths)
    if kind == "RFFT":
        shape[-1] = lengths[-1] // 2 + 1
        dtype = x.dtype.to_complex()
    elif kind == "IRFFT":
        shape[-k:] = lengths
        dtype = x.dtype.to_real()
    else:
        dtype = x.dtype
    t = TensorType(tuple(shape), dtype)
    if t.numel == 0:  # nothing to transform (an empty batch): XLA need not see it
        return b.constant(0, dtype, t.shape)
    return b.op("stablehlo.fft", [x], [t], {"fft_type": f"#stablehlo<fft_type {kind}>",
                                            "fft_length": i64_array(lengths)})[0]


def _c2c(b: Builder, x: Value, dims, kind: str) -> Value:
    """FFT or IFFT of x over `dims`, in passes of at most three dims (each pass moves its dims
    innermost and back)."""
    dims = list(dims)
    while dims:
        part, dims = dims[-_MAX_FFT_RANK:], dims[:-_MAX_FFT_RANK]
        y, inv = _to_end(b, x, part)
        x = b.transpose(_fft(b, y, kind, list(y.shape[-len(part):])), inv)
    return x


def _to_end(b: Builder, x: Value, dims):
    """x with `dims` moved last (in that order); returns it and the permutation that undoes it."""
    dims = [d % x.rank for d in dims]
    perm = [d for d in range(x.rank) if d not in dims] + dims
    return b.transpose(x, perm), [perm.index(d) for d in range(x.rank)]


def _scale(b: Builder, x: Value, factor: float) -> Value:
    """x times a real factor (a complex x: both parts scaled, so inf/NaN parts stay as they are)."""
    if factor == 1.0:
        return x
    if x.dtype.is_complex:
        re, im = b.real_part(x), b.imag_part(x)
        f = b.constant(factor, re.dtype, re.shape)
        return b.make_complex(b.multiply(re, f), b.multiply(im, f))
    return b.multiply(x, b.constant(factor, x.dtype, x.shape))


def _norm_factor(normalization: int, n: int, inverse: bool) -> float:
    """What the (unnormalized forward, 1/n-scaled inverse) result is multiplied by for
    PyTorch's normalization mode over a signal of n points."""
    want = {0: 1.0, 1: 1.0 / math.sqrt(n), 2: 1.0 / n}[normalization] if n else 1.0
    return want * n if inverse else want


@register("_fft_c2c")
def fft_c2c(ctx, x, dim, normalization, forward):
    """Complex-to-complex transform over `dim`: FFT if forward, else the unnormalized IFFT, then
    scaled by the normalization mode."""
    b = ctx.b
    y = _c2c(b, x, dim, "FFT" if forward else "IFFT")
    n = math.prod(x.shape[d] for d in dim)
    return _scale(b, y, _norm_factor(normalization, n, not forward))


def _r2c_layout(outs, x, dim, *args):
    """CPU's r2c over every dim of a contiguous input, in order (rfft2 of an image, rfftn), is
    row-major where the meta kernel permutes it; elsewhere the meta's layout is CPU's for the cases
    checked (last dims, any subset in order), though not for all permuted inputs."""
    if list(dim) == list(range(x.dim())) and x.is_contiguous():
        return [in_format(outs[0], torch.contiguous_format)]
    return [None]


@register("_fft_r2c", layout=_r2c_layout)
def fft_r2c(ctx, x, dim, normalization, onesided):
    """Real-to-complex forward transform over `dim`: RFFT over the last of them (and up to two
    more), FFT over the rest. Without onesided the full spectrum is the c2c transform of x."""
    b = ctx.b
    n = math.prod(x.shape[d] for d in dim)
    y, inv = _to_end(b, x, dim)
    signal = range(y.rank - len(dim), y.rank)  # where `dim` are now
    if onesided:
        k = min(_MAX_FFT_RANK, len(dim))
        y = _fft(b, y, "RFFT", list(y.shape[-k:]))
        y = _c2c(b, y, signal[:-k], "FFT")  # the other transformed dims: on the half spectrum
    else:
        y = _c2c(b, b.convert(y, ctx.out[0].dtype), signal, "FFT")
    return b.transpose(_scale(b, y, _norm_factor(normalization, n, False)), inv)


@register("_fft_c2r")
def fft_c2r(ctx, x, dim, normalization, last_dim_size):
    """Complex-to-real inverse transform over `dim` of a one-sided (Hermitian) spectrum: IFFT over
    all but the last dim (and its two neighbours), then IRFFT producing `last_dim_size` points.
    The spectrum's last dim is trimmed or zero-padded to last_dim_size // 2 + 1 as IRFFT needs."""
    b = ctx.b
    y, inv = _to_end(b, x, dim)
    half = last_dim_size // 2 + 1
    have = y.shape[-1]
    if have > half:
        y = b.slice(y, [0] * y.rank, list(y.shape[:-1]) + [half])
    elif have < half:
        y = b.pad(y, b.constant(0, y.dtype), [0] * y.rank, [0] * (y.rank - 1) + [half - have])
    k = min(_MAX_FFT_RANK, len(dim))
    y = _c2c(b, y, range(y.rank - len(dim), y.rank - k), "IFFT")
    lengths = list(y.shape[-k:-1]) + [last_dim_size]
    y = _fft(b, y, "IRFFT", lengths)
    out_shape = ctx.out[0].shape
    n = math.prod(out_shape[d] for d in dim)
    return b.transpose(_scale(b, y, _norm_factor(normalization, n, True)), inv)
