"""Rich renderings of library results. Formatting only: no numerics here."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rich import box
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ._common import console, human_bytes, plain, shown

if TYPE_CHECKING:
    from coreai_opt._agreement import Agreement
    from coreai_opt.comparison import ComparisonResult, OutputComparison, SweepResult
    from coreai_opt.compression import CompressionReport, Skipped
    from coreai_opt.inputs import InputRule
    from coreai_opt.inspection import ModelReport, TensorInfo
    from coreai_opt.recipes import (
        ActivationsFileResult,
        CastFileResult,
        CompressionFileResult,
        ConversionResult,
    )


_BREAKS = {"name": (".", "_-"), "text": (" ",)}  # where a cell of each kind may break, best first


def _pieces(text: str, width: int, breaks: tuple[str, ...]) -> list[str]:
    """`text` split after its first kind of separator, a piece still too long after the next."""
    if len(text.rstrip()) <= width:
        return [text]
    if not breaks:
        return [text[i : i + width] for i in range(0, len(text), width)]
    parts = [part for part in re.split(f"(?<=[{re.escape(breaks[0])}])", text) if part]
    return [piece for part in parts for piece in _pieces(part, width, breaks[1:])]


def reflow(text: str, width: int, kind: str) -> str:
    """`text` in lines of `width` at most: a name broken after its dots (`layers.0.` /
    `self_attn.q_proj.weight`; after `_` only inside a part too long), free text after spaces, a
    piece longer than the line broken hard - never cut, so a name stays whole; kind "cut" cuts at
    the end instead."""
    if len(text) <= width or width < 1:
        return text
    if kind == "cut":
        return text[: width - 1] + "…"
    lines: list[str] = []
    line = ""
    for piece in _pieces(text, width, _BREAKS[kind]):
        if line and len(line) + len(piece.rstrip()) > width:
            lines.append(line.rstrip())
            line = piece.lstrip()
        else:
            line += piece
    lines.append(line.rstrip())
    return "\n".join(lines)


def fitted_table(
    title: str,
    columns: list[tuple[str, str]],
    rows: list[list[str]],
    *,
    squeeze: tuple[tuple[int, int, str], ...] = ((0, 14, "name"),),
) -> Table:
    """A table as wide as the terminal at most (80 columns in CI logs, 60 in a split pane) that
    never cuts a name or a header: the columns in `squeeze` (index, narrowest width, how its cells
    break: "name", "text", "cut", or "hide": left out, the caption says so; --json and --csv carry
    every column), in that order, give up what the others need until the table fits, their cells
    broken into lines (`reflow`). Cells are plain text (never markup; unprintable characters
    escaped)."""
    rows = [[plain(cell) for cell in row] for row in rows]
    widths = [max([len(header), *(len(row[i]) for row in rows)]) for i, (header, _) in enumerate(columns)]
    shown_columns = list(range(len(columns)))

    def excess() -> int:  # one space either side of every column, collapsed between them
        return sum(widths[i] + 2 for i in shown_columns) - console.width

    hidden = []
    for index, narrowest, kind in squeeze:
        if excess() <= 0:
            break
        if kind == "hide":
            shown_columns.remove(index)
            hidden.append(columns[index][0])
            continue
        target = max(narrowest, len(columns[index][0]), widths[index] - excess())
        if target < widths[index]:
            widths[index] = target
            for row in rows:
                row[index] = reflow(row[index], target, kind)
    caption = f"left out at this width: {', '.join(hidden)}" if hidden else None
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
        caption=caption, caption_justify="left",
    )  # fmt: skip
    for i in shown_columns:
        header, justify = columns[i]
        table.add_column(header, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*(Text(row[i]) for i in shown_columns))
    return table


def _weights_squeeze(
    name: int,
    shape: int,
    detail: int,
    *,
    hide: tuple[int, ...] = (),
    detail_widths: tuple[int, int] = (16, 9),
) -> tuple[tuple[int, int, str], ...]:
    """How a table of weights gives way (see `fitted_table`): its free-text detail (an encoding, a
    reason) first, then the name down to 28, the `hide` columns, the detail and the name further,
    the shape last."""
    wide, narrow = detail_widths
    hidden = tuple((index, 0, "hide") for index in hide)
    return ((detail, wide, "text"), (name, 28, "name"), *hidden, (detail, narrow, "text"), (name, 14, "name"),
            (shape, 7, "text"))  # fmt: skip


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _signature_table(title: str, tensors: tuple[TensorInfo, ...]) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("name")
    table.add_column("dtype")
    table.add_column("shape")
    for tensor in tensors:
        table.add_row(shown(tensor.name), tensor.dtype, _shape(tensor.shape))
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
    rows = [[w.name, w.kind, _shape(w.shape), w.encoding, f"{w.nbytes:,}", f"{w.bits_per_weight:.2f}"]
            for w in report.weights]  # fmt: skip
    console.print(fitted_table("Weights", columns, rows, squeeze=_weights_squeeze(0, 2, 3, hide=(1,))))

    console.print(
        f"[bold]Totals[/bold]: parameters {report.parameters:,}   weight elements {report.weight_elements:,}"
        f"   weight bytes {report.weight_bytes:,} ({human_bytes(report.weight_bytes)})"
        f"   mean bits/weight {report.mean_bits_per_weight:.2f}"
    )
    for note in report.notes:
        console.print(f"[dim]note: {shown(note)}[/dim]")


def render_conversion(result: ConversionResult, report: ModelReport) -> None:
    table = Table(title="Converted", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("source", shown(result.source))
    table.add_row("output", shown(result.output))
    table.add_row("time", f"{result.seconds:.2f} s")
    table.add_row("inputs", shown(", ".join(f"{t.name} {t.dtype}{_shape(t.shape)}" for t in report.inputs)))
    table.add_row("outputs", shown(", ".join(f"{t.name} {t.dtype}{_shape(t.shape)}" for t in report.outputs)))
    table.add_row("ops", f"{sum(report.ops.values())} ({len(report.ops)} kinds)")
    table.add_row("weights", f"{len(report.weights)} tensors, {report.weight_bytes:,} bytes")
    console.print(table)


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


def _cast_state(report: Any) -> None:
    groups: dict[str, list] = {}
    for s in report.state:
        groups.setdefault(s.outcome.value, []).append(s)
    rows = []
    for outcome, items in groups.items():
        detail = ", ".join(
            f"{s.name} (max {s.max_abs:g})" if s.max_abs is not None else s.name for s in items
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
    _render_policy(checked.inputs, checked.rules)
    check = Table(title="Check", title_justify="left")
    for column in ("output", "dtype", "max abs err", "rel err", "cosine", "verdict"):
        check.add_column(column, justify="left" if column in ("output", "dtype", "verdict") else "right")
    for o in checked.outputs:
        m = o.metrics
        check.add_row(
            shown(o.name), _arrow(o.dtype_before, o.dtype_after), _number(m.max_abs_error, ".3g"),
            _number(m.relative_error, ".3g"), _number(m.cosine, ".6f"),
            "[green]ok[/green]" if o.ok else "[red]DIFFERS[/red]",
        )  # fmt: skip
    console.print(check)
    _render_nonfinite((o.name, o.metrics) for o in checked.outputs)
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


def _render_policy(source: str, rules: list[InputRule]) -> None:
    """Where the inputs came from, and how each was drawn."""
    lines = [f"inputs: {shown(source)}"] + [f"  {shown(r.name)}: {shown(r.describe())}" for r in rules]
    console.print("\n".join(lines), highlight=False)


def _number(value: float | None, spec: str) -> str:
    """A metric, or n/a where nothing finite was measured."""
    return "n/a" if value is None else format(value, spec)


def _render_nonfinite(outputs: Iterable[tuple[str, Agreement]]) -> None:
    """One line per output that held inf or NaN: where, and how much was left to measure."""
    for name, metrics in outputs:
        summary = metrics.nonfinite_summary()
        if summary:
            measured = f"metrics over {metrics.finite} of {metrics.positions} positions"
            if not metrics.measured:
                measured = "nothing finite to measure: every metric is n/a"
            console.print(f"[red]{shown(name)}: {summary} ({measured})[/red]", highlight=False)


def _db(value: float | None) -> str:
    """An SNR in dB: n/a when nothing was measured, exact when there was no error."""
    if value is None:
        return "n/a"
    if value == float("inf"):
        return "exact"
    return f"{value:.1f}"


def _weights_table(report: CompressionReport) -> None:
    """Every compressed weight: shape, encoding (LUT counts in it), stored bytes, bits per weight, SNR."""
    zeros = any(w.sparsity is not None for w in report.weights)
    learned = any(w.learned is not None for w in report.weights)
    headers = ("name", "shape", "encoding", *(("zeros",) if zeros else ()), "stored", "bits/w", "SNR dB",
               *(("data SNR", "data-free") if learned else ()))  # fmt: skip
    columns = [(h, "left" if h in ("name", "shape", "encoding") else "right") for h in headers]
    rows = [
        [
            w.name, _shape(w.shape), w.encoding,
            *((f"{w.sparsity:.1%}" if w.sparsity is not None else "",) if zeros else ()),
            human_bytes(w.bytes_after), f"{w.bits_per_weight:.2f}", _db(w.snr_db),
            *((_db(w.learned.snr_db), _db(w.learned.data_free_snr_db)) if w.learned else ("", "")
              if learned else ()),
        ]
        for w in report.weights
    ]  # fmt: skip
    hide = (len(headers) - 1, len(headers) - 2) if learned else ()  # data-free, data SNR
    console.print(fitted_table("Weights", columns, rows, squeeze=_weights_squeeze(0, 1, 2, hide=hide)))


def _skipped_table(skipped: list[Skipped], threshold: object) -> None:
    """Weights left alone, and why (the small ones counted, not listed)."""
    from coreai_opt.coreai_utils import SkipKind

    listed = [s for s in skipped if s.kind is not SkipKind.SMALL]
    if listed:
        rows = [[s.name, _shape(s.shape), s.reason] for s in listed]
        columns = [("name", "left"), ("shape", "left"), ("reason", "left")]
        squeeze = _weights_squeeze(0, 1, 2, detail_widths=(24, 16))
        console.print(fitted_table("Skipped", columns, rows, squeeze=squeeze))
    small = len(skipped) - len(listed)
    if small:
        console.print(
            f"[dim]{small} small constants skipped (<= {threshold} elements; --json lists them)[/dim]"
        )


def _option(name: str, value: Any) -> str:
    """An option as the command line spells it (n:m as 2:4, lists comma separated)."""
    if isinstance(value, list):
        return (":" if name == "n_m_ratio" else ", ").join(map(str, value))
    return str(value)


def _flags_of(kind: str) -> dict[str, str]:
    """Field name -> the flag a user typed for it (a pass no longer registered: the field names)."""
    from coreai_opt.compression import config_types, flag_names

    config_type = config_types().get(kind)
    return flag_names(config_type) if config_type is not None else {}


def render_compression(result: CompressionFileResult) -> None:
    report = result.report
    spelled = _flags_of(result.method)
    options = shown(
        "   ".join(
            f"{spelled.get(k, k)} {_option(k, v)}" for k, v in result.options.items() if v not in (None, [])
        )
    )
    console.print(
        Panel.fit(
            f"[bold]{shown(result.source)}[/bold] -> [bold]{shown(result.output)}[/bold]\n{options}\n"
            f"{len(report.weights)} weights compressed, {len(report.skipped)} skipped   "
            f"{result.seconds:.2f} s",
            title=f"coreopt {result.method}",
        )
    )
    if report.weights:
        _weights_table(report)
    _skipped_table(report.skipped, result.options.get("weight_num_threshold"))
    if report.weights:
        console.print(
            f"[bold]Totals[/bold]: all float tensors {human_bytes(report.total_bytes_before)} -> "
            f"{human_bytes(report.total_bytes_after)} ({report.total_ratio:.2f}x), of which compressed "
            f"weights {human_bytes(report.bytes_before)} -> {human_bytes(report.bytes_after)} "
            f"({report.ratio:.2f}x) and kept {human_bytes(report.kept_bytes)}   "
            f"bits/weight {report.bits_per_weight:.2f} over the compressed weights, "
            f"{report.model_bits_per_weight:.2f} over every float tensor (inspect's, compare's)   file on disk "
            f"{human_bytes(result.file_bytes_before)} -> {human_bytes(result.file_bytes_after)}"
        )
    if learned := [w.learned for w in report.weights if w.learned is not None]:
        gain = sum(x.snr_db - x.data_free_snr_db for x in learned if _finite(x.snr_db, x.data_free_snr_db))
        console.print(
            f"[bold]Data[/bold]: {len(learned)} weights learned from calibration ({learned[0].weighting}-weighted "
            f"error, 'data SNR'): {gain / len(learned):+.2f} dB on average against the data-free encoding"
        )
    if report.tuning:
        passes = " -> ".join(f"{d:.4g}" for d in report.tuning)
        console.print(
            f"[bold]Tuning[/bold]: look-up tables tuned end to end over {len(report.tuning)} pass{'es' * (len(report.tuning) > 1)}; mean "
            f"divergence from the original on the calibration data, pass by pass: {passes} (the data SNR is "
            "the layer-wise one, before tuning)"
        )
    for warning in report.warnings:
        console.print(f"[yellow]warning: {shown(warning)}[/yellow]")


def _finite(*values: float) -> bool:
    return all(v not in (float("inf"), float("-inf")) for v in values)


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
        _weights_table(report.weights)
    weights = result.options["weights"]
    _skipped_table(report.weights_left_float, weights["weight_num_threshold"] if weights else None)
    if report.float_ops:
        console.print(f"[dim]left in float by the config: {shown(', '.join(report.float_ops))}[/dim]")
    console.print(
        f"file on disk {human_bytes(result.file_bytes_before)} -> {human_bytes(result.file_bytes_after)}"
    )


def _output_name(o: OutputComparison) -> str:
    return o.name if o.name == o.candidate_name else f"{o.name} / {o.candidate_name}"


def render_comparison(result: ComparisonResult) -> None:
    inputs = shown(", ".join(f"{s.name} {s.dtype.name}{_shape(s.shape)}" for s in result.inputs))
    console.print(
        Panel.fit(
            f"reference: [bold]{shown(result.reference)}[/bold]\ncandidate: [bold]{shown(result.candidate)}[/bold]\n"
            f"inputs: {inputs}",
            title="coreopt compare",
        )
    )
    _render_policy(result.inputs_source, result.rules)
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
            shown(_output_name(o)), _shape(o.shape), o.dtype, _number(m.cosine, ".6f"), _db(m.snr_db),
            _number(m.max_abs_error, ".3g"), verdict,
        )  # fmt: skip
    console.print(table)
    if several:
        spread = Table(title=f"Over {len(result.samples)} samples", title_justify="left")
        for column in ("output", "mean cosine", "mean SNR dB", "worst sample"):
            spread.add_column(column, justify="right" if column.startswith("mean") else "left")
        for o in result.outputs:
            spread.add_row(
                shown(_output_name(o)),
                _number(o.spread.cosine_mean, ".6f"),
                _db(o.spread.snr_db_mean),
                shown(o.spread.worst),
            )
        console.print(spread)
    _render_nonfinite((o.name, o.metrics) for o in result.outputs)


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
            _number(row.cosine_mean, ".5f"), _number(row.cosine_min, ".5f"), _db(row.snr_db_min),
        ]  # fmt: skip
        if result.ok is not None:
            cells.append("yes" if row.ok else "no")
        rows.append(cells)
    title = "Candidates (over every output and sample; --csv, --json: every column)"
    squeeze = ((0, 14, "name"), (2, 0, "hide"), (4, 0, "hide"))  # ratio, cos mean
    console.print(fitted_table(title, columns, rows, squeeze=squeeze))


def distinct_tails(names: list[str]) -> list[str]:
    """Names without the start they all share (up to a separator: `model.int8.aimodel`,
    `model.lut4.aimodel` -> `…int8.aimodel`, `…lut4.aimodel`), so what tells them apart survives a
    narrow column."""
    if len(names) < 2 or len(set(names)) < len(names):
        return names
    shared = names[0]
    for name in names[1:]:
        while not name.startswith(shared):
            shared = shared[:-1]
    cut = max((shared.rfind(sep) for sep in "./_-"), default=-1) + 1
    return ["…" + n[cut:] for n in names] if cut > 1 else names


# ----- --quiet: one line per command, for CI logs --------------------------------------------------


def print_line(text: str) -> None:
    """One summary line, never wrapped (a CI log keeps it whole)."""
    console.print(plain(text), soft_wrap=True, highlight=False, markup=False)


def model_line(report: ModelReport) -> str:
    return (
        f"inspect {report.path}: {report.format}, {sum(report.ops.values())} ops, {len(report.weights)} weights, "
        f"{human_bytes(report.weight_bytes)}, {report.mean_bits_per_weight:.2f} bits/weight"
    )


def conversion_line(result: ConversionResult, report: ModelReport) -> str:
    return (
        f"convert {result.source} -> {result.output}: {sum(report.ops.values())} ops, {len(report.weights)} "
        f"weights, {human_bytes(report.weight_bytes)}, {result.seconds:.1f} s"
    )


def cast_line(result: CastFileResult) -> str:
    report, check = result.report, result.check
    verdict = "not checked" if check is None else ("check ok" if check.ok else "check FAILED")
    return (
        f"cast {result.source} -> {result.output} ({result.target.value}): {len(report.ops)} ops and "
        f"{len(report.state)} tensors changed, state {human_bytes(report.state_bytes_before)} -> "
        f"{human_bytes(report.state_bytes_after)}, {verdict}, {result.seconds:.1f} s"
    )


def compression_line(result: CompressionFileResult) -> str:
    report = result.report
    ratio = f" ({report.total_ratio:.2f}x)" if report.total_ratio else ""
    warnings = f", {len(report.warnings)} warnings" if report.warnings else ""
    return (
        f"{result.method} {result.source} -> {result.output}: {len(report.weights)} weights compressed, "
        f"{len(report.skipped)} skipped; float tensors {human_bytes(report.total_bytes_before)} -> "
        f"{human_bytes(report.total_bytes_after)}{ratio}; file {human_bytes(result.file_bytes_before)} -> "
        f"{human_bytes(result.file_bytes_after)}{warnings}; {result.seconds:.1f} s"
    )


def comparison_line(result: ComparisonResult) -> str:
    verdict = {None: "", True: ", ok", False: f", FAILS --min-cosine {result.min_cosine}"}[result.ok]
    return (
        f"compare {result.reference} vs {result.candidate}: worst cosine {_number(result.worst_cosine, '.6f')} "
        f"over {len(result.outputs)} outputs x {len(result.samples)} samples{verdict}"
    )


def sweep_line(result: SweepResult) -> str:
    rows = "; ".join(
        f"{r.candidate.name} {human_bytes(r.file_bytes)} cos min {_number(r.cosine_min, '.5f')}"
        for r in result.rows
    )
    return f"compare {result.reference.name} vs {len(result.rows)} candidates: {rows}"


def activations_line(result: ActivationsFileResult) -> str:
    report = result.report
    return (
        f"quantize {result.source} -> {result.output}: {len(report.activations)} activations and "
        f"{len(report.weights.weights)} weights quantized ({result.samples} calibration samples); file "
        f"{human_bytes(result.file_bytes_before)} -> {human_bytes(result.file_bytes_after)}; {result.seconds:.1f} s"
    )
