"""`coreopt convert`: what a conversion wrote."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from .._common import console, human_bytes, shown
from ._shared import shape

if TYPE_CHECKING:
    from coreai_opt.inspection import ModelReport
    from coreai_opt.recipes import ConversionResult


def render_conversion(result: ConversionResult, report: ModelReport) -> None:
    table = Table(title="Converted", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("source", shown(result.source))
    table.add_row("output", shown(result.output))
    table.add_row("time", f"{result.seconds:.2f} s")
    table.add_row("inputs", shown(", ".join(f"{t.name} {t.dtype}{shape(t.shape)}" for t in report.inputs)))
    table.add_row("outputs", shown(", ".join(f"{t.name} {t.dtype}{shape(t.shape)}" for t in report.outputs)))
    table.add_row("ops", f"{sum(report.ops.values())} ({len(report.ops)} kinds)")
    table.add_row("weights", f"{len(report.weights)} tensors, {report.weight_bytes:,} bytes")
    console.print(table)


def conversion_line(result: ConversionResult, report: ModelReport) -> str:
    return (
        f"convert {result.source} -> {result.output}: {sum(report.ops.values())} ops, {len(report.weights)} "
        f"weights, {human_bytes(report.weight_bytes)}, {result.seconds:.1f} s"
    )
