"""A size/accuracy sweep: one reference, several candidates, one row each."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coreai_opt._agreement import mean_of
from coreai_opt.io import asset_bytes

from ._compare import ComparisonResult, compare_many


@dataclass(frozen=True)
class SweepRow:
    """One candidate: what it costs on disk and how closely it agrees, over every output and
    sample (the minima are the worst output at its worst sample; the means average both)."""

    candidate: Path
    file_bytes: int
    ratio: float  # the reference's bytes over the candidate's
    bits_per_weight: float
    cosine_mean: float | None
    cosine_min: float | None
    snr_db_mean: float | None  # math.inf when every output agrees exactly
    snr_db_min: float | None
    ok: bool | None  # against min_cosine; None when none was given

    def to_dict(self) -> dict[str, Any]:
        def finite(value: float | None) -> float | None:
            return None if value is None or math.isinf(value) else value

        return {
            "candidate": str(self.candidate), "file_bytes": self.file_bytes, "ratio": self.ratio,
            "bits_per_weight": self.bits_per_weight, "cosine_mean": self.cosine_mean,
            "cosine_min": self.cosine_min, "snr_db_mean": finite(self.snr_db_mean),
            "snr_db_min": finite(self.snr_db_min), "ok": self.ok,
        }  # fmt: skip


@dataclass
class SweepResult:
    reference: Path
    reference_bytes: int
    reference_bits_per_weight: float
    rows: list[SweepRow] = field(default_factory=list)
    comparisons: list[ComparisonResult] = field(default_factory=list)  # per candidate, every output

    @property
    def ok(self) -> bool | None:
        return None if any(r.ok is None for r in self.rows) else all(r.ok for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        first = self.comparisons[0]
        return {
            "reference": str(self.reference),
            "reference_bytes": self.reference_bytes,
            "reference_bits_per_weight": self.reference_bits_per_weight,
            "inputs_source": first.inputs_source,
            "samples": first.samples,
            "min_cosine": first.min_cosine,
            "ok": self.ok,
            "rows": [r.to_dict() for r in self.rows],
            "comparisons": [c.to_dict() for c in self.comparisons],
        }

    def to_csv(self) -> str:
        """The rows as CSV, a header first (for spreadsheets)."""
        out = io.StringIO()
        rows = [r.to_dict() for r in self.rows]
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()


def compare_sweep(
    reference: Path | str, candidates: list[Path | str] | tuple[Path | str, ...], **options: Any
) -> SweepResult:
    """Every candidate against the reference on the same samples (`compare_many`, the same keyword
    options: the reference runs once), one row each: size on disk, bits per weight (as `inspect`
    counts them), cosine and SNR."""
    from coreai_opt.inspection import inspect_model

    trust_pickle = options.get("trust_pickle", False)
    comparisons = compare_many(reference, candidates, **options)
    reference = Path(reference)
    ref_bytes = asset_bytes(reference)
    result = SweepResult(
        reference, ref_bytes, inspect_model(reference, trust_pickle=trust_pickle).mean_bits_per_weight
    )
    for comparison in comparisons:
        outputs = comparison.outputs
        size = asset_bytes(comparison.candidate)
        row = SweepRow(
            comparison.candidate, size, ref_bytes / size,
            inspect_model(comparison.candidate, trust_pickle=trust_pickle).mean_bits_per_weight,
            mean_of([o.spread.cosine_mean for o in outputs]), comparison.worst_cosine,
            mean_of([o.spread.snr_db_mean for o in outputs]), comparison.worst_snr_db,
            comparison.ok,
        )  # fmt: skip
        result.rows.append(row)
        result.comparisons.append(comparison)
    return result
