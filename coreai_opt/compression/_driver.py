"""The loop every pass shares, on any container: select the weights, encode each with its
algorithm - data-free ones mapped over the weights, data-driven ones against calibration
statistics, layer by layer where they ask - let the container write it, report each one."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping
from dataclasses import replace

import torch

import tcast
from coreai_opt._memory import EveryBytes, ReadOnce, parked, trim_heap
from coreai_opt._pieces import energies_in_pieces
from coreai_opt.errors import ConfigError
from coreai_opt.weights import (
    Calibration,
    Container,
    Encoding,
    Known,
    Needs,
    Palettized,
    SkipKind,
    Skipped,
    Statistics,
    WeightSite,
    decode,
    row_slice,
    statistics_from,
)

from ._executors import Executor, executor_of
from ._results import CompressionReport, Progress, WeightResult
from ._row_sample import RowSample, row_sample, sample_size
from ._sites import select_sites
from .configs import WeightConfig
from .registry import Algorithm, algorithm_for, learns_from_data


def compress_container(
    container: Container,
    config: WeightConfig,
    progress: Progress | None = None,
    executor: str | Executor | None = None,
    calibration: Calibration | None = None,
) -> CompressionReport:
    """Compress every eligible weight of `container` in place with `config`; report each one.

    Each weight's config selects its algorithm (`registry`). Data-free ones run on `executor`
    (`local`, `ray` or an `Executor`; None: local), weights read and written here in site order,
    so every executor writes the same program. Those that learn from data take their statistics
    from `calibration` afterwards: one pass for all of them, or - layer by layer - in graph order
    with every weight written so far swapped in. `progress(done, total, name)` is called after
    each weight (for progress bars).
    """
    candidates = container.candidates()
    sites, skipped = select_sites(candidates, config.weight_num_threshold, config.for_weight)
    unmatched = [o.pattern for o in config.unmatched_overrides([c.name for c in candidates])]
    report = CompressionReport(
        skipped=list(skipped), unmatched_overrides=unmatched, already_compressed=container.compressed()
    )
    plan = [(site, cfg, algorithm_for(cfg)) for site, cfg in sites]
    learned = [(site, cfg, a) for site, cfg, a in plan if not a.data_free]
    if learned and calibration is None:
        raise ConfigError(learns_from_data(sorted({a.method for _, _, a in learned})), "calibration")
    run = _Run(container, report, len(sites), progress, calibration if learned else None, learned)
    run.data_free([(site, cfg) for site, cfg, a in plan if a.data_free], executor_of(executor))
    if learned:
        run.learned()
    container.finish()
    return report


class _Run:
    """One pass over a container's weights: what is written, reported and counted as each
    weight's encoding comes back, data-free ones first, then those that learn from data."""

    def __init__(
        self, container: Container, report: CompressionReport, total: int, progress: Progress | None,
        calibration: Calibration | None, learned: list[tuple[WeightSite, WeightConfig, Algorithm]],
    ) -> None:  # fmt: skip
        self.container, self.report, self.total, self.progress = container, report, total, progress
        self.calibration, self.learned_sites = calibration, learned
        self.done = 0
        self.trims = EveryBytes(trim_heap)
        # the weights as given are compared with only where tables are tuned: otherwise
        # the calibration lets each go once replaced, so the pass holds one copy of the model, not two
        self.keep = any(any(_tuning_passes(cfg)) for _, cfg, _ in learned)
        # and then nothing lets go of the weights read here from the program's mapped file: their
        # pages are handed back as the pass goes (read again from the page cache for the report)
        self.read_once = ReadOnce()

    def finish(self, site: WeightSite, outcome: Encoding | Skipped, learns: bool = False) -> None:
        _record(self.container, self.report, site, outcome, self.calibration, learns, self.keep)
        self.trims.passed(math.prod(site.shape) * 4)  # its temporaries back on the heap: trimmed at times
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total, site.name)

    def data_free(self, free: list[tuple[WeightSite, WeightConfig]], run: Executor) -> None:
        jobs = ((self.container.read(site), replace(site, handle=None), cfg) for site, cfg in free)
        outcomes = run.map(encode_weight, jobs)
        try:
            for (site, _), outcome in zip(free, outcomes, strict=True):
                self.finish(site, outcome)
        finally:  # a failure here stops an executor's workers now, not when the generator is collected
            getattr(outcomes, "close", lambda: None)()

    def learned(self) -> None:
        calibration = self.calibration
        assert calibration is not None
        reports = hasattr(calibration, "progress")  # its statistics taken in one go, sample by sample
        if reports:
            calibration.progress = self.progress
        try:
            self._learn(calibration)
        finally:  # a callback outlives no bar
            if reports:
                calibration.progress = None

    def _learn(self, calibration: Calibration) -> None:
        held: list[tuple[WeightSite, Encoding]] = []  # tables to tune end to end once all are chosen
        for site, cfg, statistics in _statistics_in_order(
            self.learned_sites, calibration, final=not self.keep
        ):
            outcome = encode_weight(self._read(site), site, cfg, statistics)
            if _tunes(cfg, outcome) and self.container.refusal(site, outcome) is None:
                assert isinstance(outcome, Encoding)
                calibration.replace(site.name, decode(outcome), keep_original=True)
                held.append((site, _parked_indices(outcome)))  # decoded first, from the heap's copy
                self.trims.passed(math.prod(site.shape) * 4)  # as `finish` does for a weight written
                continue
            self.finish(site, outcome, learns=True)
        if held:
            passes = {site.name: _tuning_passes(cfg) for site, cfg, _ in self.learned_sites}
            epochs, blocks = (max(p[k] for p in passes.values()) for k in (0, 1))
            blocked = {name for name, p in passes.items() if p[1]}  # each config says for its weights
            tuned, self.report.tuning = _tuned(
                held, calibration, (epochs, blocks, blocked), self.progress, self.done, self.total
            )
            for (site, _), outcome in zip(held, tuned, strict=True):
                self.finish(site, measured(self._read(site), outcome), learns=True)
        self.read_once.release()

    def _read(self, site: WeightSite) -> torch.Tensor:
        return self.read_once.passed(self.container.read(site)) if self.keep else self.container.read(site)


