"""`coreopt compare`: run a reference and a candidate asset on the same inputs and measure agreement."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from coreai_opt._agreement import Agreement, agreement
from coreai_opt._coreai._runtime import RunResult, TensorSpec, run_in
from coreai_opt._coreai._sandbox import AssetWorker
from coreai_opt.inputs import (
    Draw,
    InputRule,
    InputSpec,
    Kind,
    Usage,
    draw_inputs,
    input_rules,
    read_inputs_file,
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
class OutputComparison:
    name: str  # the reference's output name
    candidate_name: str
    shape: tuple[int, ...]
    dtype: str  # reference dtype -> candidate dtype when they differ
    metrics: Agreement
    ok: bool | None  # None when no --min-cosine was asked for

    def to_dict(self) -> dict[str, Any]:
        head = {"name": self.name, "candidate_name": self.candidate_name, "shape": list(self.shape)}
        return head | {"dtype": self.dtype} | self.metrics.to_dict() | {"ok": self.ok}


@dataclass
class ComparisonResult:
    reference: Path
    candidate: Path
    inputs_source: str
    inputs: tuple[TensorSpec, ...]
    min_cosine: float | None
    rules: list[InputRule] = field(default_factory=list)  # how each input was drawn
    outputs: list[OutputComparison] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool | None:
        """True/False against --min-cosine; None when no threshold was given."""
        if self.min_cosine is None:
            return None
        return all(o.ok for o in self.outputs)

    @property
    def worst_cosine(self) -> float | None:
        """The lowest cosine over the outputs; None when any output was not measured."""
        cosines = [o.metrics.cosine for o in self.outputs]
        return None if not cosines or any(c is None for c in cosines) else min(cosines)  # type: ignore[type-var]

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": str(self.reference),
            "candidate": str(self.candidate),
            "inputs_source": self.inputs_source,
            "inputs": [s.to_dict() for s in self.inputs],
            "input_policy": [r.to_dict() for r in self.rules],
            "min_cosine": self.min_cosine,
            "ok": self.ok,
            "worst_cosine": self.worst_cosine,
            "seconds": round(self.seconds, 4),
            "outputs": [o.to_dict() for o in self.outputs],
        }


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


def _run(path: Path, worker: AssetWorker, inputs_for: Any) -> RunResult:
    """Run a verified asset in its worker; every failure names the asset."""
    with worker_errors(path):
        try:
            return run_in(worker, inputs_for)
        except ValueError as exc:
            raise ModelFileError(path, str(exc)) from None


def _policy_inputs(
    reference: Path,
    specs: tuple[TensorSpec, ...],
    inputs: Path | str | None,
    seed: int,
    int_range: tuple[int, int] | None,
) -> tuple[dict[str, np.ndarray], list[InputRule]]:
    """Inputs for the reference's descriptors: from the file, or drawn by the input policy from
    what the (verified) reference program does with each input."""
    wanted = [InputSpec(s.name, Kind.of(s.dtype), s.shape) for s in specs]
    if inputs is not None:
        given = read_inputs_file(inputs, wanted)
        arrays = {name: _numpy(tensor) for name, tensor in given.items()}
        return arrays, [InputRule(s.name, Draw.FILE, reason=str(inputs)) for s in wanted]
    from coreai_opt import _coreai
    from coreai_opt.io import load_aimodel

    found = _coreai.input_usage(_coreai.mlir_module(load_aimodel(reference)))
    usage = {name: Usage(rows, arithmetic) for name, (rows, arithmetic) in found.items()}
    rules = input_rules(wanted, usage, int_range)
    return draw_inputs(wanted, rules, seed), rules


def _numpy(tensor: Any) -> np.ndarray:
    """A file's tensor as numpy (bfloat16, which numpy lacks, as float32)."""
    import torch

    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.numpy()


