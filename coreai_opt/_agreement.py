"""How closely one output agrees with a reference: the numbers every check and compare prints."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Agreement:
    max_abs_error: float
    relative_error: float  # max abs error over the reference's max magnitude
    cosine: float
    snr_db: float  # inf when identical
    nonfinite_mismatches: int  # positions where exactly one side is inf/NaN, or they differ

    def to_dict(self) -> dict[str, float | int | None]:
        def plain(value: float) -> float | None:
            return None if math.isinf(value) or math.isnan(value) else value

        return {
            "max_abs_error": self.max_abs_error,
            "relative_error": self.relative_error,
            "cosine": self.cosine,
            "snr_db": plain(self.snr_db),
            "nonfinite_mismatches": self.nonfinite_mismatches,
        }


def agreement(reference: np.ndarray, candidate: np.ndarray) -> Agreement:
    """Compare over positions finite on both sides; count the rest as mismatches unless identical."""
    a = np.asarray(reference, dtype=np.float64).ravel()
    b = np.asarray(candidate, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.size} vs {b.size} elements")
    finite = np.isfinite(a) & np.isfinite(b)
    same_special = (~finite) & ((a == b) | (np.isnan(a) & np.isnan(b)))
    mismatches = int(np.count_nonzero(~finite & ~same_special))
    a, b = a[finite], b[finite]
    diff = np.abs(a - b)
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(a).max()) if a.size else 0.0
    relative = max_abs / scale if scale > 0 else max_abs
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    cosine = float(np.clip(a @ b / norms, -1.0, 1.0)) if norms > 0 else (1.0 if max_abs == 0 else 0.0)
    noise, signal = float(diff @ diff), float(a @ a)
    return Agreement(max_abs, relative, cosine, snr_db(signal, noise), mismatches)


def snr_db(signal: float, noise: float) -> float:
    """10 log10(signal energy / noise energy); inf when there is no noise."""
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf
