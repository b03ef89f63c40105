"""The loop every compression pass shares: eligible weights in, rewritten program and report out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from coreai_opt._agreement import snr_db
from coreai_opt._coreai import _rewrite as rw
from coreai_opt._coreai._ir import constant_nbytes, stored_nbytes
from coreai_opt.inspection import weight_encoding

from ._results import CompressionReport, Progress, WeightResult


@dataclass
class Compressed:
    """One weight's new form: `build()` emits it at the weight's place; the errors are summed squares."""

    build: Callable[[], Any]
    signal: float
    noise: float
    luts: int | None = None
    sparsity: float | None = None


# (the weight's values, its site, the rewriter) -> its compressed form, or why its layout cannot take it
CompressOne = Callable[[torch.Tensor, rw.WeightSite, rw.Rewriter], "Compressed | str"]


def check_threshold(weight_num_threshold: int) -> None:
    if weight_num_threshold < 0:
        raise ValueError("weight_num_threshold must be 0 or more")


def compress_sites(
    program: Any, weight_num_threshold: int, compress_one: CompressOne, progress: Progress | None
) -> CompressionReport:
    """Rewrite every eligible weight of `program` in place with `compress_one` and report each one."""
    check_threshold(weight_num_threshold)
    sites, skipped = rw.weight_sites(program, weight_num_threshold)
    report = CompressionReport(skipped=list(skipped))
    rewriter = rw.Rewriter(program)
    for done, site in enumerate(sites, 1):
        w = rw.read_weight(site.op)
        if (reason := _non_finite(w)) is not None:
            report.skipped.append(rw.Skipped(site.name, site.shape, reason, rw.SkipKind.NON_FINITE))
        elif isinstance(outcome := compress_one(w, site, rewriter), str):
            report.skipped.append(rw.Skipped(site.name, site.shape, outcome, rw.SkipKind.LAYOUT))
        else:
            before = constant_nbytes(site.op)
            new = rewriter.replace(site, outcome.build)
            report.weights.append(
                WeightResult(
                    site.name, site.shape, weight_encoding(new), before, stored_nbytes(new),
                    snr_db(outcome.signal, outcome.noise), outcome.luts, outcome.sparsity,
                )
            )  # fmt: skip
        if progress is not None:
            progress(done, len(sites), site.name)
    rewriter.verify()
    return report


def _non_finite(w: torch.Tensor) -> str | None:
    """Why a weight holding NaN or Inf stays as it is (no scale, LUT or mask can carry it), or None."""
    bad = int((~torch.isfinite(w)).sum())
    return f"{bad} NaN or Inf value{'s' * (bad > 1)}: left uncompressed" if bad else None
