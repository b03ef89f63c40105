"""`coreopt compare`: one candidate against the reference, or a sweep over several."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.panel import Panel
from rich.table import Table

from .._common import console, human_bytes, shown
from ._shared import db, distinct_tails, fitted_table, number, render_nonfinite, render_policy, shape

if TYPE_CHECKING:
    from coreai_opt.comparison import ComparisonResult, OutputComparison, SweepResult


def _output_name(o: OutputComparison) -> str:
    return o.name if o.name == o.candidate_name else f"{o.name} / {o.candidate_name}"


def render_comparison(result: ComparisonResult) -> None:
    inputs = shown(", ".join(f"{s.name} {s.dtype.name}{shape(s.shape)}" for s in result.inputs))
    console.print(
        Panel.fit(
            f"reference: [bold]{shown(result.reference)}[/bold]\ncandidate: [bold]{shown(result.candidate)}[/bold]\n"
            f"inputs: {inputs}",
            title="coreopt compare",
        )
    )
    render_policy(result.inputs_source, result.rules)
    several = len(result.samples) > 1
    title = f"Outputs (each number at its worst of {len(result.samples)} samples)" if several else "Outputs"
    table = Table(title=title, title_justify="left")
    for column in ("output", "shape", "dtype", "cosine", "SNR dB", "max abs err", "verdict"):
        table.add_column(column, justify="right" if column in ("cosine", "SNR dB", "max abs err") else "left")
    for o in result.outputs:
        m = o.metrics
        if o.ok is None:
            verdict = ""
        elif o.ok:
            verdict = "[green]ok[/green]"
        else:
            verdict = (
                f"[red]below {result.min_cosine}[/red]" if m.clean and m.measured else "[red]fails[/red]"
            )
        table.add_row(
            shown(_output_name(o)), shape(o.shape), o.dtype, number(m.cosine, ".6f"), db(m.snr_db),
            number(m.max_abs_error, ".3g"), verdict,
        )  # fmt: skip
    console.print(table)
    if several:
        spread = Table(title=f"Over {len(result.samples)} samples", title_justify="left")
        for column in ("output", "mean cosine", "mean SNR dB", "worst sample"):
            spread.add_column(column, justify="right" if column.startswith("mean") else "left")
        for o in result.outputs:
            spread.add_row(
                shown(_output_name(o)),
                number(o.spread.cosine_mean, ".6f"),
                db(o.spread.snr_db_mean),
                shown(o.spread.worst),
            )
        console.print(spread)
    render_nonfinite((o.name, o.metrics) for o in result.outputs)


def render_sweep(result: SweepResult) -> None:
    first = result.comparisons[0]
    console.print(
        f"[bold]reference[/bold] {shown(result.reference.name)} ({human_bytes(result.reference_bytes)}, "
        f"{result.reference_bits_per_weight:.2f} bits/weight), {len(first.samples)} sample"
        f"{'s' * (len(first.samples) > 1)} from {shown(first.inputs_source)}"
    )
    columns = [("candidate", "left")] + [
        (c, "right") for c in ("size", "ratio", "bits/w", "cos mean", "cos min", "SNR min")
    ]
    if result.ok is not None:
        columns.append(("ok", "left"))
    rows = []
    for name, row in zip(distinct_tails([r.candidate.name for r in result.rows]), result.rows, strict=True):
        cells = [
            name, human_bytes(row.file_bytes), f"{row.ratio:.2f}x", f"{row.bits_per_weight:.2f}",
            number(row.cosine_mean, ".5f"), number(row.cosine_min, ".5f"), db(row.snr_db_min),
        ]  # fmt: skip
        if result.ok is not None:
            cells.append("yes" if row.ok else "no")
        rows.append(cells)
    title = "Candidates (over every output and sample; --csv, --json: every column)"
    squeeze = ((0, 14, "name"), (2, 0, "hide"), (4, 0, "hide"))  # ratio, cos mean
    console.print(fitted_table(title, columns, rows, squeeze=squeeze))


def comparison_line(result: ComparisonResult) -> str:
    verdict = {None: "", True: ", ok", False: f", FAILS --min-cosine {result.min_cosine}"}[result.ok]
    return (
        f"compare {result.reference} vs {result.candidate}: worst cosine {number(result.worst_cosine, '.6f')} "
        f"over {len(result.outputs)} outputs x {len(result.samples)} samples{verdict}"
    )


def sweep_line(result: SweepResult) -> str:
    rows = "; ".join(
        f"{r.candidate.name} {human_bytes(r.file_bytes)} cos min {number(r.cosine_min, '.5f')}"
        for r in result.rows
    )
    return f"compare {result.reference.name} vs {len(result.rows)} candidates: {rows}"
