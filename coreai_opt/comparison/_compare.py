"""`coreopt compare`: run a reference and a candidate on the same samples and measure agreement."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from coreai_opt._agreement import Agreement, agreement, mean_of, worst_of
from coreai_opt._coreai import AssetWorker, RunResult, TensorSpec, run_in
from coreai_opt.compression import Progress
from coreai_opt.errors import ConfigError
from coreai_opt.inputs import (
    Draw,
    InputRule,
    InputSpec,
    Kind,
    Usage,
    input_rules,
    read_input_samples,
    seeded_samples,
    seeded_source,
)
from coreai_opt.io import (
    ModelFileError,
    ModelFormat,
    model_format,
    require_existing,
    verify_aimodel,
    worker_errors,
)

from ._torch import ExportedSide

_FORMATS = (ModelFormat.AIMODEL, ModelFormat.PT2)


@dataclass(frozen=True)
class SampleSpread:
    """How one output's agreement spreads over the samples (its metrics are the worst sample's)."""

    count: int
    cosine_mean: float | None  # None when a sample measured nothing
    snr_db_mean: float | None  # math.inf when every sample agrees exactly
    worst: str  # the sample with the lowest cosine (or the first that measured nothing)

    def to_dict(self) -> dict[str, Any]:
        snr = self.snr_db_mean
        return {"samples": self.count, "cosine_mean": self.cosine_mean,
                "snr_db_mean": None if snr is None or math.isinf(snr) else snr,
                "worst_sample": self.worst}  # fmt: skip


@dataclass(frozen=True)
class OutputComparison:
    name: str  # the reference's output name
    candidate_name: str
    shape: tuple[int, ...]
    dtype: str  # reference dtype -> candidate dtype when they differ
    metrics: Agreement  # each metric at its worst over the samples
    spread: SampleSpread
    ok: bool | None  # None when no --min-cosine was asked for

    def to_dict(self) -> dict[str, Any]:
        head = {"name": self.name, "candidate_name": self.candidate_name, "shape": list(self.shape)}
        return head | {"dtype": self.dtype} | self.metrics.to_dict() | self.spread.to_dict() | {"ok": self.ok}


@dataclass
class ComparisonResult:
    reference: Path
    candidate: Path
    inputs_source: str
    inputs: tuple[TensorSpec, ...]
    min_cosine: float | None
    rules: list[InputRule] = field(default_factory=list)  # how each input was drawn
    samples: list[str] = field(default_factory=list)  # each sample's label, in the order run
    outputs: list[OutputComparison] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool | None:
        """True/False against --min-cosine (every sample); None when no threshold was given."""
        if self.min_cosine is None:
            return None
        return all(o.ok for o in self.outputs)

    @property
    def worst_cosine(self) -> float | None:
        """The lowest cosine over outputs and samples; None when any was not measured."""
        return _lowest([o.metrics.cosine for o in self.outputs])

    @property
    def worst_snr_db(self) -> float | None:
        """The lowest SNR over outputs and samples; None when any was not measured."""
        return _lowest([o.metrics.snr_db for o in self.outputs])

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": str(self.reference),
            "candidate": str(self.candidate),
            "inputs_source": self.inputs_source,
            "inputs": [s.to_dict() for s in self.inputs],
            "input_policy": [r.to_dict() for r in self.rules],
            "samples": self.samples,
            "min_cosine": self.min_cosine,
            "ok": self.ok,
            "worst_cosine": self.worst_cosine,
            "seconds": round(self.seconds, 4),
            "outputs": [o.to_dict() for o in self.outputs],
        }


def _lowest(values: list[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else min(values)  # type: ignore[type-var]


def _pair_outputs(
    reference: tuple[TensorSpec, ...], candidate: tuple[TensorSpec, ...], path: Path
) -> list[tuple[TensorSpec, TensorSpec]]:
    """Outputs pair up by name; when the names differ (a re-export renames them), by position."""
    if len(reference) != len(candidate):
        raise ModelFileError(path, f"has {len(candidate)} outputs; the reference has {len(reference)}")
    by_name = {s.name: s for s in candidate}
    if all(s.name in by_name for s in reference):
        pairs = [(s, by_name[s.name]) for s in reference]
    else:
        pairs = list(zip(reference, candidate, strict=True))
    for ref, cand in pairs:
        if ref.shape != cand.shape:
            raise ModelFileError(
                path, f"output {cand.name} has shape {list(cand.shape)}; the reference's {ref.name} has "
                f"{list(ref.shape)}"
            )  # fmt: skip
    return pairs


class _AssetSide:
    """An `.aimodel` lowered once in its worker and run once per sample."""

    def __init__(self, path: Path, worker: AssetWorker) -> None:
        self.path = path
        self.worker = worker
        with worker_errors(path):
            self.inputs, _ = worker.signature()

    def run(self, arrays: dict[str, np.ndarray]) -> RunResult:
        with worker_errors(self.path):
            try:
                return run_in(self.worker, lambda _specs: arrays)
            except ValueError as exc:
                raise ModelFileError(self.path, str(exc)) from None


Side = _AssetSide | ExportedSide


def open_side(path: Path, trust_pickle: bool, stack: contextlib.ExitStack, device: str | None = None) -> Side:
    """A model ready to run on samples: a `.pt2` in PyTorch (on `device` when given), an `.aimodel`
    in its runtime worker (closed with `stack`)."""
    if model_format(path, _FORMATS) is ModelFormat.PT2:
        return ExportedSide(path, trust_pickle, device)
    worker = stack.enter_context(AssetWorker(path))
    verify_aimodel(path, worker)
    return _AssetSide(path, worker)


def _wanted(side: Side) -> list[InputSpec]:
    return [InputSpec(s.name, Kind.of(s.dtype), s.shape) for s in side.inputs]


def _drawn(
    side: Side, seeds: range, int_range: tuple[int, int] | None
) -> tuple[Iterator[tuple[str, dict[str, np.ndarray]]], list[InputRule]]:
    """Seeded samples drawn by the input policy from what the reference program does with each
    input (its FX graph for a `.pt2`, its Core AI program for an `.aimodel`)."""
    if isinstance(side, ExportedSide):
        specs, rules = side.rules(int_range)
    else:
        from coreai_opt import _coreai
        from coreai_opt.io import load_aimodel

        specs = _wanted(side)
        found = _coreai.input_usage(_coreai.mlir_module(load_aimodel(side.path)))
        usage = {name: Usage(rows, arithmetic) for name, (rows, arithmetic) in found.items()}
        rules = input_rules(specs, usage, int_range)
    return seeded_samples(specs, rules, seeds), rules


def _from_files(
    side: Side, inputs: Path
) -> tuple[int, Iterator[tuple[str, dict[str, np.ndarray]]], list[InputRule]]:
    """The samples of the user's safetensors file or directory, checked against the reference."""
    wanted = _wanted(side)
    samples = read_input_samples(inputs, wanted)
    rules = [InputRule(s.name, Draw.FILE, reason=str(inputs)) for s in wanted]
    arrays = ((label, {n: _numpy(t) for n, t in sample.items()}) for label, sample in samples)
    return samples.count, arrays, rules


