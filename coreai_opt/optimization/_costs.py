"""What each choice costs each weight: bytes as stored (codes, LUTs, scales, masks - the encoding's
own count) and the damage it does, estimated as the second-order term of the loss in
Kronecker-factored form (K-FAC): 1/2 sum_j S_j dW_j G dW_j^T per token, G the consumer's input Gram
matrix and S_j the mean squared gradient at output channel j, read off the squared weight
gradients on the calibration data (the cross entropy of next tokens drawn from the program's own
predictions, or the output's squared error through a random-sign projection). Unlike the diagonal
1/2 sum(F dW^2) it sees where an error lies relative to the inputs - GPTQ's whole point - so
GPTQ-made and data-free encodings are priced alike. For a language model it approximates the KL divergence the weight alone adds.

The estimate prices whole settings well but single weights less so; for language models each
weight's two smallest choices are then measured and its estimates corrected by them (`_trials`).
Each choice's column and trials are cached on disk (`_cache`) keyed by the program file's bytes,
the calibration samples and the choice's config, so a new budget re-solves without touching the
model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _cache
from ._choices import Choice

Progress = Callable[[int, int, str], None]
# The cache files' layout (2: the Kronecker-factored estimate; 3: GPTQ onto clipped scales, twin heads;
# 4: tables of more than 16 entries estimated on smaller samples; 5: squared gradients' means summed in pieces).
_LAYOUT = 5


@dataclass
class CostTable:
    """Weights x choices: stored bytes and estimated damage (inf: the choice cannot take it)."""

    names: list[str]
    counts: list[int]  # elements per weight
    choices: list[str]
    nbytes: list[list[float]]  # [weight][choice]
    damage: list[list[float]]  # what the solver minimises: the estimate, corrected where measured
    fixed_bytes: int = 0  # the program's other tensors, as stored
    seconds: float = 0.0
    cached: list[str] = field(default_factory=list)  # choices read from the cache
    estimate: list[list[float]] = field(default_factory=list)  # the second-order term alone
    measured: list[dict[int, float]] = field(default_factory=list)  # [weight] {choice: trial KL}
    trial_tokens: int = 0  # tokens each trial was measured on (0: none measured)
    trial_seconds: float = 0.0
    sampled: dict[str, float] = field(default_factory=dict)  # weight -> share of its rows estimated on

    def __post_init__(self) -> None:
        """Before any trial: the estimate is the damage, nothing measured."""
        if not self.estimate:
            self.estimate = [list(row) for row in self.damage]
        if not self.measured:
            self.measured = [{} for _ in self.names]

    def column(self, choice: str) -> int:
        return self.choices.index(choice)

    def uniform(self, choice: str) -> tuple[int, float]:
        """(bytes, damage) of one choice on every weight that takes it (the others kept)."""
        k, keep = self.column(choice), self.column("keep")
        total, hurt = 0.0, 0.0
        for w in range(len(self.names)):
            pick = k if math.isfinite(self.damage[w][k]) else keep
            total += self.nbytes[w][pick]
            hurt += self.damage[w][pick]
        return int(total), hurt

    @property
    def elements(self) -> int:
        return sum(self.counts)

    def bits(self, nbytes: float) -> float:
        """Mean bits per weight over the table's weights."""
        return 8.0 * nbytes / max(self.elements, 1)