def _fits(path: Path, arrays: dict[str, np.ndarray], specs: tuple[TensorSpec, ...]) -> None:
    """Integer inputs must fit the dtype the runtime takes (int64 ids become int32 inputs)."""
    for spec in specs:
        value = arrays[spec.name]
        if np.issubdtype(spec.dtype, np.integer) and value.size:
            info = np.iinfo(spec.dtype)
            if value.min() < info.min or value.max() > info.max:
                raise ModelFileError(path, f"input {spec.name} has values outside {spec.dtype.name}")


def compare_files(
    reference: Path | str,
    candidate: Path | str,
    *,
    inputs: Path | str | None = None,
    seed: int = 0,
    int_range: tuple[int, int] | None = None,
    min_cosine: float | None = None,
    trust_pickle: bool = False,
) -> ComparisonResult:
    """Run both models on the same inputs; per output cosine, SNR, max error.

    An `.aimodel` runs on the Core AI runtime, a `.pt2` in PyTorch (its compressed weights decoded
    once), in any mix. Inputs follow the reference's descriptors (`coreai_opt.inputs` draws them, or
    `inputs` names a safetensors file) and are converted to each model's own input dtypes, so an
    fp16 candidate can be compared with its fp32 reference. `int_range` draws every integer input
    from [low, high).
    """
    reference, candidate = Path(reference), Path(candidate)
    if min_cosine is not None and not -1.0 <= min_cosine <= 1.0:
        raise ValueError(f"min_cosine {min_cosine} is not in [-1, 1]")
    start = time.perf_counter()
    chosen: dict[str, np.ndarray] = {}
    rules: list[InputRule] = []
    label = str(inputs) if inputs is not None else f"seeded random (seed {seed})"

    def reference_inputs(specs: tuple[TensorSpec, ...]) -> dict[str, np.ndarray]:
        made, drawn_by = _policy_inputs(reference, specs, inputs, seed, int_range)
        _fits(Path(inputs) if inputs is not None else reference, made, specs)
        chosen.update(made)
        rules.extend(drawn_by)
        return made

    def candidate_inputs(
        specs: tuple[TensorSpec, ...], side: ExportedSide | None = None
    ) -> dict[str, np.ndarray]:
        names = sorted(s.name for s in specs)
        if names != sorted(chosen):
            raise ModelFileError(
                candidate, f"takes inputs {', '.join(names)}; the reference takes {', '.join(sorted(chosen))}"
            )
        return chosen

    def run_side(path: Path, inputs_for: Any, stack: contextlib.ExitStack) -> RunResult:
        if model_format(path, _FORMATS) is ModelFormat.PT2:
            side = ExportedSide(path, trust_pickle)
            return side.run(dict(inputs_for(side.inputs, side)))
        worker = stack.enter_context(AssetWorker(path))
        verify_aimodel(path, worker)
        return _run(path, worker, inputs_for)

    def reference_from(
        specs: tuple[TensorSpec, ...], side: ExportedSide | None = None
    ) -> dict[str, np.ndarray]:
        if side is not None and inputs is None:  # a .pt2: the policy reads its FX graph
            made, drawn_by = side.draw(seed, int_range)
            chosen.update(made)
            rules.extend(drawn_by)
            return made
        return reference_inputs(specs)

    for path in (reference, candidate):
        require_existing(path)
        model_format(path, _FORMATS)
    with contextlib.ExitStack() as stack:
        ref_run = run_side(reference, reference_from, stack)
        cand_run = run_side(candidate, candidate_inputs, stack)
    result = ComparisonResult(reference, candidate, label, ref_run.inputs, min_cosine, rules)
    for ref, cand in _pair_outputs(ref_run.outputs, cand_run.outputs, candidate):
        metrics = agreement(ref_run.values[ref.name], cand_run.values[cand.name])
        ok = metrics.passes(min_cosine) if min_cosine is not None else None
        dtype = ref.dtype.name if ref.dtype == cand.dtype else f"{ref.dtype.name} -> {cand.dtype.name}"
        result.outputs.append(OutputComparison(ref.name, cand.name, ref.shape, dtype, metrics, ok))
    result.seconds = time.perf_counter() - start
    return result
