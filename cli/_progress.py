"""Progress bars over weights (or samples) with an ETA, on a terminal's stderr only."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ._common import err_console, shown


@contextlib.contextmanager
def weight_progress(enabled: bool, what: str) -> Iterator[Any]:
    """A progress callback `(done, total, name)`, or None: a bar with an ETA on a terminal's stderr
    only (none with --json, so stdout stays one document, and none in logs). It appears with the
    first item done, so a command that fails before any work prints nothing but its error line."""
    if not enabled or not err_console.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
    from rich.progress import Progress as Bar

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with contextlib.ExitStack() as stack:
        state: dict[str, Any] = {}

        def advance(done: int, total: int, name: str) -> None:
            if "bar" not in state:
                state["bar"] = stack.enter_context(Bar(*columns, console=err_console, transient=True))
                state["task"] = state["bar"].add_task(what, total=total)
            state["bar"].update(
                state["task"], completed=done, total=total, description=f"{what} {shown(name)}"
            )

        yield advance


@contextlib.contextmanager
def spinner(enabled: bool, what: str) -> Iterator[None]:
    """A spinner with the elapsed time for one long step whose progress nothing reports (loading
    and exporting a model), on a terminal's stderr only."""
    if not enabled or not err_console.is_terminal:
        yield
        return
    from rich.progress import Progress as Bar
    from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

    with Bar(
        SpinnerColumn(), TextColumn(what), TimeElapsedColumn(), console=err_console, transient=True
    ) as bar:
        bar.add_task(what, total=None)
        yield