def cost_table(
    path: Path,
    program: Any,
    choices: tuple[Choice, ...],
    samples: Any,
    *,
    threshold: int,
    trial_tokens: int = 0,
    sample_elements: int = 0,
    device: str | None = None,
    progress: Progress | None = None,
    known: Any = None,
) -> CostTable:
    """Bytes and damage of every choice on every weight some choice compresses, each choice with
    its learned method (`program`: a callable giving the loaded `ExportedProgram`, called only
    when the cache misses): estimated, then for a language model each weight's two smallest
    choices measured on `trial_tokens` calibration tokens (0: estimated only). A weight of more
    than `sample_elements` values (0: none; 16/k of them for a table of k > 16 entries) is
    estimated on a sample of that many values of its row groups where its encoding keeps the rows
    apart (`compression.sampled_trial_encodings`); trials are whole. `known` (a dict, as
    `weights.Known`): statistics of the program on these samples already known (a transform's,
    derived from the ones it measured); the calibration takes only the others. It is emptied once
    the table is made (whether its columns were measured or cached), so nothing the caller holds
    keeps them past their use; the trials keep the sampled weights' (they encode those whole)."""
    from coreai_opt.calibration import Source

    start = time.perf_counter()
    base = _cache.file_digest(path) + samples.digest() + f"|{threshold}|{_LAYOUT}"
    base += f"|rows of {sample_elements}" if sample_elements else ""
    keys = {c.name: _cache.choice_key(base, c, threshold) for c in choices if c.config is not None}
    found: dict[str, dict[str, Any]] = {}
    for name, key in keys.items():
        cached = _column(_cache.entry(key))
        if cached is not None:
            found[name] = cached
    cached_names = list(found)
    missing = [c for c in choices if c.config is not None and c.name not in found]
    trials = trial_tokens > 0 and samples.kind is not Source.RANDOM  # random ids are no text
    loaded = _Loaded(program, samples, device, [c.name for c in choices] if trials else [])
    if missing:
        measured, weights, state, shares = _measure(
            loaded, missing, threshold, sample_elements, known, progress
        )
        for choice in missing:
            found[choice.name] = {"weights": weights, "state_bytes": state, "costs": measured[choice.name],
                                  "sampled": shares[choice.name]}  # fmt: skip
            _cache.write(_cache.entry(keys[choice.name]), found[choice.name])
    table = _assemble(choices, found)
    table.cached = cached_names
    if known is not None:  # read by the estimates, or every column cached: the trials' share, then let go
        loaded.known = loaded.known or _for_trials(known, table.sampled, choices, threshold)
        known.clear()
    if trials:
        from ._trials import measure_anchors

        began = time.perf_counter()
        measure_anchors(table, choices, loaded, keys, trial_tokens, threshold, progress)
        table.trial_seconds = time.perf_counter() - began
    table.seconds = time.perf_counter() - start
    return table


class _Loaded:
    """The program and its calibration, loaded when first asked for and shared by the estimate
    and the trials."""

    def __init__(self, program: Any, samples: Any, device: str | None, order: list[str]) -> None:
        self._program, self.samples, self.device = program, samples, device
        self.order = {name: i for i, name in enumerate(order)}  # empty: nothing kept (no trials)
        self._ep: Any = None
        self._calibration: Any = None
        self.encodings: dict[str, dict[str, Any]] = {}  # weight -> {choice: encoding}, two smallest
        # the sampled weights' statistics, by need: the trials encode those weights whole
        self.known: dict[Any, dict[str, Any]] = {}

    @property
    def ep(self) -> Any:
        if self._ep is None:
            self._ep = self._program()
        return self._ep

    @property
    def calibration(self) -> Any:
        from coreai_opt.calibration import calibrate

        if self._calibration is None:
            self._calibration = calibrate(self.ep, self.samples, device=self.device)
        return self._calibration

    def keep(self, name: str, choice: str, encoding: Any) -> None:
        """Hold a weight's smallest encodings seen, as many as it has anchors (the trials' anchors
        where the smallest choices were encoded in this run; the trials let them go)."""
        from ._trials import ANCHORS

        if not self.order:
            return
        held = self.encodings.setdefault(name, {})
        held[choice] = encoding
        if len(held) > ANCHORS:
            del held[max(held, key=lambda c: (held[c].nbytes, self.order[c]))]


def _assemble(choices: tuple[Choice, ...], found: dict[str, dict[str, Any]]) -> CostTable:
    sizes: dict[str, list[int]] = {}
    for entry in found.values():
        sizes.update(entry["weights"])
    state = _state_bytes(next(iter(found.values())))
    names = [n for n in sizes if any(n in found[c.name]["costs"] for c in choices if c.config is not None)]
    fixed = state - sum(sizes[n][1] for n in names)  # what no choice takes stays as stored
    nbytes, damage = [], []
    for n in names:
        row_bytes, row_damage = [], []
        for c in choices:
            if c.config is None:
                row_bytes.append(float(sizes[n][1]))
                row_damage.append(0.0)
            else:
                entry = found[c.name]["costs"].get(n)
                row_bytes.append(float(entry[0]) if entry else math.inf)
                row_damage.append(float(entry[1]) if entry else math.inf)
        nbytes.append(row_bytes)
        damage.append(row_damage)
    table = CostTable(names, [sizes[n][0] for n in names], [c.name for c in choices], nbytes, damage, fixed)
    for entry in found.values():
        for name, share in entry.get("sampled", {}).items():
            table.sampled[name] = min(share, table.sampled.get(name, 1.0))
    return table


