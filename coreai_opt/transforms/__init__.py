"""Transforms that change the program around its weights and keep what it computes.

A transform is an equivalence-preserving edit of a `torch.export` program: folding a norm's
scale into the linears that read it (`FoldNormsConfig`), and - next - rotations of the residual
stream and channel scaling, which make every weight format lose less. Each is a config
(`TransformConfig`: frozen, serialisable, versioned), a module that edits the program, and a line
in the registry (`register_transform`); `transform_(program, config)` runs it and checks the
result against the original on seeded inputs before keeping it - beyond the config's
`tolerance`, the program is restored and `TransformError` names the difference. A recipe's
`transform` step runs one before its compress steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._config import CONFIG_VERSION, FoldNormsConfig, TransformConfig
from ._equivalence import Equivalence, TransformError
from ._registry import (
    BUILT_IN,
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
    "Equivalence",
    "FoldNormsConfig",
    "Transform",
    "TransformConfig",
    "TransformError",
    "TransformReport",
    "register_transform",
    "transform_",
    "transform_for",
    "transform_from_dict",
    "transform_types",
    "unregister_transform",
]


@dataclass
class TransformReport:
    """What a transform changed (a line each) and how closely the result reproduces the original."""

    kind: str
    changes: list[str] = field(default_factory=list)
    equivalence: Equivalence | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "changes": list(self.changes),
                "equivalence": self.equivalence.to_dict() if self.equivalence else None}  # fmt: skip


def transform_(program: Any, config: TransformConfig) -> TransformReport:
    """Transform `program` (a `torch.export` program) in place as `config` says, checked against
    its own outputs on `config.samples` seeded inputs; `TransformError` (the program unchanged)
    when the result differs by more than `config.tolerance`."""
    from ._equivalence import compare, outputs, seeded_inputs

    edit = transform_for(config).function()
    inputs = seeded_inputs(program, config.samples)
    before = outputs(program, inputs)
    state = dict(program.state_dict)  # edits replace tensors, never write into them: this restores
    report = TransformReport(config.KIND, edit(program, config))
    report.equivalence = compare(before, outputs(program, inputs))
    if not report.equivalence.relative_rms <= config.tolerance:
        program.state_dict.clear()
        program.state_dict.update(state)
        raise TransformError(
            f"{config.KIND} would change the program's outputs by {report.equivalence.relative_rms:.3g} "
            f"(relative RMS; tolerance {config.tolerance:g}): not applied"
        )
    return report
