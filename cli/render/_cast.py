"""`coreopt cast` (and a cast step of `coreopt apply`): what changed type, and the check."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.panel import Panel
from rich.table import Table

from .._common import console, human_bytes, shown
from ._shared import fitted_table, number, render_nonfinite, render_policy

if TYPE_CHECKING:
    from coreai_opt.recipes import CastFileResult


def _arrow(before: str, after: str) -> str:
    return before if before == after else f"{before} -> [bold]{after}[/bold]"


def render_cast(result: CastFileResult) -> None:
    report = result.report
    before, after = report.state_bytes_before, report.state_bytes_after
    console.print(
        Panel.fit(
            f"[bold]{shown(result.source)}[/bold] -> [bold]{shown(result.output)}[/bold]\n"
            f"passes: {', '.join(report.passes)}   nodes: {report.nodes_before} -> {report.nodes_after}"
            f"   casts: +{report.casts_inserted} inserted, -{report.casts_removed} removed   "
            f"{result.seconds * 1000:.0f} ms\n"
            f"state: {human_bytes(before)} -> {human_bytes(after)}",
            title="coreopt cast",
        )
    )
    io = Table(title="User inputs and outputs", title_justify="left")
    for column in ("name", "kind", "dtype"):
        io.add_column(column)
    for change in report.io:
        io.add_row(shown(change.name), change.kind, _arrow(change.before, change.after))
    console.print(io)
    _cast_state(report)
    _cast_ops(report)
    if result.check is not None:
        _cast_check(result.check)


_NAMED = 3  # tensors named per outcome in the table (--json lists each)


def _cast_state(report: Any) -> None:
    groups: dict[str, list] = {}
    for s in report.state:
        groups.setdefault(s.outcome.value, []).append(s)
    rows = []
    for outcome, items in groups.items():
        named = [f"{s.name} (max {s.max_abs:g})" if s.max_abs is not None else s.name for s in items]
        detail = ", ".join(named[:_NAMED]) + (
            f", and {len(named) - _NAMED} more" if len(named) > _NAMED else ""
        )
        nbytes = f"{human_bytes(sum(s.bytes_before for s in items))} -> {human_bytes(sum(s.bytes_after for s in items))}"
        rows.append([outcome, str(len(items)), nbytes, detail])
    if not report.state:
        rows.append(["no floating-point state", "0", "", ""])
    columns = [
        ("outcome", "left"),
        ("count", "right"),
        ("bytes", "right"),
        ("tensors (--json: each)", "left"),
    ]
    console.print(
        fitted_table("State (parameters, buffers, constants)", columns, rows, squeeze=((3, 24, "text"),))
    )


def _cast_ops(report: Any) -> None:
    ops = Table(title="Ops by outcome", title_justify="left")
    for column in ("outcome", "op", "count"):
        ops.add_column(column, justify="right" if column == "count" else "left")
    for outcome, targets in report.op_counts().items():
        for i, (target, count) in enumerate(targets.items()):
            ops.add_row(outcome if i == 0 else "", shown(target), str(count))
    console.print(ops)


def _cast_check(checked: Any) -> None:
    render_policy(checked.inputs, checked.rules)
    check = Table(title="Check", title_justify="left")
    for column in ("output", "dtype", "max abs err", "rel err", "cosine", "verdict"):
        check.add_column(column, justify="left" if column in ("output", "dtype", "verdict") else "right")
    for o in checked.outputs:
        m = o.metrics
        check.add_row(
            shown(o.name), _arrow(o.dtype_before, o.dtype_after), number(m.max_abs_error, ".3g"),
            number(m.relative_error, ".3g"), number(m.cosine, ".6f"),
            "[green]ok[/green]" if o.ok else "[red]DIFFERS[/red]",
        )  # fmt: skip
    console.print(check)
    render_nonfinite((o.name, o.metrics) for o in checked.outputs)
    overflows = checked.overflows
    if not overflows:
        return
    where = shown(", ".join(f"{o.node} ({o.op}{' in ' + o.module if o.module else ''})" for o in overflows))
    console.print(f"[yellow]fp16 overflows first at: {where}[/yellow]", highlight=False)
    ops = sorted({op for o in overflows for op in o.ignore})
    if ops:
        console.print(
            "[yellow]run them in fp32: " + shown(" ".join(f"--ignore-op {op}" for op in ops)) + "[/yellow]",
            highlight=False,
        )
    for o in overflows:
        if o.output:
            console.print(
                f"[yellow]{shown(o.node)}: a program output whose values exceed fp16's range; it cannot "
                "be fp16 (scale it inside the model, or cast with --to int16)[/yellow]",
                highlight=False,
            )


def cast_line(result: CastFileResult) -> str:
    report, check = result.report, result.check
    verdict = "not checked" if check is None else ("check ok" if check.ok else "check FAILED")
    return (
        f"cast {result.source} -> {result.output} ({result.target.value}): {len(report.ops)} ops and "
        f"{len(report.state)} tensors changed, state {human_bytes(report.state_bytes_before)} -> "
        f"{human_bytes(report.state_bytes_after)}, {verdict}, {result.seconds:.1f} s"
    )
