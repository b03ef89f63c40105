"""Signal-to-noise ratios: the one definition every report of tcast and coreai_opt uses."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def snr_db(signal: float, noise: float) -> float:
    """10 log10(signal energy / noise energy): inf when there is no noise, -inf when there is
    noise and no signal."""
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


_ROW = 1024  # values per row norm


def _sum_of_squares(values: torch.Tensor) -> float:
    """Sum of squares of float32 or float64 values in one pass: the norms of rows of `_ROW`
    values (torch's norm reduction: 3-4x faster than squaring and summing, and as exact), their
    squares summed in float64."""
    import torch

    flat = values.reshape(-1)
    whole = flat.numel() - flat.numel() % _ROW
    total = 0.0
    if whole:
        norms = torch.linalg.vector_norm(flat[:whole].view(-1, _ROW), dim=1).double()
        total = float(norms.mul_(norms).sum())
    if whole < flat.numel():
        tail = flat[whole:].double()
        total += float(tail.mul_(tail).sum())
    return total


def squares(x: torch.Tensor) -> float:
    """Sum of squares in float32 (float64 for float64 input), in rows whose norms are summed in
    float64 (relative error ~1e-7). A total that overflowed, or is so small that squares below
    float32's range may matter, is summed again over the values scaled by the power of two that
    brings the largest near 1."""
    import torch

    if x.numel() == 0:
        return 0.0
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    total = _sum_of_squares(x.to(wide))
    if math.isfinite(total) and total >= 2.0**-60:  # any square lost below 2**-126 is < 2**-35 of it
        return total
    lo, hi = torch.aminmax(x)
    peak = max(abs(float(lo)), abs(float(hi)))
    if not math.isfinite(peak):
        return math.inf if math.isinf(peak) else math.nan
    if peak == 0:
        return 0.0
    exponent = math.frexp(peak)[1]
    wide = torch.float64 if x.dtype == torch.float64 or abs(exponent) > 100 else torch.float32
    scaled = x.to(wide) * math.ldexp(1.0, -exponent)
    return _sum_of_squares(scaled) * math.ldexp(1.0, 2 * exponent)


def energies(reference: torch.Tensor, approximation: torch.Tensor) -> tuple[float, float]:
    """(signal, noise): the energy of `reference` and of `approximation - reference` (a NaN in
    the approximation is infinite noise). The error is taken in the wider of the two dtypes, where
    a quantization error is exact: a value and its rounding lie within a factor 2 of each other."""
    import torch

    wide = torch.promote_types(approximation.dtype, reference.dtype)
    if wide not in (torch.float32, torch.float64):
        wide = torch.float32
    reference = reference.to(wide)  # converted once: a mixed-dtype subtraction runs slower
    noise = squares(approximation.to(wide) - reference)
    return squares(reference), math.inf if math.isnan(noise) else noise


def sqnr_db(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of `approximation` against `reference`, in dB (a NaN in
    the approximation is infinite noise)."""
    return snr_db(*energies(reference, approximation))