def _numpy(tensor: Any) -> np.ndarray:
    """A file's tensor as numpy (bfloat16, which numpy lacks, as float32)."""
    import torch

    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.numpy()


def _fits(path: Path, arrays: dict[str, np.ndarray], specs: tuple[TensorSpec, ...]) -> None:
    """Integer inputs must fit the dtype the model takes (int64 ids become int32 inputs)."""
    for spec in specs:
        value = arrays[spec.name]
        if np.issubdtype(spec.dtype, np.integer) and value.size:
            info = np.iinfo(spec.dtype)
            if value.min() < info.min or value.max() > info.max:
                raise ModelFileError(path, f"input {spec.name} has values outside {spec.dtype.name}")


def compare_files(reference: Path | str, candidate: Path | str, **options: Any) -> ComparisonResult:
    """Run both models on the same samples: `compare_many` with one candidate (the same keyword
    options)."""
    return compare_many(reference, [candidate], **options)[0]


def compare_many(
    reference: Path | str,
    candidates: list[Path | str] | tuple[Path | str, ...],
    *,
    inputs: Path | str | None = None,
    samples: int = 1,
    seed: int = 0,
    int_range: tuple[int, int] | None = None,
    min_cosine: float | None = None,
    trust_pickle: bool = False,
    progress: Progress | None = None,
) -> list[ComparisonResult]:
    """Run the reference and every candidate on the same samples; per output cosine, SNR and max
    error, each at its worst over the samples, with the mean cosine and SNR beside them.

    An `.aimodel` runs on the Core AI runtime (lowered once), a `.pt2` in PyTorch (its compressed
    weights decoded once), in any mix. `inputs` names a safetensors file (one sample, or several
    along a leading axis) or a directory of them; without it, `samples` seeded draws of the input
    policy (`coreai_opt.inputs`; seeds `seed`, `seed + 1`, ...), with every integer input from
    [low, high) when `int_range` is given. Inputs follow the reference's descriptors and are
    converted to each model's own input dtypes, so an fp16 candidate can be compared with its fp32
    reference. The reference runs once per sample (its outputs are kept): n candidates cost 1 + n
    runs per sample, not 2n. `progress(done, total, label)` is called after each model run; one
    `ComparisonResult` per candidate, in order.
    """
    reference, paths = Path(reference), [Path(c) for c in candidates]
    _check_options(paths, min_cosine, samples, inputs)
    start = time.perf_counter()
    for path in (reference, *paths):
        require_existing(path)
        model_format(path, _FORMATS)
    with contextlib.ExitStack() as stack:
        ref_side = open_side(reference, trust_pickle, stack)
        if inputs is not None:
            total, sampled, rules = _from_files(ref_side, Path(inputs))
            label, blame = str(inputs), Path(inputs)
        else:
            seeds = range(seed, seed + samples)
            sampled, rules = _drawn(ref_side, seeds, int_range)
            total, blame, label = samples, reference, seeded_source(seeds)
        runs = total * (1 + len(paths))
        ref_runs: list[tuple[str, dict[str, np.ndarray], RunResult]] = []
        for name, arrays in sampled:
            _fits(blame, arrays, ref_side.inputs)
            ref_runs.append((name, arrays, ref_side.run(arrays)))
            if progress is not None:
                progress(len(ref_runs), runs, f"{reference.name} {name}")
    shared = time.perf_counter() - start
    results = []
    for index, candidate in enumerate(paths):
        begun = time.perf_counter()
        result = ComparisonResult(
            reference, candidate, label, ref_side.inputs, min_cosine, rules, [name for name, _, _ in ref_runs]
        )
        counted = _Counted(progress, runs, total * (1 + index))
        _candidate(result, ref_side, ref_runs, blame, trust_pickle, counted)
        result.seconds = shared + time.perf_counter() - begun
        results.append(result)
    return results


