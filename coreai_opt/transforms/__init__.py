"""Transforms that change the program around its weights and keep what it computes.

A transform is an equivalence-preserving edit of a `torch.export` program: folding a norm's
scale into the linears that read it (`FoldNormsConfig`) and rotating a decoder's residual stream
by an orthogonal matrix folded into its weights (`RotateConfig`; the matrices: `rotation_matrix`,
`hadamard_matrix`), which makes weight formats lose less where weights have outlier channels, and
per-channel scales searched on calibration data (`ScaleConfig`, AWQ). Each is a config
(`TransformConfig`: frozen, serialisable, versioned), a module that edits the program, and a line
in the registry (`register_transform`); `transform_(program, config)` runs it and checks the
result against the original on seeded inputs before keeping it - beyond the config's
`tolerance`, the program is restored and `TransformError` names the difference. A recipe's
`transform` step runs one before its compress steps.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from ._config import (
    CONFIG_VERSION,
    ROTATIONS,
    SCALINGS,
    FoldNormsConfig,
    RotateConfig,
    ScaleConfig,
    TransformConfig,
    default_tolerance,
)
from ._equivalence import Equivalence, TransformError
from ._orthogonal import hadamard_matrix, largest_hadamard_factor, rotation_matrix
from ._registry import (
    BUILT_IN,
    Edited,
    Transform,
    register_transform,
    transform_for,
    transform_from_dict,
    transform_types,
    unregister_transform,
)

__all__ = [
    "BUILT_IN",
    "CONFIG_VERSION",
    "ROTATIONS",
    "SCALINGS",
    "Edited",
    "Equivalence",
    "FoldNormsConfig",
    "RotateConfig",
    "ScaleConfig",
    "Transform",
    "TransformConfig",
    "TransformError",
    "TransformReport",
    "default_tolerance",
    "hadamard_matrix",
    "largest_hadamard_factor",
    "register_transform",
    "rotation_matrix",
    "rotation_problem",
    "transform_",
    "transform_for",
    "transform_from_dict",
    "transform_types",
    "unregister_transform",
]


@dataclass
class TransformReport:
    """What a transform changed (a line each) and how closely the result reproduces the original;
    for one that learned from data, the result's statistics on its calibration samples that follow
    from what it measured (`known`, a `weights.Known`; `samples_digest`, the samples') - not
    recorded."""

    kind: str
    changes: list[str] = field(default_factory=list)
    equivalence: Equivalence | None = None
    known: Any = None
    samples_digest: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "changes": list(self.changes),
                "equivalence": self.equivalence.to_dict() if self.equivalence else None}  # fmt: skip


def rotation_problem(program: Any) -> str | None:
    """Why `program`'s residual stream cannot be rotated (one line), or None where it can: what
    `RotateConfig` meets, known from the graph alone, before any weight is read or run."""
    from ._stream import NotAStream, trace_stream

    try:
        trace_stream(program)
    except NotAStream as why:
        return str(why)
    return None


def _page_out_replaced(before: dict[str, Any], after: dict[str, Any]) -> None:
    """The weights a transform replaced, as read from the program's file, leave the resident set
    (read again from the file only if the program is restored): a 1.1B program is not held twice."""
    from coreai_opt._memory import page_out_mapped

    kept = {id(value) for value in after.values()}
    page_out_mapped(
        [value.data_ptr() for value in before.values() if id(value) not in kept and not value.is_cuda]
    )


def transform_(
    program: Any, config: TransformConfig, calibration: Any = None, progress: Any = None
) -> TransformReport:
    """Transform `program` (a `torch.export` program) in place as `config` says, checked against
    its own outputs on `config.samples` seeded inputs; `TransformError` (the program unchanged)
    when the result differs by more than `config.tolerance`. A transform that learns from data
    (`config.learns()`) reads `calibration` (`coreai_opt.calibration.calibrate(program, ...)`) and
    reports its steps to `progress(done, total, label)` when given."""
    from ._equivalence import compare, original_outputs, seeded_inputs, transformed_outputs
    from ._graph import Snapshot

    edit = transform_for(config).function()
    if config.learns() and calibration is None:
        raise TransformError(f"{config.KIND} learns from data: give it a calibration")
    arguments = (program, config, calibration) if config.learns() else (program, config)
    reporting = {"progress": progress} if "progress" in inspect.signature(edit).parameters else {}
    inputs = seeded_inputs(program, config.samples)
    device = getattr(calibration, "device", None)  # the check runs where the calibration does
    before, exact = original_outputs(program, inputs, device)
    snapshot = Snapshot(program)
    try:
        edited = edit(*arguments, **reporting)
        if not isinstance(edited, Edited):
            edited = Edited(edited)
        report = TransformReport(
            config.KIND, edited.lines, known=edited.known, samples_digest=edited.samples_digest
        )
        _page_out_replaced(snapshot.state, program.state_dict)
        report.equivalence = compare(before, transformed_outputs(program, inputs, device, exact), exact)
    except BaseException:
        snapshot.restore()
        raise
    tolerance = config.tolerance if config.tolerance is not None else default_tolerance(snapshot.state)
    if not report.equivalence.relative_rms <= tolerance:
        snapshot.restore()
        raise TransformError(
            f"{config.KIND} would change the program's outputs by {report.equivalence.relative_rms:.3g} "
            f"(relative RMS; tolerance {tolerance:.3g}): not applied"
        )
    return report
