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
    if nspec.infnan in (InfNaN.FNUZ, InfNaN.OCP):
        return 1 << (bits - 1)
    if nspec.infnan is InfNaN.FN:
        return (1 << (bits - 1)) - 1
    return (((1 << nspec.ebits) - 1) << nspec.mbits) | ((1 << nspec.mbits) - 1)


def encode(q: torch.Tensor, nspec: NumberSpec) -> torch.Tensor:
    """Integer codes (int64) of values already on the format's grid."""
    if nspec.is_uint:
        return q.to(torch.int64)
    nan = torch.isnan(q)
    if nspec.is_int:
        k = torch.round(torch.nan_to_num(q) * 2.0**nspec.mbits).to(torch.int64)  # exact: a power of two
        codes = k & ((1 << nspec.bits) - 1)
        return torch.where(nan, torch.full_like(codes, nan_code(nspec)), codes)
    a = torch.nan_to_num(q.abs(), posinf=0.0)
    _, ex = torch.frexp(a)
    exponent = ex.to(torch.int64) - 1
    if nspec.is_exponent:
        codes = exponent + nspec.bias
        return torch.where(nan, torch.full_like(codes, nan_code(nspec)), codes)
    normal = a >= nspec.smallest_normal
    exp_code = torch.where(normal, exponent + nspec.bias, torch.zeros_like(exponent))
    mant_shift = torch.where(
        normal, nspec.mbits - exponent, torch.full_like(exponent, nspec.mbits - nspec.emin)
    )
    mantissa = ldexp_exact(a, mant_shift.to(torch.int32)).to(torch.int64)
    mantissa = torch.where(normal, mantissa - (1 << nspec.mbits), mantissa)
    sign = torch.signbit(q).to(torch.int64)
    codes = (sign << (nspec.bits - 1)) | (exp_code << nspec.mbits) | mantissa
    if nspec.has_inf:
        inf = torch.isinf(q)
        inf_code = ((1 << nspec.ebits) - 1) << nspec.mbits
        codes = torch.where(inf, (sign << (nspec.bits - 1)) | inf_code, codes)
    if nspec.infnan is InfNaN.FNUZ:
        codes = torch.where(a == 0, torch.zeros_like(codes), codes)
    return torch.where(nan, torch.full_like(codes, nan_code(nspec)), codes)


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
    return values


def decode(codes: torch.Tensor, nspec: NumberSpec, dtype: torch.dtype) -> torch.Tensor:
    table = decode_table(nspec.code).to(device=codes.device, dtype=dtype)
    return table[codes]


def max_code(nspec: NumberSpec) -> int:
    """The code of the format's largest finite value (integers: its multiple of the step)."""
    if nspec.is_int:
        return round(nspec.max * 2**nspec.mbits)
    return int(encode(torch.tensor([nspec.max], dtype=torch.float64), nspec)[0])
