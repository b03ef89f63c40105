"""Dtype facts the passes decide with: fp16 limits, scalar and tensor conversion, widening."""

from __future__ import annotations

import math

import numpy as np
import torch

import tcast

FP16_MAX = 65504.0
FP16_SMALLEST_SUBNORMAL = 2.0**-24
FP32_INF_THRESHOLD = 1e38  # scalars at or beyond this stand for infinity (finfo(float32).min masks, -inf)

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
WIDE_INTS = (torch.int32, torch.int64)  # what the int pass narrows


def is_float(dtype: torch.dtype | None) -> bool:
    return dtype in FLOATS


def is_int(dtype: torch.dtype | None) -> bool:
    return dtype in INTS


def scalar_overflows_fp16(value: float) -> bool:
    """A finite scalar fp16 cannot hold and that does not stand for infinity."""
    return FP16_MAX < abs(value) < FP32_INF_THRESHOLD


def scalar_to_fp16(value: float) -> float | None:
    """The fp16 value a scalar becomes, or None when it overflows fp16 (the op must stay fp32)."""
    if math.isnan(value):
        return value
    if abs(value) >= FP32_INF_THRESHOLD:
        return math.copysign(FP16_MAX, value)
    if scalar_overflows_fp16(value):
        return None
    if 0 < abs(value) < FP16_SMALLEST_SUBNORMAL:
        return math.copysign(FP16_SMALLEST_SUBNORMAL, value)
    return float(np.float16(value))


def tensor_max_finite(tensor: torch.Tensor) -> float:
    tensor = tensor.detach()
    finite = tensor[torch.isfinite(tensor)]
    return float(finite.abs().max()) if finite.numel() else 0.0


def tensor_to_fp16(tensor: torch.Tensor) -> torch.Tensor:
    """fp16 copy where tiny non-zeros snap to the smallest subnormal instead of flushing to zero."""
    half = tensor.detach().to(torch.float16)
    tiny = (tensor != 0) & (tensor.abs() < FP16_SMALLEST_SUBNORMAL)
    if bool(tiny.any()):
        snapped = torch.full_like(half, FP16_SMALLEST_SUBNORMAL).copysign(tensor.detach().to(torch.float16))
        half = torch.where(tiny, snapped, half)
    return half


def _float_widths(dtype: torch.dtype) -> tuple[int, int] | None:
    """(exponent bits, mantissa bits) of a float dtype, from the element table and tcast."""
    from coreai_opt._elements import Kind, of_torch

    try:
        element = of_torch(dtype)
    except ValueError:
        return None
    if element.kind is not Kind.FLOAT or element.tcast is None:
        return None
    spec = tcast.number(element.tcast)
    return spec.ebits, spec.mbits


def _int_range(dtype: torch.dtype) -> tuple[int, int] | None:
    from coreai_opt._elements import Kind, of_torch

    try:
        element = of_torch(dtype)
    except ValueError:
        return None
    if element.kind is Kind.BOOL:
        return 0, 1
    if element.kind is Kind.INT:
        return -(2 ** (element.bits - 1)), 2 ** (element.bits - 1) - 1
    if element.kind is Kind.UINT:
        return 0, 2**element.bits - 1
    return None


def holds(wide: torch.dtype, narrow: torch.dtype) -> bool:
    """Every value of `narrow` is exactly representable in `wide` (a cast narrow->wide->narrow is lossless)."""
    if wide == narrow:
        return True
    wide_float, narrow_float = _float_widths(wide), _float_widths(narrow)
    wide_ints, narrow_ints = _int_range(wide), _int_range(narrow)
    if wide_float and narrow_float:
        return wide_float[0] >= narrow_float[0] and wide_float[1] >= narrow_float[1]
    if wide_ints and narrow_ints:
        return wide_ints[0] <= narrow_ints[0] and narrow_ints[1] <= wide_ints[1]
    if wide_float and narrow_ints:
        return max(abs(narrow_ints[0]), narrow_ints[1]) <= 2 ** (wide_float[1] + 1)
    return False