def _check_options(paths: list[Path], min_cosine: float | None, samples: int, inputs: object) -> None:
    if not paths:
        raise ValueError("give at least one candidate")
    if min_cosine is not None and not -1.0 <= min_cosine <= 1.0:
        raise ConfigError(f"min_cosine {min_cosine} is not in [-1, 1]", "min_cosine")
    if samples < 1:
        raise ConfigError(f"samples must be 1 or more, not {samples}", "samples")
    if inputs is not None and samples != 1:
        raise ValueError("give inputs or a number of random samples, not both")


@dataclass
class _Counted:
    """Progress over every model run of a comparison, from `done` on."""

    progress: Progress | None
    total: int
    done: int

    def step(self, label: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total, label)


def _candidate(
    result: ComparisonResult,
    ref_side: Any,
    ref_runs: list[tuple[str, dict[str, np.ndarray], RunResult]],
    blame: Path,
    trust_pickle: bool,
    counted: _Counted,
) -> None:
    """Run one candidate on every sample the reference ran on; fill `result`'s outputs."""
    candidate = result.candidate
    with contextlib.ExitStack() as stack:
        cand_side = open_side(candidate, trust_pickle, stack)
        names, cand_names = sorted(s.name for s in ref_side.inputs), sorted(s.name for s in cand_side.inputs)
        if names != cand_names:
            raise ModelFileError(
                candidate, f"takes inputs {', '.join(cand_names)}; the reference takes {', '.join(names)}"
            )
        per_output: list[list[Agreement]] = []
        pairs: list[tuple[TensorSpec, TensorSpec]] = []
        for name, arrays, ref_run in ref_runs:
            _fits(blame, arrays, cand_side.inputs)
            cand_run = cand_side.run(arrays)
            if not pairs:
                pairs = _pair_outputs(ref_run.outputs, cand_run.outputs, candidate)
                per_output = [[] for _ in pairs]
            for found, (ref, cand) in zip(per_output, pairs, strict=True):
                found.append(agreement(ref_run.values[ref.name], cand_run.values[cand.name]))
            counted.step(f"{candidate.name} {name}")
    for found, (ref, cand) in zip(per_output, pairs, strict=True):
        metrics = worst_of(found)
        ok = metrics.passes(result.min_cosine) if result.min_cosine is not None else None
        dtype = ref.dtype.name if ref.dtype == cand.dtype else f"{ref.dtype.name} -> {cand.dtype.name}"
        spread = _spread(found, result.samples)
        result.outputs.append(OutputComparison(ref.name, cand.name, ref.shape, dtype, metrics, spread, ok))


def _spread(found: list[Agreement], labels: list[str]) -> SampleSpread:
    cosines = [a.cosine for a in found]
    measured = [(c, i) for i, c in enumerate(cosines) if c is not None]
    worst = labels[cosines.index(None)] if None in cosines else labels[min(measured)[1]]
    return SampleSpread(len(found), mean_of(cosines), mean_of([a.snr_db for a in found]), worst)
