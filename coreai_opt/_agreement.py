"""How closely one output agrees with a reference: the numbers every check and compare prints.

The metrics never claim more than they measured. They are computed over the positions that are
finite on both sides; how many positions there were, and how many were non-finite on each side,
travel with them. Over zero finite positions every metric is None ("n/a"), never 1.0, "exact" or
0; and an output that holds any inf or NaN - on either side, even the same NaN on both - fails
every threshold, because nothing was measured there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

import tcast


@dataclass(frozen=True)
class Agreement:
    positions: int  # elements compared
    finite: int  # positions finite on both sides: the ones the metrics below measure
    nonfinite_reference: int
    nonfinite_candidate: int
    nan_both: int  # positions NaN on both sides
    same_nonfinite: int  # positions non-finite on both sides with the same value (NaN/NaN, inf/inf)
    max_abs_error: float | None  # None: no finite position to measure
    relative_error: float | None  # max abs error over the reference's max magnitude
    cosine: float | None
    snr_db: float | None  # math.inf when the finite positions agree exactly

    @property
    def measured(self) -> bool:
        return self.finite > 0

    @property
    def clean(self) -> bool:
        """No inf or NaN on either side."""
        return self.nonfinite_reference == 0 and self.nonfinite_candidate == 0

    @property
    def exact(self) -> bool:
        return self.measured and self.max_abs_error == 0

    @property
    def nonfinite_mismatches(self) -> int:
        """Positions where one side is non-finite and the other is not, or both are but differ."""
        return self.nonfinite_reference + self.nonfinite_candidate - 2 * self.same_nonfinite

    def passes(self, min_cosine: float) -> bool:
        """Measured, free of inf/NaN on both sides, and at least `min_cosine`."""
        return self.clean and self.measured and self.cosine is not None and self.cosine >= min_cosine

    def nonfinite_summary(self) -> str:
        """'' when clean, else what was not finite: 'NaN in both: 384/384', 'candidate inf/NaN: 3/384'."""
        n = self.positions
        parts = []
        if self.nan_both:
            parts.append(f"NaN in both: {self.nan_both}/{n}")
        if self.same_nonfinite > self.nan_both:
            parts.append(f"same inf in both: {self.same_nonfinite - self.nan_both}/{n}")
        only_reference = self.nonfinite_reference - self.same_nonfinite
        only_candidate = self.nonfinite_candidate - self.same_nonfinite
        if only_reference:
            parts.append(f"reference-only inf/NaN: {only_reference}/{n}")
        if only_candidate:
            parts.append(f"candidate-only inf/NaN: {only_candidate}/{n}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, object]:
        """JSON: None for n/a; `exact` says when an SNR of None means perfect agreement."""

        def plain(value: float | None) -> float | None:
            return None if value is None or math.isinf(value) or math.isnan(value) else value

        return {
            "positions": self.positions,
            "finite_positions": self.finite,
            "nonfinite_reference": self.nonfinite_reference,
            "nonfinite_candidate": self.nonfinite_candidate,
            "nan_both": self.nan_both,
            "same_nonfinite": self.same_nonfinite,
            "nonfinite_mismatches": self.nonfinite_mismatches,
            "max_abs_error": self.max_abs_error,
            "relative_error": self.relative_error,
            "cosine": self.cosine,
            "snr_db": plain(self.snr_db),
            "exact": self.exact,
            "nonfinite": self.nonfinite_summary(),
        }


def agreement(reference: np.ndarray, candidate: np.ndarray) -> Agreement:
    """Compare two outputs of the same shape; see the module docstring for what is measured."""
    a = np.asarray(reference, dtype=np.float64).ravel()
    b = np.asarray(candidate, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.size} vs {b.size} elements")
    finite_a, finite_b = np.isfinite(a), np.isfinite(b)
    finite = finite_a & finite_b
    both_special = ~finite_a & ~finite_b
    nan_both = int(np.count_nonzero(both_special & np.isnan(a) & np.isnan(b)))
    same_inf = int(np.count_nonzero(both_special & (a == b)))
    a, b = a[finite], b[finite]
    measured = a.size > 0
    max_abs = relative = cosine = snr = None
    if measured:
        diff = np.abs(a - b)
        max_abs = float(diff.max())
        scale = float(np.abs(a).max())
        relative = max_abs / scale if scale > 0 else max_abs
        norms = float(np.linalg.norm(a) * np.linalg.norm(b))
        # identical vectors agree exactly even where both are zero (cosine is then undefined)
        cosine = float(np.clip(a @ b / norms, -1.0, 1.0)) if norms > 0 else (1.0 if max_abs == 0 else 0.0)
        snr = tcast.snr_db(float(a @ a), float(diff @ diff))
    return Agreement(
        positions=int(finite_a.size),
        finite=int(a.size),
        nonfinite_reference=int(np.count_nonzero(~finite_a)),
        nonfinite_candidate=int(np.count_nonzero(~finite_b)),
        nan_both=nan_both,
        same_nonfinite=nan_both + same_inf,
        max_abs_error=max_abs,
        relative_error=relative,
        cosine=cosine,
        snr_db=snr,
    )


def worst_of(samples: Sequence[Agreement]) -> Agreement:
    """One output's agreement over several samples, each metric at its worst: counts add up, errors
    are the largest, cosine and SNR the smallest; a metric any sample could not measure is None."""
    if not samples:
        raise ValueError("no samples to combine")

    def pick(values: list[float | None], best: Callable[[list[float]], float]) -> float | None:
        return None if any(v is None for v in values) else best(values)  # type: ignore[arg-type]

    return Agreement(
        positions=sum(s.positions for s in samples),
        finite=sum(s.finite for s in samples),
        nonfinite_reference=sum(s.nonfinite_reference for s in samples),
        nonfinite_candidate=sum(s.nonfinite_candidate for s in samples),
        nan_both=sum(s.nan_both for s in samples),
        same_nonfinite=sum(s.same_nonfinite for s in samples),
        max_abs_error=pick([s.max_abs_error for s in samples], max),
        relative_error=pick([s.relative_error for s in samples], max),
        cosine=pick([s.cosine for s in samples], min),
        snr_db=pick([s.snr_db for s in samples], min),
    )


def mean_of(values: Sequence[float | None]) -> float | None:
    """The mean of measured values (math.inf when any is inf); None when any was not measured."""
    if not values or any(v is None for v in values):
        return None
    return math.fsum(values) / len(values)  # type: ignore[arg-type]