def _measure(
    loaded: _Loaded, choices: list[Choice], threshold: int, sample_elements: int, known: Any,
    progress: Progress | None,
) -> tuple[dict[str, dict[str, list[float]]], dict[str, list[int]], int, dict[str, dict[str, float]]]:  # fmt: skip
    """Each choice's (bytes, estimated damage) per weight - of the whole weight where a sample of
    its rows was encoded; every weight some choice may take, with its (elements, stored bytes);
    the bytes of all the program's tensors; each choice's sampled weights, with the share."""
    from coreai_opt._memory import trim_heap
    from coreai_opt.compression import clusters_shared, container_of, eligible_weights
    from coreai_opt.weights import Needs, statistics_from, stored_nbytes

    ep = loaded.ep
    configs = {c.name: c.config_for(True, threshold) for c in choices}
    sites = {site.name: site for config in configs.values() for site in eligible_weights(ep, config)}
    candidates = container_of(ep).candidates()
    sizes = {  # a tensor stored once for two names counts once
        c.name: [math.prod(c.shape), stored_nbytes(c.shape, c.element)]
        for c in candidates
        if c.tied_to is None and c.name in sites
    }
    state = sum(int(t.numel() * t.element_size()) for t in ep.state_dict.values())
    calibration = loaded.calibration
    taken = {Needs.INPUT_GRAM: statistics_from(calibration, list(sizes), Needs.INPUT_GRAM, known)}
    keep = Needs.GRADIENT_SQUARES in _learned_needs(choices, threshold)  # a learned method reads them again
    gradients, kept = _gradients(calibration, {name: sites[name] for name in sizes}, taken, known, keep)
    if kept is not None:
        taken[Needs.GRADIENT_SQUARES] = kept
    context = _Context(loaded, {**dict(ep.module().named_parameters()), **dict(ep.module().named_buffers())},
                       taken, gradients, sample_elements)  # fmt: skip
    found: dict[str, dict[str, list[float]]] = {}
    shares: dict[str, dict[str, float]] = {}
    with clusters_shared(list(configs.values())):  # lut6 and lut6-q8: one k-means a weight
        for k, choice in enumerate(choices):
            trim_heap()  # what the Fisher pass (about 1 GB at 135M) or the last choice freed: glibc keeps it

            def advance(done: int, name: str, k: int = k, choice: Choice = choice) -> None:
                if progress is not None:
                    progress(min(k * len(sizes) + done, len(choices) * len(sizes)),
                             len(choices) * len(sizes), f"{choice.name} {name}")  # fmt: skip

            found[choice.name], shares[choice.name] = _measure_choice(
                context, choice, configs[choice.name], advance
            )
    sampled = {name for share in shares.values() for name in share}
    loaded.known = _for_trials(taken, sampled, choices, threshold)
    return found, sizes, state, shares


def _learned_needs(choices: Collection[Choice], threshold: int) -> set[Any]:
    """The statistics the choices' learned methods read."""
    from coreai_opt.compression import algorithm_for

    return {algorithm_for(c.config_for(True, threshold)).needs for c in choices if c.config is not None}


def _for_trials(
    statistics: Any, sampled: Collection[str], choices: Collection[Choice], threshold: int
) -> dict[Any, dict[str, Any]]:
    """The sampled weights' statistics of the needs the choices' learned methods have: the trials
    encode those weights whole."""
    from coreai_opt.weights import known_of

    return known_of(statistics, sampled, _learned_needs(choices, threshold))


