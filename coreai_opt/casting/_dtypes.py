"""Dtype facts the passes decide with: fp16 limits, scalar and tensor conversion, widening."""

from __future__ import annotations

import math

import numpy as np
import torch

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


def tensor_overflows_fp16(tensor: torch.Tensor) -> bool:
    return tensor_max_finite(tensor) > FP16_MAX


def tensor_to_fp16(tensor: torch.Tensor) -> torch.Tensor:
    """fp16 copy where tiny non-zeros snap to the smallest subnormal instead of flushing to zero."""
    half = tensor.detach().to(torch.float16)
    tiny = (tensor != 0) & (tensor.abs() < FP16_SMALLEST_SUBNORMAL)
    if bool(tiny.any()):
        snapped = torch.full_like(half, FP16_SMALLEST_SUBNORMAL).copysign(tensor.detach().to(torch.float16))
        half = torch.where(tiny, snapped, half)
    return half


_FLOAT_RANK = {
    torch.float16: (5, 10),
    torch.bfloat16: (8, 7),
    torch.float32: (8, 23),
    torch.float64: (11, 52),
}
_INT_RANGE = {
    torch.bool: (0, 1),
    torch.uint8: (0, 2**8 - 1),
    torch.int8: (-(2**7), 2**7 - 1),
    torch.int16: (-(2**15), 2**15 - 1),
    torch.int32: (-(2**31), 2**31 - 1),
    torch.int64: (-(2**63), 2**63 - 1),
}


def holds(wide: torch.dtype, narrow: torch.dtype) -> bool:
    """Every value of `narrow` is exactly representable in `wide` (a cast narrow->wide->narrow is lossless)."""
    if wide == narrow:
        return True
    if wide in _FLOAT_RANK and narrow in _FLOAT_RANK:
        (we, wm), (ne, nm) = _FLOAT_RANK[wide], _FLOAT_RANK[narrow]
        return we >= ne and wm >= nm
    if wide in _INT_RANGE and narrow in _INT_RANGE:
        (wlo, whi), (nlo, nhi) = _INT_RANGE[wide], _INT_RANGE[narrow]
        return wlo <= nlo and nhi <= whi
    if wide in _FLOAT_RANK and narrow in _INT_RANGE:
        lo, hi = _INT_RANGE[narrow]
        return max(abs(lo), hi) <= 2 ** (_FLOAT_RANK[wide][1] + 1)
    return False
