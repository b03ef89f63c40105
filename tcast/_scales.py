"""Scale rules: which scale each block gets (the rules TorchCast, TritonCast and coreai_opt share).

Power-of-two scales (E8M0 and other exponent formats) follow OCP MX: the exponent of the block's
largest magnitude less the element format's emax, one higher under `midmax` when the block's
amax lies above the format's midmax, under `even` when amax rounded to the element's mantissa
bits (half up, as torchao's EVEN) reaches the next power of two, or the smallest at which nothing
saturates under `ceil`.
Float scales are amax over the element format's max, rounded into the scale format: to nearest
under `max` (the largest values may saturate by less than half a scale step), up under `ceil`
(nothing saturates). Either kind is never zero or infinite: a block of zeros gets the smallest
exponent (as microxcaling does) or a float scale of 1; a block whose amax is NaN or Inf gets a NaN
scale.
"""

from __future__ import annotations

import math

import torch

from ._codes import ldexp_exact, nan_code
from ._modes import ScaleMode
from ._number import NumberSpec


def step_up_limit(element: NumberSpec, scalemode: ScaleMode) -> float:
    """The block amax, at a scale of 2**0, beyond which a power-of-two scale steps one exponent
    up from OCP's floor: above it under `midmax` and `ceil`, at or above it under `even` (where
    amax's mantissa rounds into the next binade). Both engines compare against it."""
    if scalemode is ScaleMode.MIDMAX:
        return element.midmax
    if scalemode is ScaleMode.EVEN:
        return (2.0 - 2.0 ** -(element.mbits + 1)) * 2.0**element.emax
    return element.max


def exponent_scales(
    amax: torch.Tensor, element: NumberSpec, scale: NumberSpec, scalemode: ScaleMode = ScaleMode.MAX
) -> torch.Tensor:
    """Per-block power-of-two exponents of `scale` (e.g. E8M0) for blocks of `element` values with
    largest magnitudes `amax`: a float tensor of exponents, NaN where amax is NaN or Inf."""
    safe = torch.where(amax > 0, amax, torch.full_like(amax, 2.0**-126))  # all-zero block, as microxcaling
    safe = torch.nan_to_num(safe, nan=1.0, posinf=1.0)
    _, ex = torch.frexp(safe)
    exponent = ex.to(torch.int32) - 1 - element.emax
    if scalemode is not ScaleMode.MAX:
        threshold = ldexp_exact(torch.full_like(safe, step_up_limit(element, scalemode)), exponent)
        above = safe >= threshold if scalemode is ScaleMode.EVEN else safe > threshold
        exponent = exponent + above.to(torch.int32)
    exponent = torch.clamp(exponent, scale.emin, scale.emax).to(amax.dtype)
    return torch.where(torch.isnan(amax) | torch.isinf(amax), torch.full_like(amax, math.nan), exponent)


def exponent_codes(exponent: torch.Tensor, scale: NumberSpec) -> torch.Tensor:
    """E8M0-style codes of per-block exponents (NaN -> the NaN code)."""
    codes = torch.nan_to_num(exponent).to(torch.int64) + scale.bias
    return torch.where(torch.isnan(exponent), nan_code(scale), codes).to(torch.uint8)


def exponents_from_codes(codes: torch.Tensor, scale: NumberSpec, dtype: torch.dtype) -> torch.Tensor:
    exponent = (codes.to(torch.int64) - scale.bias).to(dtype)
    return torch.where(codes.to(torch.int64) == nan_code(scale), math.nan, exponent)


def pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2**exponent, exact; NaN stays NaN."""
    nan = torch.isnan(exponent)
    values = ldexp_exact(torch.ones_like(exponent), torch.nan_to_num(exponent).to(torch.int32))
    return torch.where(nan, exponent, values)