@dataclass(frozen=True)
class _Gradients:
    """A weight's squared gradients as the estimate reads them: how many tokens they were summed
    over (`rows`), each output row's sum in float64 (None: no squares), and the squares themselves
    only where no input Gram matrix fits (the diagonal estimate reads them one by one)."""

    rows: int
    row_sums: Any = None
    squares: Any = None

    def of_rows(self, sample: Any, site: Any) -> _Gradients:
        """Those of a row sample of the weight at `site`."""
        squares = None if self.squares is None else sample.take(self.squares, site.output_axis)
        return _Gradients(self.rows, self.row_sums[sample.rows.to(self.row_sums.device)], squares)


def _gradients(
    calibration: Any, sites: dict[str, Any], taken: dict[Any, Any], known: Any, keep: bool
) -> tuple[dict[str, _Gradients], Mapping[str, Any] | None]:
    """Every weight's squared gradients as the estimate reads them (`_Gradients`), each weight's
    squares let go as the next come - 135M's together are 0.54 GB - and, where `keep` (a learned
    method reads them again, a weight at a time), kept: on disk where the program runs on the
    host (`kept_squares`), else in memory."""
    from itertools import chain

    from coreai_opt.calibration import kept_squares
    from coreai_opt.compression import MatrixView, gram_fits
    from coreai_opt.weights import Needs

    have = (known or {}).get(Needs.GRADIENT_SQUARES, {})
    missing = [name for name in sites if name not in have]
    found: Any = chain(((name, have[name]) for name in sites if name in have),
                       calibration.sequential(missing, Needs.GRADIENT_SQUARES) if missing else ())  # fmt: skip
    kept: Any = None
    if keep:
        kept = kept_squares(on_disk=calibration.device.type == "cpu")
        found = kept.keeping(found)
    grams, reduced = taken[Needs.INPUT_GRAM], {}
    for name, statistics in found:
        site = sites[name]
        squares = None if statistics is None else statistics.gradient_squares
        if squares is None or tuple(squares.shape) != tuple(site.shape):
            reduced[name] = _Gradients(0 if statistics is None else statistics.rows)
            continue
        diagonal = not gram_fits(grams.get(name), MatrixView.of(site))
        reduced[name] = _Gradients(
            statistics.rows, _row_mass(squares, site.output_axis), squares if diagonal else None
        )
    return reduced, kept


@dataclass
class _Context:
    """What every choice's column is measured against: the program and calibration, its weights
    as given, their statistics the learned methods read (by need) and their squared gradients as
    the estimate reads them, and the estimate's sample size."""

    loaded: _Loaded
    weights: dict[str, Any]
    taken: dict[Any, dict[str, Any]]
    gradients: dict[str, _Gradients]
    sample_elements: int