def _parked_indices(encoding: Encoding) -> Encoding:
    """`encoding` with its table's indices parked in the spill around, if any (`_memory.parked`):
    a weight held for the tuning keeps its codes (a byte each) as file pages that the tuning reads
    a weight at a time and hands back, not as heap held until every weight is written."""
    form = encoding.form
    if not isinstance(form, Palettized):
        return encoding
    values = form.indices.values
    if values.ndim == 0 or not (values.flags.writeable and values.flags.c_contiguous):
        return encoding
    values = parked(torch.from_numpy(values)).numpy()
    return replace(encoding, form=replace(form, indices=replace(form.indices, values=values)))


def _tuning_passes(config: WeightConfig) -> tuple[int, int]:
    """(end-to-end passes, block-by-block passes) a config tunes its tables for."""
    return getattr(config, "tune_epochs", 0), getattr(config, "tune_blocks", 0)


def _tunes(config: WeightConfig, outcome: Encoding | Skipped) -> bool:
    from .algorithms._tuning import tunable

    return any(_tuning_passes(config)) and isinstance(outcome, Encoding) and tunable(outcome)


def _tuned(
    held: list[tuple[WeightSite, Encoding]],
    calibration: Calibration,
    passes: tuple[int, int, set[str]],
    progress: Progress | None,
    done: int,
    total: int,
) -> tuple[list[Encoding], list[float]]:
    """The held encodings with their tables (and codes) tuned block by block (`_block_tuning`:
    `passes`' second count, the weights named in its third), then all end to end (`_tuning`:
    its first), and the mean divergence of each end-to-end pass; the progress line names the
    step."""
    from .algorithms._block_tuning import tune_blocks
    from .algorithms._tuning import tune_tables

    epochs, blocks, blocked = passes

    def block_step(block: int, steps: int, loss: float) -> None:
        if progress is not None:
            progress(done, total, f"tuning {len(held)} weights a block at a time: block {block}, "
                                  f"step {steps}, loss {loss:.4g}")  # fmt: skip

    def step(steps: int, of: int, divergence: float) -> None:
        if progress is not None:
            progress(
                done,
                total,
                f"tuning {len(held)} weights' tables: step {steps}/{of}, divergence {divergence:.4g}",
            )

    if not blocks:
        return tune_tables(held, calibration, epochs, step)
    mine = [(site, encoding) for site, encoding in held if site.name in blocked]
    encodings, forget = tune_blocks(mine, calibration, blocks, block_step)
    changed = {site.name: _parked_indices(e) for (site, _), e in zip(mine, encodings, strict=True)}
    held = [(site, changed.get(site.name, encoding)) for site, encoding in held]  # new codes parked again
    tuned = tune_tables(held, calibration, epochs, step) if epochs else ([e for _, e in held], [])
    forget()  # the blocks' checkpoints, once the end-to-end passes that start from them are done
    return tuned


