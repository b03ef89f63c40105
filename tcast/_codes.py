"""Element codes: the bit pattern of every value of a format, and the value of every code.

Format facts both engines share (TorchCast encodes with torch ops, TritonCast bakes the NaN code,
the largest code and the decode table into its kernels).
"""

from __future__ import annotations

import functools
import math

import torch

from ._number import InfNaN, NumberSpec


def ldexp_exact(x: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """x * 2**exponent, exact, for exponents beyond the float32 range of one power of two."""
    half = torch.div(exponent, 2, rounding_mode="floor")
    return torch.ldexp(torch.ldexp(x, half), exponent - half)


def nan_code(nspec: NumberSpec) -> int:
    """The code NaN is stored as: the format's NaN; for signed integers the otherwise unused most
    negative code; for OCP formats, which have no NaN, the code of -0 (as ml_dtypes stores it)."""
    bits = nspec.bits
    if nspec.is_exponent:
        return (1 << bits) - 1
    if nspec.is_int:
        return 1 << (bits - 1)
    if nspec.infnan in (InfNaN.FNUZ, InfNaN.OCP, InfNaN.INUZ):
        return 1 << (bits - 1)
    if nspec.infnan is InfNaN.FN:
        return (1 << (bits - 1)) - 1
    return (((1 << nspec.ebits) - 1) << nspec.mbits) | ((1 << nspec.mbits) - 1)


def inf_code(nspec: NumberSpec) -> int:
    """The code of +Inf (formats with Inf): the top exponent over a zero mantissa (IEEE), or the
    all-ones magnitude (P3109's inuz)."""
    if nspec.infnan is InfNaN.INUZ:
        return (1 << (nspec.bits - 1)) - 1
    return ((1 << nspec.ebits) - 1) << nspec.mbits


def code_dtype(nspec: NumberSpec) -> torch.dtype:
    """The dtype `encode` returns for a format: uint8 up to 8 bits, else int32."""
    return torch.uint8 if nspec.bits <= 8 else torch.int32


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2.0**exponent as float32, built from its bits (int32 exponents within float32's normal range)."""
    return ((exponent + 127) << 23).view(torch.float32)


def _fill_from(target: torch.Tensor, keys: torch.Tensor, first: int, fill: float) -> torch.Tensor:
    """`target` with `fill` where `keys` reach `first` (NaN codes and values); on the CPU only
    where a max finds any (a comparison pass costs ~10x a max there, and NaN is rare)."""
    if keys.numel() and (keys.device.type != "cpu" or int(keys.max()) >= first):
        target.masked_fill_(keys >= first, fill)
    return target


def _native_codes(q: torch.Tensor, nspec: NumberSpec, exact: torch.dtype) -> torch.Tensor:
    """Codes by torch's own conversion (exact on the grid; one pass), with every NaN pattern made
    the format's one NaN code (torch keeps the sign of NaN, and picks its own payload)."""
    bits = nspec.bits
    codes = q.to(exact).view(torch.uint8 if bits == 8 else torch.int16)
    if nspec.infnan is not InfNaN.FNUZ:  # fnuz has one NaN code, torch's
        magnitude = (1 << (bits - 1)) - 1
        first_nan = magnitude if nspec.infnan is InfNaN.FN else (((1 << nspec.ebits) - 1) << nspec.mbits) + 1
        _fill_from(codes, codes & magnitude, first_nan, nan_code(nspec))
    return codes if bits == 8 else codes.to(torch.int32) & 0xFFFF


def float8_codes(scaled: torch.Tensor, nspec: NumberSpec) -> torch.Tensor:
    """Codes of any float32 values in one of torch's 8-bit float formats without Inf (`scaled`, a
    temporary, is overwritten): saturated to +-max (Inf too; NaN stays NaN; torch 2.13 saturates
    by itself, older releases made NaN of what overflows), then rounded half to even by torch's
    own conversion, which `quantize` then `encode` give bit for bit."""
    assert nspec.torch_dtype is not None and nspec.bits == 8 and not nspec.has_inf
    return _native_codes(scaled.clamp_(-nspec.max, nspec.max), nspec, nspec.torch_dtype)


def _general_codes(q: torch.Tensor, nspec: NumberSpec) -> torch.Tensor:
    """Codes of float and exponent formats by arithmetic on exponents and significands."""
    bits = nspec.bits
    a = torch.nan_to_num(q.abs(), nan=0.0, posinf=0.0)
    _, ex = torch.frexp(a.clamp(min=nspec.smallest_normal))  # zero and subnormals: the smallest exponent
    exponent = ex - 1
    nan = torch.isnan(q)
    if nspec.is_exponent:
        return (exponent + nspec.bias).masked_fill_(nan, nan_code(nspec))
    # the significand as an integer of mbits + 1 bits: with the leading 1 for normals, without for
    # subnormals; (exponent - emin) << mbits then adds exactly the biased exponent field
    shift = nspec.mbits - exponent
    if nspec.mbits - nspec.emin <= 126 and a.dtype == torch.float32:
        significand = a.mul_(_pow2(shift))
    else:
        significand = ldexp_exact(a, shift)
    codes = ((exponent - nspec.emin) << nspec.mbits).add_(significand.to(torch.int32))
    sign = torch.signbit(q)
    if not nspec.signed_zero:
        sign &= (codes != 0) | torch.isinf(q)  # no negative zero (Inf's codes are made below)
    codes |= sign.to(torch.int32) << (bits - 1)
    if nspec.has_inf:
        codes = torch.where(torch.isinf(q), (sign.to(torch.int32) << (bits - 1)) | inf_code(nspec), codes)
    return codes.masked_fill_(nan, nan_code(nspec))


@functools.lru_cache(maxsize=64)
def _host(nspec: NumberSpec) -> str | None:
    """An 8-bit torch float format holding every value of `nspec` (e.g. e4m3fn for FP4/FP6), if any."""
    for code in ("e4m3fn", "e5m2"):
        host = NumberSpec(code)
        if host.torch_dtype is None or (nspec.has_inf and not host.has_inf):
            continue
        # the whole range too: e4m3fnuz with bias 7 reaches 480 in e4m3fn's exponents, whose max is 448
        if host.mbits >= nspec.mbits and host.emin <= nspec.emin and host.max >= nspec.max:
            return code
    return None


@functools.lru_cache(maxsize=64)
def _host_table(code: str, host: str) -> torch.Tensor:
    """The code of `code` of every `host` code's value (int32; values off the grid never looked up)."""
    values = decode_table(host)
    nspec = NumberSpec(code)
    safe = torch.where(values.abs() > nspec.max, torch.zeros_like(values), values)  # NaN stays NaN
    return _general_codes(safe, nspec).to(code_dtype(nspec))


def int_step_codes(steps: torch.Tensor, nspec: NumberSpec) -> torch.Tensor:
    """Codes of a signed integer format from whole steps within +-max (`steps`, a temporary, is
    overwritten): two's complement, NaN as the otherwise unused most negative code (Inf, never on
    a grid, as 0)."""
    bits = nspec.bits
    steps = steps.nan_to_num_(nan=-float(1 << (bits - 1)), posinf=0.0, neginf=0.0)
    if bits <= 8:
        codes = steps.to(torch.int8).view(torch.uint8)
        return codes if bits == 8 else codes.bitwise_and_((1 << bits) - 1)
    return steps.to(torch.int32) & ((1 << bits) - 1)


def encode(q: torch.Tensor, nspec: NumberSpec) -> torch.Tensor:
    """Codes (`code_dtype`: uint8 up to 8 bits, else int32) of values already on the format's grid."""
    if nspec.is_uint:
        return q.to(code_dtype(nspec))
    if nspec.is_int:  # the multiple of the step (exact: a power of two)
        return int_step_codes(q * 2.0**nspec.mbits, nspec)
    exact = nspec.torch_dtype
    if nspec.is_float and exact is not None and exact.itemsize <= 2:
        return _native_codes(q, nspec, exact)
    host = _host(nspec) if nspec.is_float else None
    if host is not None:  # through the codes of a torch format holding every value, and a table
        host_codes = q.to(NumberSpec(host).torch_dtype).view(torch.uint8).reshape(-1).to(torch.int32)
        table = _host_table(nspec.code, host).to(q.device)
        return torch.index_select(table, 0, host_codes).reshape(q.shape)
    return _general_codes(q, nspec).to(code_dtype(nspec))


@functools.lru_cache(maxsize=64)
def decode_table(code: str) -> torch.Tensor:
    nspec = NumberSpec(code)
    if nspec.bits > 16:
        raise ValueError(f"actual casts store codes of at most 16 bits, not {nspec.bits} ({code})")
    codes = torch.arange(1 << nspec.bits, dtype=torch.int64)
    if nspec.is_uint:
        return codes.to(torch.float64)
    if nspec.is_int:
        signed = torch.where(codes >= 1 << (nspec.bits - 1), codes - (1 << nspec.bits), codes)
        values = torch.ldexp(signed.to(torch.float64), torch.tensor(-nspec.mbits, dtype=torch.float64))
        values[nan_code(nspec)] = math.nan
        return values
    if nspec.is_exponent:
        values = torch.ldexp(
            torch.ones(codes.shape, dtype=torch.float64), (codes - nspec.bias).to(torch.float64)
        )
        values[nan_code(nspec)] = math.nan
        return values
    sign = (codes >> (nspec.bits - 1)) & 1
    exp_code = (codes >> nspec.mbits) & ((1 << nspec.ebits) - 1)
    mantissa = codes & ((1 << nspec.mbits) - 1)
    normal = exp_code > 0
    significand = torch.where(normal, mantissa + (1 << nspec.mbits), mantissa).to(torch.float64)
    power = torch.where(normal, exp_code - nspec.bias, torch.full_like(exp_code, nspec.emin)) - nspec.mbits
    values = torch.ldexp(significand, power.to(torch.float64))
    values = torch.where(sign == 1, -values, values)
    top = exp_code == (1 << nspec.ebits) - 1
    if nspec.infnan is InfNaN.IEEE:
        values = torch.where(top & (mantissa == 0), torch.where(sign == 1, -math.inf, math.inf), values)
        values = torch.where(top & (mantissa != 0), math.nan, values)
    elif nspec.infnan is InfNaN.FN:
        values = torch.where(top & (mantissa == (1 << nspec.mbits) - 1), math.nan, values)
    elif nspec.infnan is InfNaN.FNUZ:
        values[nan_code(nspec)] = math.nan
    elif nspec.infnan is InfNaN.INUZ:
        magnitude = codes & ((1 << (nspec.bits - 1)) - 1)
        infinite = magnitude == inf_code(nspec)
        values = torch.where(infinite, torch.where(sign == 1, -math.inf, math.inf), values)
        values[nan_code(nspec)] = math.nan
    return values


def _float8_values(codes: torch.Tensor, exact: torch.dtype, dtype: torch.dtype) -> torch.Tensor:
    """Values of e4m3fn or e5m2 codes through float16's bits (torch's own conversion from these
    formats on the CPU takes ~6 ns a value; this ~0.6). e5m2 is float16's top byte. e4m3fn's
    exponent and mantissa, moved under float16's, read 2**8 times too small, subnormals included
    (float16's subnormals hold them); its NaN codes then read +-480 and are made NaN."""
    if exact == torch.float8_e5m2:
        return (codes.to(torch.int16) << 8).view(torch.float16).to(dtype)
    bits = codes.view(torch.int8).to(torch.int16)  # the sign spread over the top byte
    half = bits.bitwise_left_shift_(7).bitwise_and_(~0x4000).view(torch.float16)
    values = half.to(dtype).mul_(256.0)
    return _fill_from(values, codes.view(torch.int8).bitwise_and(0x7F), 0x7F, math.nan)


def decode(
    codes: torch.Tensor, nspec: NumberSpec, dtype: torch.dtype, meta: torch.Tensor | None = None
) -> torch.Tensor:
    """Values of codes; for a codebook, in the tables `meta` selects (broadcast against `codes`)."""
    if nspec.is_codebook:
        return nspec.lookup(codes, meta, dtype)  # type: ignore[attr-defined]
    if nspec.is_uint:
        return codes.to(dtype)
    if nspec.is_int and codes.dtype == torch.uint8:
        signed = codes.view(torch.int8)  # two's complement: sign-extend narrower codes
        if nspec.bits < 8:
            half = 1 << (nspec.bits - 1)
            signed = (signed ^ half).sub_(half)
        values = signed.to(dtype).mul_(2.0**-nspec.mbits)
        return values.masked_fill_(codes == nan_code(nspec), math.nan)
    exact = nspec.torch_dtype if nspec.is_float else None
    if exact is not None and exact.itemsize == 1 and codes.dtype == torch.uint8:
        if codes.device.type == "cpu" and exact in (torch.float8_e4m3fn, torch.float8_e5m2):
            return _float8_values(codes, exact, dtype)
        return codes.view(exact).to(dtype)  # torch's own conversion: one pass, no index temporaries
    table = decode_table(nspec.code).to(device=codes.device, dtype=dtype)
    flat = codes.reshape(-1).to(torch.int32)  # indices (a uint8 tensor would index as a mask)
    return torch.index_select(table, 0, flat).reshape(codes.shape)


def max_code(nspec: NumberSpec) -> int:
    """The code of the format's largest finite value (integers: its multiple of the step)."""
    if nspec.is_int:
        return round(nspec.max * 2**nspec.mbits)
    return int(encode(torch.tensor([nspec.max], dtype=torch.float64), nspec)[0])
