"""`coreopt inspect`: a model's signature, ops and weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.panel import Panel
from rich.table import Table

from .._common import console, human_bytes, shown
from ._shared import fitted_table, shape, weights_squeeze

if TYPE_CHECKING:
    from coreai_opt.inspection import ModelReport, TensorInfo


def _signature_table(title: str, tensors: tuple[TensorInfo, ...]) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("name")
    table.add_column("dtype")
    table.add_column("shape")
    for tensor in tensors:
        table.add_row(shown(tensor.name), tensor.dtype, shape(tensor.shape))
    return table


def render_model_report(report: ModelReport, *, max_ops: int = 25) -> None:
    console.print(
        Panel.fit(
            f"[bold]{shown(report.path)}[/bold]\nformat: {report.format}   ops: {sum(report.ops.values())}"
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
        ops.add_row(shown(name), str(count))
    if len(items) > max_ops:
        ops.add_row(f"... {len(items) - max_ops} more op kinds", str(sum(c for _, c in items[max_ops:])))
    console.print(ops)

    columns = [("name", "left"), ("kind", "left"), ("shape", "left"), ("encoding", "left"), ("bytes", "right"),
               ("bits/w", "right")]  # fmt: skip
    rows = [[w.name, w.kind, shape(w.shape), w.encoding, f"{w.nbytes:,}", f"{w.bits_per_weight:.2f}"]
            for w in report.weights]  # fmt: skip
    console.print(fitted_table("Weights", columns, rows, squeeze=weights_squeeze(0, 2, 3, hide=(1,))))

    console.print(
        f"[bold]Totals[/bold]: parameters {report.parameters:,}   weight elements {report.weight_elements:,}"
        f"   weight bytes {report.weight_bytes:,} ({human_bytes(report.weight_bytes)})"
        f"   mean bits/weight {report.mean_bits_per_weight:.2f}"
    )
    for note in report.notes:
        console.print(f"[dim]note: {shown(note)}[/dim]")


def model_line(report: ModelReport) -> str:
    return (
        f"inspect {report.path}: {report.format}, {sum(report.ops.values())} ops, {len(report.weights)} weights, "
        f"{human_bytes(report.weight_bytes)}, {report.mean_bits_per_weight:.2f} bits/weight"
    )
