"""Rich renderings of library results. Formatting only: no numerics here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.panel import Panel
from rich.table import Table

from ._common import console, human_bytes

if TYPE_CHECKING:
    from coreai_opt.conversion import ConversionResult
    from coreai_opt.inspection import ModelReport, TensorInfo


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _signature_table(title: str, tensors: tuple[TensorInfo, ...]) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("name")
    table.add_column("dtype")
    table.add_column("shape")
    for tensor in tensors:
        table.add_row(tensor.name, tensor.dtype, _shape(tensor.shape))
    return table


def render_model_report(report: ModelReport, *, max_ops: int = 25) -> None:
    console.print(
        Panel.fit(
            f"[bold]{report.path}[/bold]\nformat: {report.format}   ops: {sum(report.ops.values())}"
            f"   weights: {len(report.weights)}",
            title="coreopt inspect",
        )
    )
    console.print(_signature_table("Inputs", report.inputs))
    console.print(_signature_table("Outputs", report.outputs))

    ops = Table(title="Op histogram", title_justify="left")
    ops.add_column("op")
    ops.add_column("count", justify="right")
    items = list(report.ops.items())
    for name, count in items[:max_ops]:
        ops.add_row(name, str(count))
    if len(items) > max_ops:
        ops.add_row(f"... {len(items) - max_ops} more op kinds", str(sum(c for _, c in items[max_ops:])))
    console.print(ops)

    weights = Table(title="Weights", title_justify="left")
    for column, justify in (("name", "left"), ("kind", "left"), ("shape", "left"), ("encoding", "left")):
        weights.add_column(column, justify=justify)  # type: ignore[arg-type]
    weights.add_column("bytes", justify="right")
    weights.add_column("bits/w", justify="right")
    for w in report.weights:
        weights.add_row(
            w.name, w.kind, _shape(w.shape), w.encoding, f"{w.nbytes:,}", f"{w.bits_per_weight:.2f}"
        )
    console.print(weights)

    console.print(
        f"[bold]Totals[/bold]: parameters {report.parameters:,}   weight elements {report.weight_elements:,}"
        f"   weight bytes {report.weight_bytes:,} ({human_bytes(report.weight_bytes)})"
        f"   mean bits/weight {report.mean_bits_per_weight:.2f}"
    )
    for note in report.notes:
        console.print(f"[dim]note: {note}[/dim]")


def render_conversion(result: ConversionResult, report: ModelReport) -> None:
    table = Table(title="Converted", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("source", str(result.source))
    table.add_row("output", str(result.output))
    table.add_row("time", f"{result.seconds:.2f} s")
    table.add_row("inputs", ", ".join(f"{t.name} {t.dtype}{_shape(t.shape)}" for t in report.inputs))
    table.add_row("outputs", ", ".join(f"{t.name} {t.dtype}{_shape(t.shape)}" for t in report.outputs))
    table.add_row("ops", f"{sum(report.ops.values())} ({len(report.ops)} kinds)")
    table.add_row("weights", f"{len(report.weights)} tensors, {report.weight_bytes:,} bytes")
    console.print(table)