def _statistics_in_order(
    learned: list[tuple[WeightSite, WeightConfig, Algorithm]], calibration: Calibration, final: bool
) -> Iterator[tuple[WeightSite, WeightConfig, Statistics]]:
    """Each weight that learns from data with its statistics: one pass per kind of need for the
    weights that take them as the program is, then the layer-by-layer ones in graph order (each
    asked for only after the one before was written and swapped in). `final`: nothing is asked
    of the calibration after these (no tables are tuned), so the last pass may let go of what it
    holds as it goes."""
    by_name = {site.name: (site, cfg, a) for site, cfg, a in learned}
    at_once = list(dict.fromkeys(a.needs for _, _, a in learned if not a.sequential))
    in_order = list(dict.fromkeys(a.needs for _, _, a in learned if a.sequential))
    for needs in at_once:
        names = [site.name for site, _, a in learned if not a.sequential and a.needs is needs]
        last = final and not in_order and needs is at_once[-1]
        gathered = calibration.statistics(names, needs, final=last)
        for name in names:
            site, cfg, _ = by_name[name]
            yield site, cfg, gathered[name]
    for needs in in_order:
        names = [site.name for site, _, a in learned if a.sequential and a.needs is needs]
        for name, statistics in calibration.sequential(names, needs, final=final and needs is in_order[-1]):
            site, cfg, _ = by_name[name]
            yield site, cfg, statistics


def _record(
    container: Container,
    report: CompressionReport,
    site: WeightSite,
    outcome: Encoding | Skipped,
    calibration: Calibration | None,
    learns: bool = False,
    keep_original: bool = True,
) -> None:
    """Write one weight's outcome into the container and the report (and, where data is being
    learned from, swap its decoded value into the calibration program). A weight whose method
    `learns` from data but was encoded without it is named in the report."""
    if isinstance(outcome, Skipped):
        report.skipped.append(outcome)
        return
    if (refusal := container.refusal(site, outcome)) is not None:
        report.skipped.append(site.skipped(refusal, SkipKind.LAYOUT))
        return
    written = container.write(site, outcome)
    report.weights.append(
        WeightResult(
            site.name, site.shape, written.encoding, written.bytes_before, written.bytes_after,
            tcast.snr_db(outcome.signal, outcome.noise), outcome.luts, outcome.sparsity, outcome.learned,
        )
    )  # fmt: skip
    if learns and outcome.learned is None:
        report.data_free.append(site.name)
    if calibration is not None:
        calibration.replace(site.name, decode(outcome), keep_original=keep_original)


def encode_weight(
    w: torch.Tensor,
    site: WeightSite,
    config: WeightConfig,
    statistics: Statistics | None = None,
    compare: bool = True,
) -> Encoding | Skipped:
    """One weight's encoding under its config's algorithm, or why it stays as it is (an encoding
    that would not shrink it is not applied): the unit of work an executor runs (it needs no
    container, so it runs in any process). `compare=False`: no data-free encoding measured beside
    a learned one (`Algorithm.compares`)."""
    if (reason := _non_finite(w)) is not None:
        return site.skipped(reason, SkipKind.NON_FINITE)
    algorithm = algorithm_for(config)
    options = {} if compare or not algorithm.compares else {"compare": False}
    outcome = algorithm.encode()(w, site, config, statistics, **options)
    if isinstance(outcome, str):
        return site.skipped(outcome, SkipKind.LAYOUT)
    if outcome.nbytes >= site.nbytes:
        return site.skipped(
            f"kept: would grow ({site.nbytes:,} -> {outcome.nbytes:,} bytes)", SkipKind.WOULD_GROW
        )
    return measured(w, outcome)


_DECODED_PIECE = 1 << 18  # elements: a piece decoded and compared while it is in the cache


