"""Does the cast program still compute what the original did? Run both on the same inputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from coreai_opt._agreement import Agreement, agreement
from coreai_opt.inputs import (
    Draw,
    InputRule,
    drawn_inputs,
    exported_program_specs,
    read_inputs_file,
    seeded_source,
)

from . import _graph as g
from ._overflow import Overflow, first_overflows
from ._program import user_inputs

COSINE_MIN = 0.999  # fp16 keeps ~3 decimal digits; a healthy cast agrees far better than this
RELATIVE_MAX = 0.05  # max abs error over the output's max magnitude


@dataclass(frozen=True)
class OutputAgreement:
    name: str
    dtype_before: str
    dtype_after: str
    metrics: Agreement
    ok: bool

    @property
    def max_abs_error(self) -> float | None:
        return self.metrics.max_abs_error

    @property
    def relative_error(self) -> float | None:
        return self.metrics.relative_error

    @property
    def cosine(self) -> float | None:
        return self.metrics.cosine

    def to_dict(self) -> dict[str, Any]:
        head = {"name": self.name, "dtype_before": self.dtype_before, "dtype_after": self.dtype_after}
        return head | self.metrics.to_dict() | {"ok": self.ok}


@dataclass
class CheckResult:
    inputs: str  # where the inputs came from
    rules: list[InputRule] = field(default_factory=list)  # how each input was drawn
    outputs: list[OutputAgreement] = field(default_factory=list)
    overflows: list[Overflow] = field(default_factory=list)  # ops whose fp16 values overflow

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": self.inputs,
            "input_policy": [r.to_dict() for r in self.rules],
            "ok": self.ok,
            "outputs": [o.to_dict() for o in self.outputs],
            "overflows": [o.to_dict() for o in self.overflows],
        }


def check_inputs(
    ep: ExportedProgram, path: Path | str | None = None, seed: int = 0
) -> tuple[list[torch.Tensor], str, list[InputRule]]:
    """The check's inputs in the program's input order, where they came from, and how each was drawn."""
    specs = exported_program_specs(ep)
    if path is not None:
        given = read_inputs_file(path, specs)
        rules = [InputRule(s.name, Draw.FILE, reason=str(path)) for s in specs]
        return [given[s.name] for s in specs], str(path), rules
    tensors, rules = drawn_inputs(ep, seed)
    return tensors, seeded_source(range(seed, seed + 1)), rules


def random_inputs(ep: ExportedProgram, seed: int = 0) -> list[torch.Tensor]:
    """Inputs drawn by the input policy (`coreai_opt.inputs`), in the program's input order."""
    return check_inputs(ep, None, seed)[0]


def _leaves(value: Any) -> list[Any]:
    import torch.utils._pytree as pytree

    return pytree.tree_leaves(value)


def compare_programs(
    original: ExportedProgram,
    cast: ExportedProgram,
    inputs: list[torch.Tensor],
    source: str,
    rules: list[InputRule] | None = None,
) -> CheckResult:
    """Run both programs (the cast one on inputs converted to its new input dtypes) and compare
    outputs; when the cast program's outputs hold inf/NaN the original's do not, name the ops."""
    from coreai_opt._export import ready_to_run

    ready_to_run(original)
    new_dtypes = [g.dtype_of(n) for n in user_inputs(cast)]
    with torch.no_grad():
        before = _leaves(original.module()(*inputs))
        after = _leaves(
            cast.module()(*[t.to(d) if d is not None else t for t, d in zip(inputs, new_dtypes, strict=True)])
        )
    result = CheckResult(inputs=source, rules=list(rules or []))
    new_nonfinite = False
    for i, (ref, got) in enumerate(zip(before, after, strict=True)):
        if not isinstance(ref, torch.Tensor):
            continue
        metrics = agreement(ref.detach().double().numpy(), got.detach().double().numpy())
        ok = metrics.passes(COSINE_MIN) and (metrics.relative_error or 0.0) <= RELATIVE_MAX
        new_nonfinite |= metrics.nonfinite_candidate > metrics.same_nonfinite
        dtypes = (str(t.dtype).removeprefix("torch.") for t in (ref, got))
        result.outputs.append(OutputAgreement(f"output {i}", *dtypes, metrics, ok))
    if new_nonfinite or not all(o.ok for o in result.outputs):
        # an inf inside (a sum of squares, say) can end as a finite but wrong output: name it too
        result.overflows = first_overflows(original, cast, inputs)
    return result
