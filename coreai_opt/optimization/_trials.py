"""Measured damage where a plan's trades happen. The second-order estimate (`_costs`) prices a
whole setting well (uniform 4-bit tables on SmolLM2-135M: within 1% of the measured KL) but single
weights less so: its Kronecker factors miss how a layer's output errors reach the loss (measured
on SmolLM2: value projections priced 2-10x too high, one late down projection 6-7x too low), and
a plan that trades one weight against another rests on exactly those errors.

So for a language model each weight's two smallest choices (its "anchors": where its damage is
largest and a tight budget's trades happen) are measured: the decoded weight swapped into the
program alone, the KL divergence from the program's own next-token distribution on the first
calibration tokens (`evaluation.trial_divergences`; never the evaluation data). A measured
choice's damage is its measurement; the weight's other choices keep their estimate times the
measured / estimated ratio, interpolated between the anchors in log estimate (outside them, the
nearest anchor's ratio). Trials are cached per choice like the columns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _cache
from ._choices import Choice

Progress = Callable[[int, int, str], None]
ANCHORS = 2  # measured choices a weight
_PIECE_BYTES = 256 << 20  # decoded weights swapped in per pass over the tokens
_FLOOR = 1e-12  # a measured KL at or below it is read as this (a ratio needs a positive one)
_VERSION = "v2"  # of the trial's measurement (a change re-measures instead of reading old files)


def anchors(table: Any) -> list[list[int]]:
    """Per weight, the columns of its `ANCHORS` compressing choices that store the fewest bytes."""
    keep = table.column("keep")
    found = []
    for row_bytes, row_damage in zip(table.nbytes, table.estimate, strict=True):
        usable = [
            k
            for k, b in enumerate(row_bytes)
            if k != keep and math.isfinite(b) and math.isfinite(row_damage[k])
        ]
        found.append(sorted(usable, key=lambda k: (row_bytes[k], k))[:ANCHORS])
    return found


def corrected(estimate: list[float], measured: dict[int, float]) -> list[float]:
    """A weight's damages: measured where measured, else the estimate times the measured /
    estimated ratio interpolated in log estimate between the measured choices (a NaN measurement
    counts as none; an infinite one rules out its own choice only)."""
    measured = {k: m for k, m in measured.items() if not math.isnan(m)}
    points = sorted(
        (math.log(estimate[k]), math.log(max(m, _FLOOR) / estimate[k]))
        for k, m in measured.items()
        if math.isfinite(m) and math.isfinite(estimate[k]) and estimate[k] > 0
    )
    found = []
    for k, e in enumerate(estimate):
        if k in measured:
            found.append(max(measured[k], 0.0))
        elif points and math.isfinite(e) and e > 0:
            xs, ratios = zip(*points, strict=True)
            found.append(e * math.exp(float(np.interp(math.log(e), xs, ratios))))
        else:
            found.append(e)
    return found


def measure_anchors(
    table: Any, choices: tuple[Choice, ...], loaded: Any, keys: dict[str, str], tokens: int, threshold: int,
    progress: Progress | None,
) -> None:  # fmt: skip
    """Measure (or read from the cache) every weight's anchors on the first `tokens` calibration
    tokens (whole windows, at least one, at most the calibration's) and correct `table.damage` by
    them; a program that is not a language model keeps the estimate (`cost_table` never calls it
    for random calibration samples)."""
    from coreai_opt.evaluation import NotALanguageModel, trial_products

    by_choice: dict[int, list[str]] = {}
    for w, columns in enumerate(anchors(table)):
        for k in columns:
            by_choice.setdefault(k, []).append(table.names[w])
    mode = "bf16" if trial_products(device=loaded.device) != "exact" else "exact"  # ~0.1-0.3% apart
    files = {k: _cache.entry(keys[table.choices[k]], _VERSION, mode, tokens) for k in by_choice}
    entries = {k: _cache.read(path) or {} for k, path in files.items()}
    if any(e.get("language") is False for e in entries.values()):
        return
    results = {k: _stored(entries[k]) for k in by_choice}
    wanted = {k: [n for n in names if n not in results[k][0]] for k, names in by_choice.items()}
    used = max((r[1] for r in results.values()), default=0)
    total, done = sum(map(len, wanted.values())), 0
    ids = _token_ids(loaded, tokens) if total else None
    pending = {k: {n for n in names if table.choices[k] not in loaded.encodings.get(n, {})}
               for k, names in wanted.items()}  # fmt: skip
    for k, names in wanted.items():
        _keep_statistics(loaded, set().union(*pending.values()))
        del pending[k]
        if not names:
            continue
        try:
            if ids is None:
                raise NotALanguageModel("the program takes no [batch, tokens] ids")
            choice = next(c for c in choices if c.name == table.choices[k])
            results[k][0].update(
                _trials(loaded, choice, names, ids, threshold, _Offset(progress, done, total))
            )
        except NotALanguageModel:  # remembered, so that a new budget does not load the program for it
            _cache.write(files[k], {"tokens": tokens, "language": False})
            return
        done, used = done + len(names), len(ids)
        _cache.write(files[k], {"tokens": tokens, "used": used, "kl": results[k][0]})
    for w, name in enumerate(table.names):
        found = {k: results[k][0].get(name) for k in by_choice}
        table.measured[w] = {k: v for k, v in found.items() if v is not None}
        table.damage[w] = corrected(table.estimate[w], table.measured[w])
    table.trial_tokens = used


def _keep_statistics(loaded: Any, names: set[str]) -> None:
    """Let go of the statistics of every weight but `names`, those the trials have yet to encode
    whole. The estimate kept every weight's that some choice sampled (at 135M, lut8's sample
    takes in nearly all), but a trial encodes again only where its anchor was sampled. What they
    held goes back to the system (glibc keeps the freed heap otherwise)."""
    from coreai_opt._memory import trim_heap
    from coreai_opt.weights import known_of

    loaded.known = known_of(loaded.known, names)
    trim_heap()


def _stored(entry: dict[str, Any]) -> tuple[dict[str, float | None], int]:
    """A trials file's measurements (None: the weight could not be tried) and the tokens they
    were measured on; nothing from a file that does not read as one."""
    kl = entry.get("kl")
    try:
        found = (
            {str(n): None if v is None else float(v) for n, v in kl.items()} if isinstance(kl, dict) else {}
        )
        return found, int(entry.get("used") or 0)
    except (TypeError, ValueError):
        return {}, 0


def _token_ids(loaded: Any, tokens: int) -> np.ndarray | None:
    """The first calibration samples' token ids (as the calibration read them) as one stream of
    whole windows (at least one), or None where the program's first input is not `[batch, tokens]`
    integer ids."""
    import torch

    pieces, count, length = [], 0, 0
    for inputs in loaded.calibration.inputs:
        ids = inputs[0].cpu()
        if ids.ndim != 2 or ids.is_floating_point() or ids.dtype == torch.bool:
            return None
        pieces.append(ids.reshape(-1).numpy())
        count, length = count + ids.numel(), ids.shape[1]
        if count >= tokens:
            break
    if not pieces:
        return None
    return np.concatenate(pieces)[: max(length, tokens - tokens % length)]


def _trials(
    loaded: Any, choice: Choice, names: list[str], ids: np.ndarray, threshold: int, progress: _Offset
) -> dict[str, float | None]:
    """The trial KL of each named weight under `choice` (None where it has no encoding), decoded
    weights swapped in a piece at a time; the kept encodings are let go as they are decoded."""
    from coreai_opt.compression import trial_encodings
    from coreai_opt.evaluation import trial_divergences
    from coreai_opt.weights import Skipped, decode

    held = {n: loaded.encodings.get(n, {}).pop(choice.name, None) for n in names}
    missing = [n for n, e in held.items() if e is None]
    if missing:
        config = choice.config_for(True, threshold)
        for site, outcome in trial_encodings(
            loaded.ep, config, loaded.calibration, set(missing), loaded.known
        ):
            if not isinstance(outcome, Skipped):
                held[site.name] = outcome
    found: dict[str, float | None] = {n: None for n, e in held.items() if e is None}
    piece: dict[str, Any] = {}
    size = 0
    for index, name in enumerate(names):
        encoding = held.pop(name)
        if encoding is not None:
            piece[name] = decode(encoding)
            size += piece[name].numel() * piece[name].element_size()
        if piece and (size >= _PIECE_BYTES or index == len(names) - 1):
            measured = trial_divergences(
                loaded.ep, ids, piece, device=loaded.device, progress=progress.piece(len(piece), choice.name)
            )
            found.update(measured)
            progress.done += len(piece)
            piece, size = {}, 0
    return found


class _Offset:
    """Trials' progress over all the anchors measured in one run: a piece's steps (its windows x
    trials) counted as its share of trials."""

    def __init__(self, progress: Progress | None, done: int, total: int) -> None:
        self.progress, self.done, self.total = progress, done, total

    def piece(self, count: int, choice: str) -> Progress | None:
        if self.progress is None:
            return None
        report, done, total = self.progress, self.done, self.total

        def step(at: int, of: int, label: str) -> None:
            report(min(total, done + at * count // max(of, 1)), total, f"trial {choice}: {label}")

        return step