def _measure_choice(
    context: _Context, choice: Choice, config: Any, advance: Callable[[int, str], None]
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """One choice's (bytes, estimated damage) per weight it takes, and its sampled weights' shares;
    `advance(weights done, name)` after each weight."""
    from coreai_opt.compression import sampled_trial_encodings
    from coreai_opt.weights import Needs, Skipped

    loaded = context.loaded
    per_sample = len(loaded.calibration.inputs)
    costs: dict[str, list[float]] = {}
    shares: dict[str, float] = {}
    encodings = sampled_trial_encodings(
        loaded.ep, config, loaded.calibration, elements=context.sample_elements, known=context.taken
    )
    gradients, grams = context.gradients, context.taken[Needs.INPUT_GRAM]
    for done, (site, outcome, sample) in enumerate(encodings, 1):
        advance(done, site.name)
        if isinstance(outcome, Skipped):
            continue
        costs[site.name] = _cost(
            site, context.weights[site.name], outcome, sample, gradients, grams, per_sample
        )
        if sample is None:  # the trials take whole encodings: a sample's they make again
            loaded.keep(site.name, choice.name, outcome)
        else:
            shares[site.name] = sample.share
    return costs, shares


def _cost(
    site: Any, weight: Any, outcome: Any, sample: Any, gradients: dict[str, _Gradients], grams: Any,
    per_sample: int,
) -> list[float]:  # fmt: skip
    """[bytes, estimated damage] of the whole weight from the encoding of it or of its `sample`
    of rows: then the sample's damage over its share of the weight's squared gradients (each row's
    error is its own, and a vocabulary's rows matter as unevenly as its tokens are frequent), or of
    its rows where there are none."""
    import torch

    from coreai_opt.weights import decode, nbytes_for_rows

    w = weight.detach()
    found = gradients.get(site.name)
    if sample is None:
        nbytes, share = outcome.nbytes, 1.0
    else:
        nbytes = nbytes_for_rows(outcome.form, len(sample.rows), sample.of)
        share = _share(sample, found)
        w = sample.take(w, site.output_axis)
        found = None if found is None or found.row_sums is None else found.of_rows(sample, site)
        site = sample.site(site)
    w = w.to("cpu", torch.float64)  # the damage is taken on the host
    delta = decode(outcome).to("cpu", torch.float64) - w  # the weight or its encoding may be on a GPU
    return [nbytes, _damage(site, w, delta, found, grams.get(site.name), per_sample, share)]


def _share(sample: Any, gradients: _Gradients | None) -> float:
    """The sample's share of the weight's squared gradients (of its rows without them)."""
    if gradients is None or gradients.row_sums is None:
        return float(sample.share)
    mass = gradients.row_sums
    total = float(mass.sum())
    return float(mass[sample.rows.to(mass.device)].sum()) / total if total > 0 else float(sample.share)


def _row_mass(squares: Any, output_axis: int) -> Any:
    """Each output row's sum of squared gradients in float64, a piece of rows at a time: a float64
    copy of the whole was the estimate's peak at 135M (the tied embedding's: 226 MB)."""
    import torch

    from coreai_opt._pieces import PIECE

    axes = [a for a in range(squares.dim()) if a != output_axis]
    if not axes:
        return squares.double()
    count = squares.shape[output_axis]
    step = max(1, PIECE * count // max(1, squares.numel()))
    pieces = (squares.narrow(output_axis, a, min(step, count - a)) for a in range(0, count, step))
    return torch.cat([piece.double().sum(dim=axes) for piece in pieces])


def _damage(
    site: Any,
    w: Any,
    delta: Any,
    gradients: _Gradients | None,
    inputs: Any,
    per_sample: int,
    share: float = 1.0,
) -> float:
    """1/2 dW F dW per token, F the Fisher information in Kronecker form (K-FAC): per output
    channel j, the mean squared gradient of the loss at the layer's output, S_j, times the
    consumer's input Gram matrix G - so an error that GPTQ steered to where the inputs do not
    reach costs what it costs, not its energy: 1/2 sum_j S_j dW_j G dW_j^T. S_j is read off the
    squared weight gradients' row sums (F_ij ~ T S_j G_ii over T tokens a window). Without a Gram
    that fits (an embedding lookup) the diagonal 1/2 sum F dW^2; without gradients, the relative
    error. `w` and `delta` may be a `share` of the weight's rows: the sums are then over that share."""
    from coreai_opt.compression import MatrixView, gram_of

    if gradients is None or gradients.row_sums is None or not gradients.rows:
        return float(delta.square().sum() / max(float(w.square().sum()), 1e-30))  # no path to the loss
    tokens = gradients.rows / per_sample
    view = MatrixView.of(site)
    gram = gram_of(inputs, view)
    if gram is None:
        squares = gradients.squares.cpu().double()
        return float(0.5 * (squares * delta.square()).sum() / tokens / share)
    gram = gram.cpu()
    d = view.matrix(delta)
    per_channel = gradients.row_sums.cpu() / (tokens * max(float(gram.diagonal().sum()), 1e-300))
    return float(0.5 * (per_channel * ((d @ gram) * d).sum(1)).sum() / share)


def _column(path: Path) -> dict[str, Any] | None:
    data = _cache.read(path)
    ok = data is not None and {"weights", "costs"} <= set(data)
    return data if ok and ({"state_bytes", "fixed_bytes"} & set(data)) else None  # type: ignore[operator]


def _state_bytes(entry: dict[str, Any]) -> int:
    """All the program's tensor bytes (first files kept the part no weight took, `fixed_bytes`)."""
    if "state_bytes" in entry:
        return int(entry["state_bytes"])
    return int(entry["fixed_bytes"]) + sum(size[1] for size in entry["weights"].values())
