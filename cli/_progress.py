"""Progress over weights (or samples): a bar with an ETA on a terminal's stderr, throttled lines elsewhere."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from ._common import err_console, shown

LOG_EVERY_S = 30.0  # off a terminal (a CI log, a pipe): one progress line at most this often


def _log_lines(what: str) -> Any:
    """A progress callback for stderr that is no terminal: a plain line with the count, the time
    taken and the ETA once LOG_EVERY_S has passed since the start or the last line - a long run in
    a log shows it is alive, a short one prints nothing."""
    began = time.monotonic()
    last = [began]

    def advance(done: int, total: int, name: str) -> None:
        now = time.monotonic()
        if now - last[0] < LOG_EVERY_S:
            return
        last[0] = now
        spent = now - began
        eta = f", about {_clock(spent * (total - done) / done)} left" if 0 < done < total else ""
        err_console.print(
            f"{what}: {done}/{total} ({shown(name)}), {_clock(spent)} so far{eta}",
            highlight=False, soft_wrap=True,
        )  # fmt: skip

    return advance


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


@contextlib.contextmanager
def weight_progress(enabled: bool, what: str) -> Iterator[Any]:
    """A progress callback `(done, total, name)`, or None: a bar with an ETA on a terminal's stderr
    (none with --json, so stdout stays one document); off a terminal, a line every LOG_EVERY_S at
    most. The bar appears with the first item done, so a command that fails before any work prints
    nothing but its error line."""
    if not enabled:
        yield None
        return
    if not err_console.is_terminal:
        yield _log_lines(what)
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
