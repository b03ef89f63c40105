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


def sqnr_db(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of `approximation` against `reference`, in dB (a NaN in
    the approximation is infinite noise)."""
    ref = reference.double()
    err = (approximation.double() - ref).nan_to_num(nan=math.inf)
    return snr_db(float((ref * ref).sum()), float((err * err).sum()))
