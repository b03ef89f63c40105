"""What both CLIs share: exit codes, one-line errors, JSON output, rich consoles."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

import typer
from rich.console import Console

EXIT_OK = 0
EXIT_USER_ERROR = 1  # usage errors exit 2, click's own code

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def fail(message: str) -> NoReturn:
    """One line on stderr, exit code 1: the contract every command keeps for bad input."""
    line = " ".join(str(message).split())
    sys.stderr.write(f"error: {line}\n")
    sys.stderr.flush()
    raise typer.Exit(EXIT_USER_ERROR)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn every failure inside a command into one line and exit code 1.

    Set COREOPT_DEBUG=1 to let unexpected exceptions through with their traceback.
    """
    from coreai_opt.io import ModelFileError

    try:
        yield
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except ModelFileError as exc:
        fail(str(exc))
    except (ValueError, OSError, ImportError) as exc:  # ImportError: an optional extra not installed
        fail(str(exc))
    except Exception as exc:
        if os.environ.get("COREOPT_DEBUG"):
            raise
        fail(f"unexpected {type(exc).__name__}: {exc} (set COREOPT_DEBUG=1 for a traceback)")


def print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False, default=str) + "\n")


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


def version_option(name: str, version: str) -> Any:
    def show(value: bool) -> None:
        if value:
            console.print(f"{name} {version}")
            raise typer.Exit(EXIT_OK)

    return typer.Option(False, "--version", callback=show, is_eager=True, help="Show the version and exit.")


def json_option() -> Any:
    return typer.Option(False, "--json", help="Print one JSON document instead of tables.")


def trust_pickle_option() -> Any:
    return typer.Option(
        False,
        "--trust-pickle",
        help="Let a .pt2 run the pickles and code it holds. Off by default: a .pt2 from someone else "
        "can run any command when torch loads it; use this only for files you made yourself.",
    )


def force_option() -> Any:
    return typer.Option(False, "--force", help="Overwrite an existing output.")
