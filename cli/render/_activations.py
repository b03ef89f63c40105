"""`coreopt quantize --activations`: the activations quantized, with the weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.panel import Panel
from rich.table import Table

from .._common import console, human_bytes, shown
from ._compression import skipped_table, weights_table

if TYPE_CHECKING:
    from coreai_opt.recipes import ActivationsFileResult


def render_activation_quantization(result: ActivationsFileResult) -> None:
    report = result.report
    console.print(
        Panel.fit(
            f"[bold]{shown(result.source)}[/bold] -> [bold]{shown(result.output)}[/bold]\n"
            f"calibration: {shown(result.calibration)} ({result.samples} samples)\n"
            f"{len(report.activations)} activations and {len(report.weights.weights)} weights quantized   "
            f"{result.seconds:.2f} s",
            title="coreopt quantize (weights and activations)",
        )
    )
    table = Table(title="Activations", title_justify="left")
    for column in ("value", "read by", "dtype", "observer", "range", "scale", "zero point"):
        table.add_column(column, justify="right" if column in ("scale", "zero point") else "left")
    for a in report.activations:
        p = a.qparams
        table.add_row(
            shown(a.name), shown(", ".join(a.consumers)), f"{a.dtype} {a.qscheme}",
            a.observer if a.range_from == a.observer else f"{a.observer} (kept {a.range_from})",
            f"[{p.lo:.4g}, {p.hi:.4g}]",
            f"{p.scale:.4g}", str(p.zero_point),
        )  # fmt: skip
    console.print(table)
    if report.weights.weights:
        weights_table(report.weights)
    weights = result.options["weights"]
    skipped_table(report.weights_left_float, weights["weight_num_threshold"] if weights else None)
    if report.float_ops:
        console.print(f"[dim]left in float by the config: {shown(', '.join(report.float_ops))}[/dim]")
    console.print(
        f"file on disk {human_bytes(result.file_bytes_before)} -> {human_bytes(result.file_bytes_after)}"
    )


def activations_line(result: ActivationsFileResult) -> str:
    report = result.report
    return (
        f"quantize {result.source} -> {result.output}: {len(report.activations)} activations and "
        f"{len(report.weights.weights)} weights quantized ({result.samples} calibration samples); file "
        f"{human_bytes(result.file_bytes_before)} -> {human_bytes(result.file_bytes_after)}; {result.seconds:.1f} s"
    )
