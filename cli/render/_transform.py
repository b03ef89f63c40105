"""`coreopt transform`'s report: what changed (the norms folded counted, every other change a
line) and how closely the result reproduces the input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._common import console
from ._shared import fitted_table, print_line


def transform_line(output: Path, report: Any) -> str:
    eq = report.equivalence
    arithmetic = "float64" if eq.in_float64 else "its own dtypes"
    return (
        f"{report.kind}: {len(report.changes)} changes -> {output}; outputs within "
        f"{eq.relative_rms:.2g} relative RMS, {eq.max_abs:.2g} max abs ({eq.samples} seeded inputs, {arithmetic})"
    )


def render_transform(source: Path, output: Path, seconds: float, report: Any) -> None:
    folded = [line for line in report.changes if ": folded into " in line]
    rows = [[f"{len(folded)} norms folded into the linears that read them"]] if folded else []
    rows += [[line] for line in report.changes if line not in folded]
    title = f"{report.kind}: {source} -> {output} ({seconds:.1f} s)"
    console.print(fitted_table(title, [("change", "left")], rows, squeeze=((0, 20, "text"),)))
    print_line(transform_line(output, report))
