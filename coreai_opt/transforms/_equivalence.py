"""Whether a transformed program computes what the original did: both run in float64 on the same
seeded inputs (the input policy of `coreai_opt.inputs`), every output compared."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram


class TransformError(ValueError):
    """A transform that would change what the program computes (beyond its tolerance), or that
    cannot run on it; the program is left as it was."""


@dataclass(frozen=True)
class Equivalence:
    """The worst relative RMS difference and the largest absolute difference of any output over
    the samples; `samples`: how many seeded inputs were compared."""

    relative_rms: float
    max_abs: float
    samples: int
    in_float64: bool = True  # False: compared in the program's own dtypes (an op without float64)

    def to_dict(self) -> dict[str, Any]:
        return {"relative_rms": self.relative_rms, "max_abs": self.max_abs, "samples": self.samples,
                "in_float64": self.in_float64}  # fmt: skip


def seeded_inputs(program: ExportedProgram, count: int) -> list[list[torch.Tensor]]:
    """`count` draws of the program's user inputs (seeds 0 ..), in input order and dtypes."""
    from coreai_opt.inputs import drawn_inputs

    return [drawn_inputs(program, seed)[0] for seed in range(count)]


def outputs(
    program: ExportedProgram, inputs: list[list[torch.Tensor]], device: torch.device | None = None,
    *, exact: bool = True,
) -> list[list[torch.Tensor]]:  # fmt: skip
    """The program's float outputs on each input set, computed in float64 (`compute_in_float64`:
    a transform is judged by what it changed, not by the float32 arithmetic's own rounding, which
    differs between two orders of the same sums by more than a weight stored again does) - in its
    own dtypes where not `exact` - run on `device` (a calibration's: a 1B program's check on a
    GPU, not the CPU), its state read and never written."""
    import torch
    import torch.utils._pytree as pytree

    from coreai_opt._export import compute_in_float64, runnable

    module, where = runnable(program, device, stateless=True), torch.device(device or "cpu")
    if exact:
        compute_in_float64(module)
    with torch.no_grad():
        runs = [pytree.tree_leaves(module(*(_widened(t, where, exact) for t in sample))) for sample in inputs]
    del module
    return [
        [t.detach().cpu() for t in run if isinstance(t, torch.Tensor) and t.is_floating_point()]
        for run in runs
    ]


def original_outputs(
    program: ExportedProgram, inputs: list[list[torch.Tensor]], device: torch.device | None = None
) -> tuple[list[list[torch.Tensor]], bool]:
    """`outputs` of the program before a transform, and whether they are in float64: in its own
    dtypes where it cannot run so (an op without a float64 kernel), and the transformed program
    is then run so too."""
    try:
        return outputs(program, inputs, device), True
    except (RuntimeError, NotImplementedError):
        pass  # retried out of the handler: its traceback would hold the failed run's tensors
    return outputs(program, inputs, device, exact=False), False


def transformed_outputs(
    program: ExportedProgram, inputs: list[list[torch.Tensor]], device: torch.device | None, exact: bool
) -> list[list[torch.Tensor]]:
    """`outputs` of the transformed program, taken as its original's were; TransformError where
    it fails to run."""
    try:
        return outputs(program, inputs, device, exact=exact)
    except (RuntimeError, NotImplementedError) as why:
        raise TransformError(f"the transformed program fails to run on its check: {why}") from None


def _widened(t: torch.Tensor, where: torch.device, exact: bool) -> torch.Tensor:
    import torch

    return t.to(where, torch.float64) if exact and t.is_floating_point() else t.to(where)


def compare(
    before: list[list[torch.Tensor]], after: list[list[torch.Tensor]], in_float64: bool = True
) -> Equivalence:
    """The worst relative RMS and largest absolute difference, with one temporary an output (the
    sums taken in float64); `in_float64`: how the outputs were computed."""
    import torch

    worst, largest = 0.0, 0.0
    for was, now in zip(before, after, strict=True):
        for a, b in zip(was, now, strict=True):
            if a.shape != b.shape:
                return Equivalence(math.inf, math.inf, len(before), in_float64)
            count = math.sqrt(max(a.numel(), 1))
            scale = float(torch.linalg.vector_norm(a, dtype=torch.float64)) / count or 1.0
            difference = (a - b).nan_to_num_(nan=math.inf)
            worst = max(
                worst, float(torch.linalg.vector_norm(difference, dtype=torch.float64)) / count / scale
            )
            largest = max(largest, float(difference.abs_().max()) if difference.numel() else 0.0)
    return Equivalence(worst, largest, len(before), in_float64)
