"""The primitives every cast engine shares: element rounding and every scale rule.

Rounding of elements to a number format (`quantize`, with its fast and bit-exact paths), the
compute dtype a cast works in, and the scale rules - one scale per tensor, channel or tile from
the values' range, two levels (NVFP4's float32 tensor scale over 8-bit tile scales), the tensor
scale a caller gives, and how stored scales and zero points combine with decoded values. The
Torch engine (`_torchcast`), the codebook engine (`_lutcast`) and the Triton launcher import
them from here; nothing here imports an engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ._codes import decode, encode, float8_codes, int_step_codes, ldexp_exact
from ._modes import RoundMode, ScaleMode
from ._number import InfNaN, NumberSpec
from ._scales import exponent_codes, exponent_scales, exponents_from_codes, pow2

if TYPE_CHECKING:
    from ._blocks import Blocking
    from ._datatype import DataType
    from ._tensor import Tensor

FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


_SIGNIFICANT_BITS = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24, torch.float64: 53}


def compute_dtype(
    dtype: DataType, source: torch.dtype = torch.float32, roundmode: RoundMode = RoundMode.EVEN
) -> torch.dtype:
    """The dtype a cast computes in: float32 where it gives the exact result, else float64.

    float32 holds every grid point and rounding step of formats up to ~21 mantissa bits, and
    power-of-two scaling is exact in it. A division x / s by a float scale is not exact; its
    float32 quotient still rounds to the element the exact quotient rounds to when x, s and every
    rounding boundary c of the element grid (midpoints; grid points for directed modes) are
    narrow: x - s*c is then a nonzero multiple of a power of two, so an inexact quotient lies at
    least 2**-max(p_s + p_c, p_x + 1) of c away from c (p: significant bits), which is beyond
    float32's rounding error (2**-24; 2**-22 leaves a factor 2 for ulps that change at powers of
    two). That holds for fp16 and bf16 weights under their own scales; float32 inputs take
    float64, where it holds for them. Stochastic rounding compares the quotient's fraction itself,
    and a float zero point subtracts before dividing: both keep float64.
    """
    nspec, sspec = dtype.nspec, dtype.sspec
    if nspec.mbits > 20 or nspec.emin - nspec.mbits < -149 or nspec.emax > 126 or source == torch.float64:
        return torch.float64
    if sspec is None or sspec.is_exponent:
        return torch.float32
    scale = sspec.scale
    narrow = (
        roundmode is not RoundMode.STOCHASTIC
        and sspec.tensor_scale is None  # two levels: a float32 product of scales
        and (sspec.zero is None or not sspec.zero.is_float)
        and _SIGNIFICANT_BITS[source] + 1 <= 22
        and scale.significant_bits + nspec.significant_bits + 1 <= 22
        and nspec.smallest_subnormal >= 2.0**-125  # half of it is still a normal float32
        and scale.smallest_subnormal >= 2.0**-149
        and scale.emax <= 126
    )
    return torch.float32 if narrow else torch.float64


def _round(scaled: torch.Tensor, mode: RoundMode, noise: torch.Tensor | None) -> torch.Tensor:
    """Round non-negative values to integers (`noise`: uniform [0, 1) draws for stochastic rounding)."""
    if mode is RoundMode.EVEN:
        return torch.round(scaled)
    whole = torch.floor(scaled)
    if mode is RoundMode.ZERO:
        return whole
    fraction = scaled - whole  # exact; `floor(x + 0.5)` would round just below a tie up
    if mode is RoundMode.NEAREST:
        return whole + (fraction >= 0.5).to(scaled.dtype)
    assert noise is not None, "stochastic rounding needs noise"
    return whole + (noise < fraction).to(scaled.dtype)


def _signed_round(values: torch.Tensor, mode: RoundMode, noise: torch.Tensor | None) -> torch.Tensor:
    """`_round` of values of either sign, symmetric about zero (ties to even stay ties to even)."""
    if mode is RoundMode.EVEN:
        return torch.round(values)  # already symmetric (round(-x) is -round(x), -0 included)
    return torch.copysign(_round(values.abs(), mode, noise), values)


def _round_inplace(scaled: torch.Tensor, mode: RoundMode, noise: torch.Tensor | None) -> torch.Tensor:
    """`_round` without temporaries the size of the tensor, for the fast path."""
    if mode is RoundMode.EVEN:
        return scaled.round_()
    if mode is RoundMode.ZERO:
        return scaled.floor_()
    whole = torch.floor(scaled)
    scaled.sub_(whole)  # the fraction, exact
    if mode is RoundMode.NEAREST:
        scaled.ge_(0.5)
    else:
        assert noise is not None, "stochastic rounding needs noise"
        scaled.gt_(noise)
    return scaled.add_(whole)


def draw_noise(shape: torch.Size, like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    return torch.rand(shape, generator=generator, device=like.device, dtype=like.dtype)


def _fast_path(v: torch.Tensor, nspec: NumberSpec) -> bool:
    """Float32 values onto a float or fixed-point grid whose every step is a normal float32, or
    float64 values (a float-scaled cast's quotients) onto such a grid in float64: each element's
    step is a power of two, so scaling by it is exact in either dtype."""
    if nspec.is_exponent or nspec.is_uint:
        return False
    if v.dtype == torch.float64:
        if nspec.is_int:
            return nspec.emax + nspec.mbits <= 900  # every product stays far inside float64's range
        return (  # below 52 mantissa bits: the magic addend's range keeps the format's last bit
            0 < nspec.mbits < 52
            and nspec.emin - nspec.mbits >= -1022
            and nspec.emax + 53 - nspec.mbits <= 900
        )
    return (
        v.dtype == torch.float32
        and (nspec.is_int or 0 < nspec.mbits < 23)  # no mantissa: ties go by code; 23 bits: as float64's 52
        and nspec.emin - nspec.mbits >= -126
        and nspec.emax + 24 - nspec.mbits <= 100  # the magic addend stays far below float32's range
    )


def _quantize_fast(
    v: torch.Tensor, nspec: NumberSpec, mode: RoundMode, noise: torch.Tensor | None
) -> torch.Tensor:
    """`quantize` for float32 or float64 values in a handful of in-place passes.

    The grid step of each element is a power of two read from its exponent field (clamped to the
    format's subnormal range). Ties-to-even adds and subtracts 2**23 steps (2**52 in float64),
    which the addition rounds exactly like the format; the other modes divide by the step, round
    and multiply back. Powers of two make every product and quotient exact.
    """
    a = v.abs()
    m = nspec.mbits
    if nspec.is_int:
        step = 2.0**-m
        a.mul_(2.0**m)
        _round_inplace(a, mode, noise).clamp_(max=nspec.max * 2.0**m).mul_(step)
    else:
        wide = a.dtype == torch.float64
        bits, bias, field = (torch.int64, 1023, 52) if wide else (torch.int32, 127, 23)
        exponent_field = (a.view(bits) >> field).clamp_(min=nspec.emin + bias, max=nspec.emax + bias + 1)
        if mode is RoundMode.EVEN:
            magic = exponent_field.add_(field - m).bitwise_left_shift_(field).view(a.dtype)
            a.add_(magic).sub_(magic)
        else:
            step = exponent_field.sub_(m).bitwise_left_shift_(field).view(a.dtype)
            _round_inplace(a.div_(step), mode, noise).mul_(step)
        a.clamp_(max=nspec.max)  # saturation; also takes Inf to max, NaN stays NaN
    a.copysign_(v)
    if not nspec.signed_zero:
        a.add_(0.0)  # -0 + 0 is +0 under round-to-nearest: these formats have no negative zero
    if nspec.has_inf:
        a = torch.where(torch.isinf(v), v, a)
    if nspec.infnan is InfNaN.OCP:
        a.masked_fill_(torch.isnan(v), -0.0)  # no NaN: stored as -0, as ml_dtypes does
    return a


def _bits_path(v: torch.Tensor, nspec: NumberSpec) -> bool:
    """float32 values onto a format with float32's exponent field and fewer mantissa bits
    (bfloat16, e8m10, ...): the grid is the float32 bit pattern with its low bits cleared."""
    return (
        v.dtype == torch.float32
        and nspec.is_float
        and nspec.infnan is InfNaN.IEEE
        and nspec.ebits == 8
        and nspec.bias == 127
        and nspec.mbits < 23
    )


def _quantize_bits(
    v: torch.Tensor, nspec: NumberSpec, mode: RoundMode, noise: torch.Tensor | None
) -> torch.Tensor:
    """`quantize` by integer arithmetic on the float32 bits: keep the top mantissa bits, round up by
    the dropped remainder as the mode says (the same decisions as the general path: ties to even
    on the dropped half, stochastic when the draw lies below the remainder's fraction), saturate
    finite values at max; Inf and NaN stay as they are. Subnormals need no case of their own: the
    format's subnormal grid is float32's with the same bits dropped."""
    drop = 23 - nspec.mbits
    bits = v.view(torch.int32)
    magnitude = bits & 0x7FFFFFFF
    remainder = magnitude & ((1 << drop) - 1)
    half = 1 << (drop - 1)
    if mode is RoundMode.EVEN:
        up = (remainder > half) | ((remainder == half) & ((magnitude >> drop) & 1).bool())
    elif mode is RoundMode.NEAREST:
        up = remainder >= half
    elif mode is RoundMode.ZERO:
        up = torch.zeros_like(remainder, dtype=torch.bool)
    else:
        assert noise is not None, "stochastic rounding needs noise"
        up = noise < remainder.to(torch.float32) * 2.0**-drop  # the fraction, exact in float32
    rounded = (magnitude - remainder) + (up.to(torch.int32) << drop)
    top = torch.tensor(nspec.max, dtype=torch.float32).view(torch.int32)
    rounded = torch.minimum(rounded, top) | (bits & torch.tensor(-(2**31), dtype=torch.int32))
    return torch.where(torch.isfinite(v), rounded.view(torch.float32), v)


def quantize(
    v: torch.Tensor, nspec: NumberSpec, mode: RoundMode, noise: torch.Tensor | None = None
) -> torch.Tensor:
    """Values of `v` rounded onto the grid of a float, int (fixed point) or exponent format."""
    if _bits_path(v, nspec):
        return _quantize_bits(v, nspec, mode, noise)
    if _fast_path(v, nspec):
        return _quantize_fast(v, nspec, mode, noise)
    return _quantize_general(v, nspec, mode, noise)


def _quantize_general(
    v: torch.Tensor, nspec: NumberSpec, mode: RoundMode, noise: torch.Tensor | None
) -> torch.Tensor:
    """`quantize` for any format and dtype: each element's step from its frexp exponent (the
    reference the faster paths are tested against)."""
    a = v.abs()
    _, ex = torch.frexp(a)
    exponent = torch.clamp(ex.to(torch.int32) - 1, min=nspec.emin)
    shift = nspec.mbits - exponent
    scaled = ldexp_exact(a, shift)
    whole = _round(scaled, mode, noise)
    if nspec.is_float and nspec.mbits == 0 and mode is RoundMode.EVEN:
        # no mantissa bit to be even: a tie between 2**e and 2**(e+1) goes to the even code
        # (P3109's binary8p1), so down where e's biased exponent field is even
        whole = torch.where((scaled == 1.5) & ((exponent + nspec.bias) % 2 == 0), 1.0, whole)
    rounded = ldexp_exact(whole, -shift)
    q = torch.clamp(rounded, max=nspec.max)  # saturation; also takes Inf to max
    if nspec.is_exponent:
        q = torch.clamp(q, min=nspec.smallest_normal)
        return torch.where(v > 0, q, torch.full_like(q, math.nan))  # no zero, no negatives
    result = torch.copysign(q, v)
    if not nspec.signed_zero:  # no negative zero
        result = torch.where(q == 0, torch.zeros_like(q), result)
    if nspec.has_inf:
        result = torch.where(torch.isinf(v), v, result)
    nan = torch.full_like(v, -0.0) if nspec.infnan is InfNaN.OCP else v  # OCP has no NaN: -0
    return torch.where(torch.isnan(v), nan, result)


# ----- the cast ----------------------------------------------------------------------------------


@dataclass
class Scaling:
    """Per-row parameters of a scaled cast: scale (the exponent, for exponent scales) and zero point."""

    scale: torch.Tensor | None = None  # as stored: NaN for rows whose range is NaN or Inf
    zero: torch.Tensor | None = None
    to_grid: torch.Tensor | None = None  # exponent scales: 2**-exponent
    divisor: torch.Tensor | None = None  # uint: the scale used for the codes (finite, positive)
    tensor: torch.Tensor | None = None  # two-level: the per-tensor scale (0-d, float32 value)
    effective: torch.Tensor | None = None  # two-level: each row's scale times the tensor's, in float32


def scaling_of(
    blocks: torch.Tensor,
    dtype: DataType,
    scalemode: ScaleMode,
    work: torch.dtype,
    given: torch.Tensor | None = None,
) -> Scaling:
    """Per-row scaling of `blocks`; `given` (see `given_tensor_scale`) replaces the scale that
    would come from the tensor's amax, so a one-level per-tensor cast reads no statistics."""
    sspec = dtype.sspec
    if sspec is None:
        return Scaling()
    if given is not None and sspec.tensor_scale is None:
        scaling = Scaling(scale=given.double().reshape(1, 1))
    else:
        # exact, and small; two reductions run faster than torch.aminmax along a dim
        lo, hi = blocks.amin(dim=1, keepdim=True).double(), blocks.amax(dim=1, keepdim=True).double()
        if sspec.tensor_scale is not None:
            scaling = _two_level_scaling(lo, hi, blocks, dtype, scalemode, given)
        else:
            scaling = _scaling_of_range(lo, hi, dtype, scalemode)
    for name in ("scale", "zero", "to_grid", "divisor", "effective"):  # exact in the work dtype
        value = getattr(scaling, name)
        if value is not None:
            setattr(scaling, name, value.to(work))
    return scaling


def _scaling_of_range(lo: torch.Tensor, hi: torch.Tensor, dtype: DataType, scalemode: ScaleMode) -> Scaling:
    """`_scaling` from each row's min and max, in float64."""
    nspec, sspec = dtype.nspec, dtype.sspec
    assert sspec is not None
    if nspec.is_uint:
        assert sspec.zero is not None
        lo, hi = torch.clamp(lo, max=0.0), torch.clamp(hi, min=0.0)
        bad = torch.isnan(lo) | torch.isnan(hi) | torch.isinf(lo) | torch.isinf(hi)
        scale = torch.nan_to_num(float_scales(hi - lo, nspec, sspec.scale, scalemode), nan=1.0)
        if sspec.zero.is_float:
            zero = quantize(lo, sspec.zero, RoundMode.EVEN)
        else:
            zero = torch.clamp(torch.round(-lo / scale), 0.0, float(nspec.max))
        return Scaling(scale=torch.where(bad, math.nan, scale), zero=zero, divisor=scale)
    amax = torch.maximum(hi, -lo)
    if sspec.is_exponent:
        exponent = exponent_scales(amax, nspec, sspec.scale, scalemode)
        return Scaling(scale=exponent, to_grid=pow2(-exponent))
    return Scaling(scale=float_scales(amax, nspec, sspec.scale, scalemode))


def tensor_scale_divisor(dtype: DataType) -> float:
    """What two-level scaling divides the largest finite magnitude by for its tensor scale
    (NVFP4's rule): the element format's max times the tile scale format's max."""
    sspec = dtype.sspec
    assert sspec is not None and sspec.tensor_scale is not None
    return float(dtype.nspec.max * sspec.scale.max)


def tensor_scale_of(amax: torch.Tensor, dtype: DataType) -> torch.Tensor:
    """The per-tensor scale of two-level scaling (NVFP4's rule): the largest finite magnitude (a
    float64 0-d tensor, on any device) over the element format's max times the tile scale
    format's max, rounded to nearest into the tensor scale's format (1 for a tensor of zeros);
    a float32 0-d tensor on amax's device. Torch ops only, so both engines share it."""
    sspec = dtype.sspec
    assert sspec is not None and sspec.tensor_scale is not None
    outer = sspec.tensor_scale
    # float64 then the format: double rounding is harmless at 53 >= 2 * 24 + 2 bits
    raw = amax.double() / tensor_scale_divisor(dtype)
    clamped = torch.clamp(raw, min=outer.smallest_subnormal, max=outer.max)
    return torch.where(amax > 0, clamped.to(outer.torch_dtype).float(), 1.0)


def _two_level_scaling(
    lo: torch.Tensor,
    hi: torch.Tensor,
    blocks: torch.Tensor,
    dtype: DataType,
    scalemode: ScaleMode,
    given: torch.Tensor | None,
) -> Scaling:
    """Tile scales relative to a tensor scale (`given`, else from the largest finite magnitude):
    each block's amax over the tensor scale is scaled and rounded as a one-level float scale; the
    values divide by the product of the two levels rounded to float32 (what an upcast multiplies
    by)."""
    sspec = dtype.sspec
    assert sspec is not None
    amax = torch.maximum(hi, -lo)
    if given is not None:
        tensor = given.float().reshape(())
        scale = float_scales(amax / tensor.double(), dtype.nspec, sspec.scale, scalemode)
        return Scaling(scale=scale, tensor=tensor, effective=_two_level_product(scale, tensor))
    finite = torch.isfinite(amax).reshape(-1)
    largest = float(amax[finite].max()) if bool(finite.any()) else 0.0
    if not bool(finite.all()):  # a block holding NaN or Inf still counts its finite values
        rest = blocks[~finite].double()
        rest = torch.where(torch.isfinite(rest), rest.abs(), torch.zeros((), dtype=rest.dtype))
        largest = max(largest, float(rest.max()))
    tensor = tensor_scale_of(torch.tensor(largest, dtype=torch.float64), dtype)
    scale = float_scales(amax / tensor.double(), dtype.nspec, sspec.scale, scalemode)
    return Scaling(scale=scale, tensor=tensor, effective=_two_level_product(scale, tensor))


def given_tensor_scale(rounded: float, device: torch.device) -> torch.Tensor:
    """A caller's scale per tensor, already rounded (`rounded_tensor_scale`), as a float32 [1] on
    `device`."""
    # a fill on the device: no copy from the host, so the call queues without a synchronization
    return torch.full((1,), rounded, dtype=torch.float32, device=device)


def rounded_tensor_scale(dtype: DataType, value: Any) -> float:
    """A caller's scale per tensor: the outer scale of a two-level type, or the only scale of a
    type with one float scale per tensor. It is rounded to nearest into the scale's format and
    must then be positive and finite; types without such a scale refuse one (their scales come
    from each tile's own values)."""
    sspec = dtype.sspec
    if sspec is not None and sspec.tensor_scale is not None:
        spec = sspec.tensor_scale
    elif sspec is not None and sspec.is_tensor and not sspec.is_exponent and sspec.zero is None:
        spec = sspec.scale
    else:
        raise ValueError(
            f"tensor_scale: {dtype.name} has no float scale per tensor "
            "(it applies to two-level types such as nvfp4 and to one scale per tensor such as fp8_F)"
        )
    given = value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(value, dtype=torch.float64)
    if given.numel() != 1:
        raise ValueError(f"tensor_scale: one value per tensor, got {given.numel()}")
    number = float(given.reshape(()))  # a GPU tensor is read back here: a Python float is not
    rounded = float(torch.tensor(number, dtype=torch.float64).to(spec.torch_dtype).float())
    if not math.isfinite(rounded) or rounded <= 0.0:
        kind = str(spec.torch_dtype).removeprefix("torch.")
        raise ValueError(f"tensor_scale: a positive finite {kind} value, got {number!r}")
    return rounded


def _two_level_product(block_scales: torch.Tensor, tensor_scale: torch.Tensor) -> torch.Tensor:
    """Each block's scale times the tensor's, rounded to float32: what a two-level cast divides
    by and its upcast multiplies by."""
    return block_scales.float() * tensor_scale.float()


def _uint_piece(
    piece: torch.Tensor,
    dtype: DataType,
    s: Scaling,
    rows: slice,
    mode: RoundMode,
    noise: torch.Tensor | None,
) -> torch.Tensor:
    """Asymmetric quantization of one piece: codes in [0, max]."""
    sspec = dtype.sspec
    assert sspec is not None and sspec.zero is not None and s.divisor is not None and s.zero is not None
    top = float(dtype.nspec.max)
    scale, zero = s.divisor[rows], s.zero[rows]
    if sspec.zero.is_float:
        codes = _round(torch.clamp((piece - zero) / scale, 0.0, top), mode, noise)
    else:
        # as torch.quantize_per_tensor: round x / scale, then add the integer zero point
        codes = _signed_round(piece / scale, mode, noise) + zero
    return torch.clamp(torch.nan_to_num(codes), 0.0, top)


def direct_codes(nspec: NumberSpec, mode: RoundMode, dtype: torch.dtype) -> bool:
    """Whether an actual cast of `dtype` values takes `scaled_codes` (ties to even: signed integers
    of at most 8 bits from float32 or float64, torch's 8-bit float formats without Inf from
    float32) instead of values on the grid and then `encode`."""
    if mode is not RoundMode.EVEN:
        return False
    if nspec.is_int:
        return nspec.bits <= 8 and dtype in (torch.float32, torch.float64)
    # torch rounds float32 to its float8 formats half to even, subnormals included; from float64
    # it would round twice (through float32), and Inf would not stay Inf after the clamp
    return (
        nspec.is_float
        and nspec.bits == 8
        and nspec.torch_dtype is not None
        and not nspec.has_inf
        and dtype == torch.float32
    )


def scaled_codes(scaled: torch.Tensor, nspec: NumberSpec) -> torch.Tensor:
    """`encode(quantize(scaled))` for a format `direct_codes` accepts, `scaled` (values over their
    scales, a temporary) consumed."""
    if nspec.is_int:
        return int_codes(scaled, nspec)
    return float8_codes(scaled, nspec)


def int_codes(scaled: torch.Tensor, nspec: NumberSpec) -> torch.Tensor:
    """`encode(quantize(scaled))` of a signed integer format in four passes, `scaled` (values over
    their scales, a temporary) consumed: the steps are `scaled * 2**mbits` (exact), rounded half to
    even - symmetric about zero, so no sign is split off - and clamped to +-max; NaN takes the most
    negative code, Inf saturates as in `quantize`."""
    top = nspec.max * 2.0**nspec.mbits
    return int_step_codes(scaled.mul_(2.0**nspec.mbits).round_().clamp_(-top, top), nspec)


def element_piece(
    piece: torch.Tensor,
    dtype: DataType,
    s: Scaling,
    rows: slice,
    mode: RoundMode,
    noise: torch.Tensor | None,
) -> torch.Tensor:
    """Element values (codes for uint) of one piece, before the scale is applied back."""
    if dtype.nspec.is_uint:
        return _uint_piece(piece, dtype, s, rows, mode, noise)
    return quantize(in_scale_units(piece, s, rows), dtype.nspec, mode, noise)


def in_scale_units(piece: torch.Tensor, s: Scaling, rows: slice) -> torch.Tensor:
    """Values of a piece over their rows' scales (symmetric scaling; `combine_piece` undoes it)."""
    if s.to_grid is not None:
        return piece * s.to_grid[rows]
    if s.effective is not None:
        return piece / s.effective[rows]
    if s.scale is not None:
        return piece / s.scale[rows]  # a division rounds differently from a reciprocal's product
    return piece


def combine_piece(values: torch.Tensor, dtype: DataType, s: Scaling, rows: slice) -> torch.Tensor:
    """Element values of one piece back to real values."""
    sspec = dtype.sspec
    if sspec is None or s.scale is None:
        return values
    scale = s.scale[rows]
    if dtype.nspec.is_uint:  # a NaN scale makes the whole row NaN
        assert s.zero is not None and sspec.zero is not None
        zero = s.zero[rows]
        return values * scale + zero if sspec.zero.is_float else (values - zero) * scale
    if sspec.is_exponent:
        return values.mul_(pow2(scale))
    if s.effective is not None:
        return values.mul_(s.effective[rows])
    return values.mul_(scale)


def stored_scales(scaling: Scaling, dtype: DataType) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """What an actual cast stores of its scaling: E8M0-style codes or float values of the scale
    format, and the zero points (float values, or int32), one per block."""
    sspec, scale, zero = dtype.sspec, scaling.scale, scaling.zero
    if sspec is None or scale is None:
        return None, None
    scales = exponent_codes(scale, sspec.scale) if sspec.is_exponent else scale.to(sspec.scale.torch_dtype)
    zeros = None
    if zero is not None and sspec.zero is not None:
        zeros = (zero.to(sspec.zero.torch_dtype) if sspec.zero.is_float else zero.to(torch.int32)).reshape(-1)
    return scales.reshape(-1), zeros


def stored_scaling(t: Tensor, work: torch.dtype) -> Scaling:
    """The per-row scaling of an actual cast, from what it stored."""
    sspec = t.dtype.sspec
    scaling = Scaling()
    if sspec is None or t.scales is None:
        return scaling
    if sspec.is_exponent:
        scaling.scale = exponents_from_codes(t.scales, sspec.scale, work).reshape(-1, 1)
    else:
        scaling.scale = t.scales.to(work).reshape(-1, 1)
    if sspec.tensor_scale is not None:
        if t.tensor_scale is None:
            raise ValueError(f"{t.dtype.name} needs the cast's tensor scale to upcast")
        scaling.effective = _two_level_product(t.scales, t.tensor_scale).to(work).reshape(-1, 1)
    if t.zeros is not None:
        scaling.zero = t.zeros.to(work).reshape(-1, 1)
    return scaling


def _next_up(values: torch.Tensor, scale: NumberSpec) -> torch.Tensor:
    """The next larger value of the (positive, finite) format: by torch's nextafter where the
    format is a torch dtype, else the next code."""
    exact = scale.torch_dtype
    if exact is not None and exact.is_floating_point and exact.itemsize >= 2:
        infinity = torch.tensor(math.inf, dtype=exact, device=values.device)
        return torch.nextafter(values.to(exact), infinity).to(values.dtype)
    return decode(encode(values, scale).to(torch.int32) + 1, scale, values.dtype)


def float_scales(
    extent: torch.Tensor, element: NumberSpec, scale: NumberSpec, scalemode: ScaleMode = ScaleMode.MAX
) -> torch.Tensor:
    """Per-block scales in the float format `scale`: `extent` (the block's amax, or its max - min
    for unsigned elements) over the element format's max, rounded to nearest (`max`) or up
    (`ceil`); values are in `extent`'s dtype, exactly representable in `scale`. `midmax` and `even` choose
    between powers of two: float scales read it as `max`."""
    raw = extent / element.max
    lowest = scale.smallest_subnormal if scale.mbits else scale.smallest_normal
    clamped = torch.clamp(torch.nan_to_num(raw, nan=1.0, posinf=1.0), min=lowest, max=scale.max)
    rounded = quantize(clamped, scale, RoundMode.EVEN)
    if scalemode is ScaleMode.CEIL:
        below = (rounded < clamped) & (rounded < scale.max)
        if bool(below.any()):
            rounded = torch.where(below, _next_up(rounded, scale), rounded)
    scales = torch.where(extent > 0, rounded, torch.ones_like(rounded))
    return torch.where(torch.isnan(extent) | torch.isinf(extent), torch.full_like(scales, math.nan), scales)


def signs_for(size: int, seed: int) -> torch.Tensor:
    """The sign vector d: `size` values of +-1 from a CPU generator (the same on every device)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (size,), generator=generator).mul_(2).sub_(1).to(torch.float32)


def checked_scales(dtype: DataType, layout: Blocking, scales: torch.Tensor) -> torch.Tensor:
    """A caller's per-tile scales, [tiles, 1] in block-row order, checked: E8M0 codes (integers
    0..255, as `Tensor.scale_grid()` gives them), or positive finite values of the scale format
    (a tensor already in the format's torch dtype holds nothing else; others are rounded into it
    and must come back unchanged). One read-back to the host, whatever the device."""
    sspec = dtype.sspec
    if sspec is None:
        raise ValueError(f"{dtype.name} has no scales to give")
    if sspec.tensor_scale is not None:
        raise ValueError(f"{dtype.name}: give its tensor scale (tensor_scale=), not per-tile scales")
    per_block = blocks_of_grid(scales, layout)
    if sspec.is_exponent:
        if per_block.dtype.is_floating_point or per_block.dtype == torch.bool:
            raise ValueError(
                f"{dtype.name} takes its E8M0 scales as codes (integers), as scale_grid() gives them"
            )
        if per_block.dtype != torch.uint8 and per_block.numel():
            low, high = (int(v) for v in torch.aminmax(per_block.to(torch.int64)))
            if low < 0 or high > 255:
                raise ValueError(f"E8M0 scale codes of {dtype.name} lie in 0..255")
        return per_block
    native = sspec.scale.torch_dtype
    if native is not None and per_block.dtype == native:
        wrong = ~(torch.isfinite(per_block.float()) & (per_block.float() > 0))
    else:
        values = per_block.double()
        wrong = ~(torch.isfinite(values) & (values > 0))
        off_grid = quantize(torch.where(wrong, 1.0, values), sspec.scale, RoundMode.EVEN) != values
        if bool((off_grid & ~wrong).any()):
            raise ValueError(f"given scales must be values of {sspec.scale.code}")
    if bool(wrong.any()):
        raise ValueError("given scales must be positive and finite")
    return per_block


def given_scaling(
    dtype: DataType, layout: Blocking, scales: torch.Tensor, zeros: torch.Tensor | None, work: torch.dtype
) -> Scaling:
    """The scaling of a cast under scales a caller chose (GPTQ rounds to a grid it fixed): `scales`
    and `zeros` as `Tensor.scale_grid()` / `zero_grid()` give them - E8M0 codes or float values of
    the scale format (see `checked_scales`), and zero points of the uint formats - one per tile;
    zero points integers in the element's range."""
    sspec, nspec = dtype.sspec, dtype.nspec
    per_block = checked_scales(dtype, layout, scales)
    assert sspec is not None
    if sspec.is_exponent:
        exponent = exponents_from_codes(per_block, sspec.scale, torch.float64)
        scaling = Scaling(scale=exponent, to_grid=pow2(-exponent))
    else:
        values = per_block.double()
        scaling = Scaling(scale=values)
        if nspec.is_uint:
            if zeros is None:
                raise ValueError(f"{dtype.name} takes zero points with its scales")
            zero = blocks_of_grid(zeros, layout).double()
            if sspec.zero is not None and not sspec.zero.is_float and (
                bool((zero < 0).any()) or bool((zero > nspec.max).any()) or not torch.equal(zero, zero.round())
            ):  # fmt: skip
                raise ValueError(f"zero points of {dtype.name} are integers in [0, {nspec.max:g}]")
            scaling = Scaling(scale=values, zero=zero, divisor=values)
    for name in ("scale", "zero", "to_grid", "divisor"):
        value = getattr(scaling, name)
        if value is not None:
            setattr(scaling, name, value.to(work))
    return scaling


def blocks_of_grid(grid: torch.Tensor, layout: Blocking) -> torch.Tensor:
    """Per-tile values in block-row order, [tiles, 1], from a grid shaped like `Tensor.scale_grid()`
    (the tensor's shape with every tiled dim replaced by its number of tiles)."""
    if not layout.tiles:
        if grid.numel() != 1:
            raise ValueError(f"one scale per tensor expected, got {grid.numel()}")
        return grid.reshape(1, 1)
    tiled = len(layout.tiles)
    counts = [n // t for n, t in zip(layout.padded[-tiled:], layout.tiles, strict=True)]
    expected = [*layout.padded[:-tiled], *counts]
    permuted = grid.permute(layout.perm)
    if list(permuted.shape) != expected:
        inverse = [0] * len(layout.perm)
        for i, d in enumerate(layout.perm):
            inverse[d] = i
        wanted = [expected[i] for i in inverse]
        raise ValueError(f"scales of shape {list(grid.shape)} do not fit the tiles: {wanted} expected")
    return permuted.reshape(-1, 1)
