"""The loop every pass shares, on any container: select the weights, encode each, let the container
write it, report each one."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

import tcast
from coreai_opt._memory import trim_heap
from coreai_opt.weights import Container, Encoding, SkipKind, Skipped, WeightSite, decode

from ._config import Config, PalettizeConfig, QuantizeConfig, SparsifyConfig
from ._executors import Executor, executor_of
from ._palettize import palettize
from ._pieces import energies_in_pieces
from ._quantize import quantize
from ._results import CompressionReport, Progress, WeightResult
from ._sites import select_sites
from ._sparsify import sparsify

Encoder = Callable[[torch.Tensor, WeightSite, Any], "Encoding | str"]
_ENCODERS: dict[type, Encoder] = {
    QuantizeConfig: quantize,
    PalettizeConfig: palettize,
    SparsifyConfig: sparsify,
}


def compress_container(
    container: Container,
    config: Config,
    progress: Progress | None = None,
    executor: str | Executor | None = None,
) -> CompressionReport:
    """Compress every eligible weight of `container` in place with `config`; report each one.

    The encoding runs on `executor` (`local`, `ray` or an `Executor`; None: local); weights are
    read and written here in site order, so every executor writes the same program.
    `progress(done, total, name)` is called after each weight (for progress bars).
    """
    run = executor_of(executor)
    candidates = container.candidates()
    sites, skipped = select_sites(candidates, config.weight_num_threshold, config.for_weight)
    unmatched = [o.pattern for o in config.unmatched_overrides([c.name for c in candidates])]
    report = CompressionReport(
        skipped=list(skipped), unmatched_overrides=unmatched, already_compressed=container.compressed()
    )
    jobs = ((container.read(site), replace(site, handle=None), cfg) for site, cfg in sites)
    for done, ((site, _), outcome) in enumerate(zip(sites, run.map(encode_weight, jobs), strict=True), 1):
        if isinstance(outcome, Skipped):
            report.skipped.append(outcome)
        elif (refusal := container.refusal(site, outcome)) is not None:
            report.skipped.append(site.skipped(refusal, SkipKind.LAYOUT))
        else:
            written = container.write(site, outcome)
            report.weights.append(
                WeightResult(
                    site.name, site.shape, written.encoding, written.bytes_before, written.bytes_after,
                    tcast.snr_db(outcome.signal, outcome.noise), outcome.luts, outcome.sparsity,
                )
            )  # fmt: skip
        trim_heap()  # the weight's temporaries are freed: their pages go back, so the peak stays one weight's
        if progress is not None:
            progress(done, len(sites), site.name)
    container.finish()
    return report


def encode_weight(w: torch.Tensor, site: WeightSite, config: Config) -> Encoding | Skipped:
    """One weight's encoding under its config, or why it stays as it is (an encoding that would not
    shrink it is not applied): the unit of work an executor runs (it needs no container, so it runs
    in any process)."""
    if (reason := _non_finite(w)) is not None:
        return site.skipped(reason, SkipKind.NON_FINITE)
    outcome = _ENCODERS[type(config)](w, site, config)
    if isinstance(outcome, str):
        return site.skipped(outcome, SkipKind.LAYOUT)
    if outcome.nbytes >= site.nbytes:
        return site.skipped(
            f"kept: would grow ({site.nbytes:,} -> {outcome.nbytes:,} bytes)", SkipKind.WOULD_GROW
        )
    return measured(w, outcome)


def measured(w: torch.Tensor, encoding: Encoding) -> Encoding:
    """`encoding` with its cost in accuracy: the weight's energy and its error's, the error being
    what `weights.decode` gives (the values the device computes) less the weight, summed in pieces."""
    dense = decode(encoding, device=w.device)
    rows = w.reshape(w.shape[0] if w.dim() > 1 else 1, -1)
    dense_rows = dense.reshape(rows.shape)
    signal, noise = energies_in_pieces(rows, lambda a, b: dense_rows[a:b])
    return replace(encoding, signal=signal, noise=noise)


def _non_finite(w: torch.Tensor) -> str | None:
    """Why a weight holding NaN or Inf stays as it is (no scale, LUT or mask can carry it), or None."""
    if w.numel() == 0 or all(math.isfinite(float(v)) for v in torch.aminmax(w)):  # NaN, Inf reach min or max
        return None
    bad = int((~torch.isfinite(w)).sum())
    return f"{bad} NaN or Inf value{'s' * (bad > 1)}: left uncompressed" if bad else None
