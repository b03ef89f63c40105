"""Per-weight records every compression pass returns and every CLI renders."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from coreai_opt.weights import Learned, SkipKind, Skipped

Progress = Callable[[int, int, str], None]  # (weights done, weights in all, the one just done)


@dataclass(frozen=True)
class WeightResult:
    name: str
    shape: tuple[int, ...]
    encoding: str
    bytes_before: int
    bytes_after: int
    snr_db: float
    luts: int | None = None  # palettized weights: how many look-up tables
    sparsity: float | None = None  # sparsified weights: the fraction stored as zeros
    learned: Learned | None = None  # methods that learn from data: the weighted error, before and after

    @property
    def bits_per_weight(self) -> float:
        count = int(np.prod(self.shape)) if self.shape else 1
        return self.bytes_after * 8 / count


@dataclass
class CompressionReport:
    weights: list[WeightResult] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    unmatched_overrides: list[str] = field(default_factory=list)  # patterns no weight name matched
    already_compressed: int = 0  # weights the program held compressed before: left as they were
    data_free: list[str] = field(
        default_factory=list
    )  # a method learning from data had no statistics for these
    # the mean divergence from the given program over each pass of end-to-end table tuning
    tuning: list[float] = field(default_factory=list)
    calibration: str | None = None  # what the methods that learn from data learned from (its budget)

    @property
    def bytes_before(self) -> int:
        """Bytes of the weights compressed, before (the `total_` figures add what was left)."""
        return sum(w.bytes_before for w in self.weights)

    @property
    def bytes_after(self) -> int:
        return sum(w.bytes_after for w in self.weights)

    @property
    def kept_bytes(self) -> int:
        """Bytes of every float tensor left as it was (small, not a weight, skipped, kept)."""
        return sum(s.nbytes for s in self.skipped)

    @property
    def total_bytes_before(self) -> int:
        """Every float tensor of the program, before: the figure the file's size follows."""
        return self.bytes_before + self.kept_bytes

    @property
    def total_bytes_after(self) -> int:
        return self.bytes_after + self.kept_bytes

    @property
    def total_ratio(self) -> float | None:
        return self.total_bytes_before / self.total_bytes_after if self.total_bytes_after else None

    @property
    def elements(self) -> int:
        return sum(int(np.prod(w.shape)) for w in self.weights)

    @property
    def ratio(self) -> float | None:
        return self.bytes_before / self.bytes_after if self.bytes_after else None

    @property
    def bits_per_weight(self) -> float | None:
        """Mean stored bits per compressed weight element, scales and offsets included."""
        return self.bytes_after * 8 / self.elements if self.elements else None

    @property
    def model_bits_per_weight(self) -> float | None:
        """Stored bits per element over every float tensor but scalars, compressed or kept: the
        program's bits per weight, the figure `inspect`, `compare` and `eval` report."""
        kept = [s for s in self.skipped if math.prod(s.shape) > 1]
        elements = self.elements + sum(math.prod(s.shape) for s in kept)
        return (self.bytes_after + sum(s.nbytes for s in kept)) * 8 / elements if elements else None

    @property
    def problems(self) -> list[str]:
        """What suggests the config did not do what was meant: an override matching no weight, or
        nothing compressed (with the commonest reason eligible weights were left)."""
        names = [w.name for w in self.weights] + [
            s.name for s in self.skipped if s.kind is not SkipKind.NOT_A_WEIGHT
        ]
        like = f" (names are like {', '.join(repr(n) for n in names[:3])})" if names else ""
        found = [f"override {pattern!r} matched no weight{like}" for pattern in self.unmatched_overrides]
        if not self.weights:
            left = [s for s in self.skipped if s.kind not in (SkipKind.SMALL, SkipKind.NOT_A_WEIGHT)]
            if left:
                reason, count = Counter(s.reason for s in left).most_common(1)[0]
                why = f"{len(left)} weights left, e.g. {count} as '{reason}'"
            else:
                other = " other" if self.already_compressed else ""
                why = f"no{other} eligible weight among {len(self.skipped)} float tensors"
            found.append(f"nothing was compressed ({why})")
        return found

    @property
    def warnings(self) -> list[str]:
        found = []
        if self.already_compressed:
            found.append(f"{self.already_compressed} weights were already compressed: left as they were")
        if self.data_free:
            example = ", ".join(self.data_free[:3]) + (", ..." if len(self.data_free) > 3 else "")
            found.append(
                f"{len(self.data_free)} weights had no calibration statistics their method could use "
                f"(an embedding lookup, a grouped convolution): encoded data-free ({example})"
            )
        return found + self._layout_warning() + self.problems

    def _layout_warning(self) -> list[str]:
        """Weights the granularity does not fit (a block size not dividing the input axis) are
        kept as they were: said loudly, with the bytes they keep, when others were compressed."""
        misfits = [s for s in self.skipped if s.kind is SkipKind.LAYOUT]
        if not misfits or not self.weights:
            return []
        names = ", ".join(s.name for s in misfits[:3]) + (", ..." if len(misfits) > 3 else "")
        kept = sum(s.nbytes for s in misfits)
        return [
            f"{len(misfits)} weights kept uncompressed, {kept / 1024:,.1f} KiB as stored: their shape does not "
            f"fit the granularity ({misfits[0].reason}: {names}); they count in the program's bits/weight, "
            "not in the compressed weights'"
        ]

    def to_dict(self) -> dict[str, Any]:
        def plain(record: Any) -> dict[str, Any]:
            data = asdict(record)
            data["shape"] = list(data["shape"])
            return data

        weights = []
        for w in self.weights:
            entry = plain(w)
            entry["bits_per_weight"] = w.bits_per_weight
            entry["snr_db"] = None if math.isinf(w.snr_db) else w.snr_db
            entry["exact"] = w.snr_db == math.inf  # no error at all: the SNR is infinite
            if w.learned is not None:  # inf (no error at all) is not JSON
                entry["learned"] = {
                    k: (None if isinstance(v, float) and math.isinf(v) else v)
                    for k, v in asdict(w.learned).items()
                }
            weights.append(entry)
        return {
            "weights": weights,
            "skipped": [plain(s) | {"kind": s.kind.value} for s in self.skipped],
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "ratio": self.ratio,
            "kept_bytes": self.kept_bytes,
            "total_bytes_before": self.total_bytes_before,
            "total_bytes_after": self.total_bytes_after,
            "total_ratio": self.total_ratio,
            "bits_per_weight": self.bits_per_weight,
            "model_bits_per_weight": self.model_bits_per_weight,
            "already_compressed": self.already_compressed,
            "data_free": list(self.data_free),
            "tuning": list(self.tuning),
            "calibration": self.calibration,
            "warnings": self.warnings,
        }
