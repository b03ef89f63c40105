"""TorchCast: every cast in plain PyTorch ops, on any device.

NaN/Inf policy (one rule for every format):
- NaN stays NaN. Formats without a NaN code of their own (signed integers) use the otherwise
  unused most negative code; a block whose amax is NaN or Inf gets a NaN scale (OCP MX).
- Finite values beyond the format's range saturate to +-max.
- +-Inf stays +-Inf in IEEE-style formats, and saturates to +-max in formats without Inf.
"""

from __future__ import annotations

import functools
import math

import torch

from ._blocks import Blocking, from_blocks, plan, to_blocks
from ._datatype import DataType
from ._modes import RoundMode, ScaleMode
from ._number import InfNaN, NumberSpec
from ._pack import pack_codes, unpack_codes
from ._tensor import Tensor

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _compute_dtype(nspec: NumberSpec) -> torch.dtype:
    """fp32 holds every grid point and rounding step of formats up to ~21 mantissa bits."""
    if nspec.mbits > 20 or nspec.emin - nspec.mbits < -149 or nspec.emax > 126:
        return torch.float64
    return torch.float32


def _ldexp(x: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """x * 2**exponent, exact, for exponents beyond the float32 range of one power of two."""
    half = torch.div(exponent, 2, rounding_mode="floor")
    return torch.ldexp(torch.ldexp(x, half), exponent - half)


def _round(scaled: torch.Tensor, mode: RoundMode, generator: torch.Generator | None) -> torch.Tensor:
    """Round non-negative values to integers."""
    if mode is RoundMode.EVEN:
        return torch.round(scaled)
    whole = torch.floor(scaled)
    if mode is RoundMode.ZERO:
        return whole
    fraction = scaled - whole  # exact; `floor(x + 0.5)` would round just below a tie up
    if mode is RoundMode.NEAREST:
        return whole + (fraction >= 0.5).to(scaled.dtype)
    noise = torch.rand(scaled.shape, generator=generator, device=scaled.device, dtype=scaled.dtype)
    return whole + (noise < fraction).to(scaled.dtype)


def quantize(
    v: torch.Tensor, nspec: NumberSpec, mode: RoundMode, generator: torch.Generator | None
) -> torch.Tensor:
    """Values of `v` rounded onto the grid of a float, int (fixed point) or exponent format."""
    a = v.abs()
    _, ex = torch.frexp(a)
    exponent = torch.clamp(ex.to(torch.int32) - 1, min=nspec.emin)
    shift = nspec.mbits - exponent
    rounded = _ldexp(_round(_ldexp(a, shift), mode, generator), -shift)
    q = torch.clamp(rounded, max=nspec.max)  # saturation; also takes Inf to max
    if nspec.is_exponent:
        q = torch.clamp(q, min=nspec.smallest_normal)
        return torch.where(v > 0, q, torch.full_like(q, math.nan))  # no zero, no negatives
    result = torch.copysign(q, v)
    if nspec.infnan is InfNaN.FNUZ or nspec.is_int:  # no negative zero
        result = torch.where(q == 0, torch.zeros_like(q), result)
    if nspec.has_inf:
        result = torch.where(torch.isinf(v), v, result)
    return torch.where(torch.isnan(v), v, result)


# ----- codes -------------------------------------------------------------------------------------


def _nan_code(nspec: NumberSpec) -> int:
    bits = nspec.bits
    if nspec.is_exponent:
        return (1 << bits) - 1
    if nspec.is_int:
        return 1 << (bits - 1)
    if nspec.infnan is InfNaN.FNUZ:
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
        k = torch.round(torch.ldexp(torch.nan_to_num(q), torch.tensor(nspec.mbits))).to(torch.int64)
        codes = k & ((1 << nspec.bits) - 1)
        return torch.where(nan, torch.full_like(codes, _nan_code(nspec)), codes)
    a = torch.nan_to_num(q.abs(), posinf=0.0)
    _, ex = torch.frexp(a)
    exponent = ex.to(torch.int64) - 1
    if nspec.is_exponent:
        codes = exponent + nspec.bias
        return torch.where(nan, torch.full_like(codes, _nan_code(nspec)), codes)
    normal = a >= nspec.smallest_normal
    exp_code = torch.where(normal, exponent + nspec.bias, torch.zeros_like(exponent))
    mant_shift = torch.where(
        normal, nspec.mbits - exponent, torch.full_like(exponent, nspec.mbits - nspec.emin)
    )
    mantissa = _ldexp(a, mant_shift.to(torch.int32)).to(torch.int64)
    mantissa = torch.where(normal, mantissa - (1 << nspec.mbits), mantissa)
    sign = torch.signbit(q).to(torch.int64)
    codes = (sign << (nspec.bits - 1)) | (exp_code << nspec.mbits) | mantissa
    if nspec.has_inf:
        inf = torch.isinf(q)
        inf_code = ((1 << nspec.ebits) - 1) << nspec.mbits
        codes = torch.where(inf, (sign << (nspec.bits - 1)) | inf_code, codes)
    if nspec.infnan is InfNaN.FNUZ:
        codes = torch.where(a == 0, torch.zeros_like(codes), codes)
    return torch.where(nan, torch.full_like(codes, _nan_code(nspec)), codes)


@functools.lru_cache(maxsize=64)
def _decode_table_cpu(code: str) -> torch.Tensor:
    nspec = NumberSpec(code)
    if nspec.bits > 16:
        raise ValueError(f"actual casts store codes of at most 16 bits, not {nspec.bits} ({code})")
    codes = torch.arange(1 << nspec.bits, dtype=torch.int64)
    if nspec.is_uint:
        return codes.to(torch.float64)
    if nspec.is_int:
        signed = torch.where(codes >= 1 << (nspec.bits - 1), codes - (1 << nspec.bits), codes)
        values = torch.ldexp(signed.to(torch.float64), torch.tensor(-nspec.mbits, dtype=torch.float64))
        values[_nan_code(nspec)] = math.nan
        return values
    if nspec.is_exponent:
        values = torch.ldexp(
            torch.ones(codes.shape, dtype=torch.float64), (codes - nspec.bias).to(torch.float64)
        )
        values[_nan_code(nspec)] = math.nan
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
    else:
        values[_nan_code(nspec)] = math.nan
    return values


def decode(codes: torch.Tensor, nspec: NumberSpec, dtype: torch.dtype) -> torch.Tensor:
    table = _decode_table_cpu(nspec.code).to(device=codes.device, dtype=dtype)
    return table[codes]


# ----- scales ------------------------------------------------------------------------------------


def _exponent_scale(
    amax: torch.Tensor, nspec: NumberSpec, sspec_scale: NumberSpec, mode: ScaleMode
) -> torch.Tensor:
    """Per-block power-of-two exponent (float tensor; NaN where amax is NaN or Inf)."""
    safe = torch.where(amax > 0, amax, torch.full_like(amax, 2.0**-126))  # all-zero block, as microxcaling
    safe = torch.nan_to_num(safe, nan=1.0, posinf=1.0)
    _, ex = torch.frexp(safe)
    exponent = ex.to(torch.int32) - 1 - nspec.emax
    if mode is not ScaleMode.MAX:
        limit = nspec.midmax if mode is ScaleMode.MIDMAX else nspec.max
        above = safe > _ldexp(torch.full_like(safe, limit), exponent)
        exponent = exponent + above.to(torch.int32)
    exponent = torch.clamp(exponent, sspec_scale.emin, sspec_scale.emax).to(amax.dtype)
    return torch.where(torch.isnan(amax) | torch.isinf(amax), torch.full_like(amax, math.nan), exponent)


def _exponent_codes(exponent: torch.Tensor, spec: NumberSpec) -> torch.Tensor:
    """E8M0-style codes of per-block exponents (NaN -> the NaN code)."""
    codes = torch.nan_to_num(exponent).to(torch.int64) + spec.bias
    return torch.where(torch.isnan(exponent), _nan_code(spec), codes).to(torch.uint8)


def _exponents_from_codes(codes: torch.Tensor, spec: NumberSpec, dtype: torch.dtype) -> torch.Tensor:
    exponent = (codes.to(torch.int64) - spec.bias).to(dtype)
    return torch.where(codes.to(torch.int64) == _nan_code(spec), math.nan, exponent)


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    nan = torch.isnan(exponent)
    values = _ldexp(torch.ones_like(exponent), torch.nan_to_num(exponent).to(torch.int32))
    return torch.where(nan, exponent, values)


def _float_scale(amax: torch.Tensor, nspec: NumberSpec, scale_spec: NumberSpec) -> torch.Tensor:
    raw = amax / nspec.max
    rounded = quantize(raw, scale_spec, RoundMode.EVEN, None)
    usable = (rounded > 0) & torch.isfinite(rounded)
    bad = torch.isnan(amax) | torch.isinf(amax)
    scale = torch.where(usable, rounded, torch.ones_like(rounded))
    return torch.where(bad, torch.full_like(scale, math.nan), scale)


# ----- the cast ----------------------------------------------------------------------------------


def _check_input(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"tcast casts torch tensors, got {type(x).__name__}")
    if x.dtype not in _FLOATS:
        raise ValueError(f"tcast casts float32, float16 or bfloat16 tensors, got {x.dtype}")


def _uint_codes(
    blocks: torch.Tensor, dtype: DataType, mode: RoundMode, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric quantization: codes, scales and zero points per block."""
    nspec, sspec = dtype.nspec, dtype.sspec
    assert sspec is not None and sspec.zero is not None
    top = float(nspec.max)
    lo = torch.clamp(torch.amin(blocks, dim=1, keepdim=True), max=0.0)
    hi = torch.clamp(torch.amax(blocks, dim=1, keepdim=True), min=0.0)
    bad = torch.isnan(lo) | torch.isnan(hi) | torch.isinf(lo) | torch.isinf(hi)
    raw = (hi - lo) / top
    scale = quantize(raw, sspec.scale, RoundMode.EVEN, None)
    scale = torch.where((scale > 0) & torch.isfinite(scale), scale, torch.ones_like(scale))
    if sspec.zero.is_float:
        zero = quantize(lo, sspec.zero, RoundMode.EVEN, None)
        codes = _round(torch.clamp((blocks - zero) / scale, 0.0, top), mode, generator)
    else:
        zero = torch.clamp(torch.round(-lo / scale), 0.0, top)
        codes = torch.clamp(_round(torch.clamp(blocks / scale + zero, 0.0, top), mode, generator), 0.0, top)
    codes = torch.clamp(torch.nan_to_num(codes), 0.0, top)
    scale = torch.where(bad, torch.full_like(scale, math.nan), scale)
    return codes, scale, zero


def _dequantize_uint(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, is_float_zero: bool
) -> torch.Tensor:
    return codes * scale + zero if is_float_zero else (codes - zero) * scale


def cast_blocks(
    x: torch.Tensor,
    dtype: DataType,
    roundmode: RoundMode,
    scalemode: ScaleMode,
    generator: torch.Generator | None,
) -> tuple[Blocking, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The shared heart of both cast modes: element values on the grid, scales, zero points.

    Returns (layout, element values [S, B] in compute precision, scales [S, 1], zeros [S, 1]).
    For exponent scales the returned scale is the exponent; for uint the element values are codes.
    """
    _check_input(x)
    nspec, sspec = dtype.nspec, dtype.sspec
    work = _compute_dtype(nspec)
    layout = plan(tuple(x.shape), sspec)
    blocks = to_blocks(x.to(work), layout)
    if sspec is None:
        return layout, quantize(blocks, nspec, roundmode, generator), None, None
    if nspec.is_uint:
        codes, scale, zero = _uint_codes(blocks, dtype, roundmode, generator)
        return layout, codes, scale, zero
    amax = torch.amax(blocks.abs(), dim=1, keepdim=True)
    if sspec.is_exponent:
        exponent = _exponent_scale(amax, nspec, sspec.scale, scalemode)
        values = quantize(blocks * _pow2(-exponent), nspec, roundmode, generator)
        return layout, values, exponent, None
    scale = _float_scale(amax, nspec, sspec.scale)
    return layout, quantize(blocks / scale, nspec, roundmode, generator), scale, None


def combine(
    values: torch.Tensor, scale: torch.Tensor | None, zero: torch.Tensor | None, dtype: DataType
) -> torch.Tensor:
    """Element values and scales back to real values ([S, B], compute precision)."""
    sspec = dtype.sspec
    if sspec is None or scale is None:
        return values
    if dtype.nspec.is_uint:
        assert zero is not None and sspec.zero is not None
        out = _dequantize_uint(values, scale, zero, sspec.zero.is_float)
        return torch.where(torch.isnan(scale), scale.expand_as(out), out)
    if sspec.is_exponent:
        return values * _pow2(scale)
    return values * scale


def virtual_cast(
    x: torch.Tensor,
    dtype: DataType,
    roundmode: RoundMode,
    scalemode: ScaleMode,
    generator: torch.Generator | None,
    out_dtype: torch.dtype | None,
) -> torch.Tensor:
    layout, values, scale, zero = cast_blocks(x, dtype, roundmode, scalemode, generator)
    out = from_blocks(combine(values, scale, zero, dtype), layout)
    return out.to(out_dtype or x.dtype)


def actual_cast(
    x: torch.Tensor,
    dtype: DataType,
    roundmode: RoundMode,
    scalemode: ScaleMode,
    generator: torch.Generator | None,
) -> Tensor:
    nspec, sspec = dtype.nspec, dtype.sspec
    if nspec.bits > 16:
        raise ValueError(f"actual casts store codes of at most 16 bits; {dtype.name} has {nspec.bits}")
    _, values, scale, zero = cast_blocks(x, dtype, roundmode, scalemode, generator)
    codes = encode(values, nspec)
    scales = zeros = None
    if sspec is not None and scale is not None:
        if sspec.is_exponent:
            scales = _exponent_codes(scale, sspec.scale)
        else:
            scales = scale.to(sspec.scale.torch_dtype)
        scales = scales.reshape(-1)
        if zero is not None and sspec.zero is not None:
            zeros = (
                zero.to(sspec.zero.torch_dtype) if sspec.zero.is_float else zero.to(torch.int32)
            ).reshape(-1)
    return Tensor(
        dtype=dtype,
        shape=tuple(x.shape),
        source_dtype=x.dtype,
        codes=pack_codes(codes, nspec.bits),
        scales=scales,
        zeros=zeros,
        numel_padded=values.numel(),
    )


def upcast(t: Tensor, torch_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Values of an actual cast: equal bit for bit to the virtual cast of the same input."""
    dtype = t.dtype
    nspec, sspec = dtype.nspec, dtype.sspec
    work = _compute_dtype(nspec)
    layout = plan(t.shape, sspec)
    codes = unpack_codes(t.codes, nspec.bits, t.numel_padded).reshape(layout.num_scales, layout.per_scale)
    values = decode(codes, nspec, work)
    scale = zero = None
    if sspec is not None and t.scales is not None:
        if sspec.is_exponent:
            scale = _exponents_from_codes(t.scales, sspec.scale, work).reshape(-1, 1)
        else:
            scale = t.scales.to(work).reshape(-1, 1)
        if t.zeros is not None:
            zero = t.zeros.to(work).reshape(-1, 1)
    out = from_blocks(combine(values, scale, zero, dtype), layout)
    return out.to(torch_dtype or t.source_dtype)