def measured(w: torch.Tensor, encoding: Encoding) -> Encoding:
    """`encoding` with its cost in accuracy: the weight's energy and its error's, the error being
    what `weights.decode` gives (the values the device computes) less the weight, summed in pieces.
    Quantized weights decode a cache-sized piece of rows at a time (the same arithmetic on the
    same stored values: the same bits), others whole."""
    rows = w.reshape(w.shape[0] if w.dim() > 1 else 1, -1)
    if row_slice(encoding.form, 0, 1) is not None:

        def decoded(a: int, b: int) -> torch.Tensor:
            piece = row_slice(encoding.form, a, b)
            return decode(piece, encoding.element.torch_dtype(), w.device).reshape(b - a, -1)

        signal, noise = energies_in_pieces(rows, decoded, _DECODED_PIECE)
    else:
        dense_rows = decode(encoding, device=w.device).reshape(rows.shape)
        signal, noise = energies_in_pieces(rows, lambda a, b: dense_rows[a:b])
    return replace(encoding, signal=signal, noise=noise)


def _non_finite(w: torch.Tensor) -> str | None:
    """Why a weight holding NaN or Inf stays as it is (no scale, LUT or mask can carry it), or None."""
    if w.numel() == 0 or all(math.isfinite(float(v)) for v in torch.aminmax(w)):  # NaN, Inf reach min or max
        return None
    bad = int((~torch.isfinite(w)).sum())
    return f"{bad} NaN or Inf value{'s' * (bad > 1)}: left uncompressed" if bad else None


def trial_encodings(
    container: Container, config: WeightConfig, calibration: Calibration | None = None,
    only: Collection[str] | None = None, known: Known | None = None,
) -> Iterator[tuple[WeightSite, Encoding | Skipped]]:  # fmt: skip
    """Each weight `compress_container` would compress (of those named in `only`, if given), with
    its encoding (or why it stays) - nothing written: what a caller swaps into a model in memory to
    measure one weight at a time. Methods that learn from data take their statistics of the
    program as it is from `known` where it has them, the rest in one pass."""
    for site, outcome, _ in sampled_trial_encodings(container, config, calibration, only, known=known):
        yield site, outcome


def sampled_trial_encodings(
    container: Container, config: WeightConfig, calibration: Calibration | None = None,
    only: Collection[str] | None = None, elements: int = 0, known: Known | None = None,
) -> Iterator[tuple[WeightSite, Encoding | Skipped, RowSample | None]]:  # fmt: skip
    """`trial_encodings`, a weight of more than `elements` values (0: none; fewer for a large table:
    `_row_sample.sample_size`) encoded on a sample of that many values of its row groups where its
    encoding keeps the rows apart (`_row_sample`): each weight's site, its outcome - of the
    sample's rows, where there is a sample - and the sample or None."""
    sites, _ = select_sites(container.candidates(), config.weight_num_threshold, config.for_weight)
    if only is not None:
        sites = [(site, cfg) for site, cfg in sites if site.name in only]
    learned = [(site, cfg) for site, cfg in sites if not algorithm_for(cfg).data_free]
    if learned and calibration is None:
        raise ConfigError("the method learns from data: give calibration samples", "calibration")
    by_needs: dict[Needs, Mapping[str, Statistics]] = {}  # read a weight at a time where they are so
    for needs in dict.fromkeys(algorithm_for(cfg).needs for _, cfg in learned):
        names = [site.name for site, cfg in learned if algorithm_for(cfg).needs is needs]
        by_needs[needs] = statistics_from(calibration, names, needs, known)  # type: ignore[arg-type]
    read = ReadOnce()  # each weight's file pages handed back as the pass goes, not held to its end
    try:
        for site, cfg in sites:
            stats = by_needs.get(algorithm_for(cfg).needs, {}).get(site.name)
            outcome, sample = _sampled_encoding(
                container, site, cfg, read.passed(container.read(site)), stats, elements
            )
            yield site, outcome, sample
    finally:
        read.release()


def _sampled_encoding(
    container: Container, site: WeightSite, cfg: WeightConfig, w: torch.Tensor, stats: Statistics | None,
    elements: int,
) -> tuple[Encoding | Skipped, RowSample | None]:  # fmt: skip
    """The encoding of `w` at `site`, or of a sample of its rows (`sampled_trial_encodings`)."""
    encoded = site
    if (sample := row_sample(site, cfg, sample_size(cfg, elements))) is not None:
        w, encoded, stats = (
            sample.take(w, site.output_axis),
            sample.site(site),
            sample.statistics(stats, site),
        )
    outcome = encode_weight(w, encoded, cfg, stats, compare=False)  # an estimate: no data-free SNR
    if not isinstance(outcome, Skipped) and (refusal := container.refusal(encoded, outcome)) is not None:
        outcome = site.skipped(refusal, SkipKind.LAYOUT)
    return outcome, sample
