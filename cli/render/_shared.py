"""What the renderers share: tables fitted to the terminal, shapes, metrics as text, the inputs a
check drew, the outputs that held inf or NaN, and the one-line summaries of `--quiet`."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from rich import box
from rich.table import Table
from rich.text import Text

from .._common import console, plain, shown

if TYPE_CHECKING:
    from coreai_opt.comparison import Agreement
    from coreai_opt.inputs import InputRule


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


def weights_squeeze(
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


def shape(dims: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def number(value: float | None, spec: str) -> str:
    """A metric, or n/a where nothing finite was measured."""
    return "n/a" if value is None else format(value, spec)


def db(value: float | None) -> str:
    """An SNR in dB: n/a when nothing was measured, exact when there was no error."""
    if value is None:
        return "n/a"
    if value == float("inf"):
        return "exact"
    return f"{value:.1f}"


def render_policy(source: str, rules: list[InputRule]) -> None:
    """Where the inputs came from, and how each was drawn."""
    lines = [f"inputs: {shown(source)}"] + [f"  {shown(r.name)}: {shown(r.describe())}" for r in rules]
    console.print("\n".join(lines), highlight=False)


def render_nonfinite(outputs: Iterable[tuple[str, Agreement]]) -> None:
    """One line per output that held inf or NaN: where, and how much was left to measure."""
    for name, metrics in outputs:
        summary = metrics.nonfinite_summary()
        if summary:
            measured = f"metrics over {metrics.finite} of {metrics.positions} positions"
            if not metrics.measured:
                measured = "nothing finite to measure: every metric is n/a"
            console.print(f"[red]{shown(name)}: {summary} ({measured})[/red]", highlight=False)


# ----- --quiet: one line per command, for CI logs --------------------------------------------------


def print_line(text: str) -> None:
    """One summary line, never wrapped (a CI log keeps it whole)."""
    console.print(plain(text), soft_wrap=True, highlight=False, markup=False)
