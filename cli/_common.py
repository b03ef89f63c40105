"""What both CLIs share: exit codes, one-line errors, JSON output, rich consoles."""

from __future__ import annotations

import contextlib
import enum
import json
import os
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from coreai_opt.errors import printable

EXIT_OK = 0
EXIT_USER_ERROR = 1  # bad input: a file, its contents, the environment
EXIT_USAGE = 2  # bad options or option values (click's own code for usage errors)

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def plain(text: object) -> str:
    """Text from a file as it may be printed: each unprintable character as its escape
    (`\\x1b`, `\\ud800`), so a name cannot drive the terminal or fail to encode - the library's
    one rule (`coreai_opt.io.printable`), which its own warnings keep too."""
    return printable(text)


def shown(text: object) -> str:
    """`plain` text that is also safe inside rich markup (`[bold]` in a name stays text)."""
    return escape(plain(text))


def error_document(message: str, exit_code: int, **details: Any) -> dict[str, Any]:
    """What `--json` prints on stdout when a command fails (the one-line error still goes to stderr)."""
    return {"error": {"message": message, "exit_code": exit_code, **details}}


def fail(message: str, as_json: bool = False, path: Any = None) -> NoReturn:
    """One line on stderr (and a JSON error object on stdout with --json), exit code 1: the
    contract every command keeps for bad input."""
    line = plain(" ".join(str(message).split()))
    if as_json:
        print_json(error_document(line, EXIT_USER_ERROR, **({"path": str(path)} if path is not None else {})))
    sys.stderr.write(f"error: {line}\n")
    sys.stderr.flush()
    raise typer.Exit(EXIT_USER_ERROR)


@contextlib.contextmanager
def user_errors(as_json: bool = False, flags: Mapping[str, str] | None = None) -> Iterator[None]:
    """Turn every failure inside a command into one line and exit code 1; an invalid option value
    the library finds late (a `ConfigError` naming one of `flags`) exits 2 as `option_errors` does.

    Set COREOPT_DEBUG=1 to let unexpected exceptions through with their traceback.
    """
    from coreai_opt.errors import ConfigError
    from coreai_opt.io import ModelFileError

    try:
        yield
    except (typer.Exit, typer.Abort, KeyboardInterrupt, typer.BadParameter):
        raise
    except ConfigError as exc:
        if flags and any(f in flags for f in exc.fields):
            raise bad_parameter(exc, flags) from None
        fail(str(exc), as_json)
    except ModelFileError as exc:
        fail(str(exc), as_json, exc.path)
    except (ValueError, OSError, ImportError) as exc:  # ImportError: an optional extra not installed
        fail(str(exc), as_json)
    except Exception as exc:
        if os.environ.get("COREOPT_DEBUG"):
            raise
        fail(f"unexpected {type(exc).__name__}: {exc} (set COREOPT_DEBUG=1 for a traceback)", as_json)


@contextlib.contextmanager
def option_errors(flags: Mapping[str, str], default: str | None = None) -> Iterator[None]:
    """Invalid option values exit 2 naming the flag, as click's own checks do. `flags` maps the
    library's parameter names (a `ConfigError`'s `fields`) to this command's flags; messages say the
    flag instead of the parameter (except inside an --override, whose syntax uses the names)."""
    try:
        yield
    except ValueError as exc:
        raise bad_parameter(exc, flags, default) from None
    except ImportError as exc:  # an optional extra (matplotlib for --plot) not installed: one line, exit 1
        fail(str(exc))


def bad_parameter(
    exc: ValueError, flags: Mapping[str, str], default: str | None = None
) -> typer.BadParameter:
    fields = getattr(exc, "fields", ())
    flag = next((flags[f] for f in fields if f in flags), default)
    message = " ".join(str(exc).split())
    if "overrides" not in fields:  # the error's own fields, and names no English word can be (with a _)
        for name, option in flags.items():
            if name in fields or "_" in name:
                message = re.sub(rf"(?<![\w-]){re.escape(name)}\b", option, message)
    return typer.BadParameter(message, param_hint=flag)


def quiet_library_warnings() -> None:
    """The deprecation notes torch and its kin print are for their callers, not for a user of
    this command: a valid command's stderr is empty, a failing one's is one line."""
    import warnings

    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings(
            "ignore", category=category, module=r"(torch|transformers|coreai_torch)(\.|$)"
        )
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)


# typer checks option values with pydantic, whose messages speak of "Input" and "Value error": ours
# say what the option must be.
_PYDANTIC_WORDS = (
    (re.compile(r"^Value error, "), ""),
    (re.compile(r"^Input should be greater than or equal to "), "must be at least "),
    (re.compile(r"^Input should be less than or equal to "), "must be at most "),
    (re.compile(r"^Input should be greater than "), "must be above "),
    (re.compile(r"^Input should be less than "), "must be below "),
    (re.compile(r"^Input should be a valid integer.*"), "must be a whole number"),
    (re.compile(r"^Input should be a valid number.*"), "must be a number"),
    (re.compile(r"^Input should be "), "must be "),
)


def plain_words(message: str) -> str:
    """A usage error's message with pydantic's phrasing said in ours."""
    for pattern, words in _PYDANTIC_WORDS:
        message = pattern.sub(words, message)
    return message


def run(app: typer.Typer) -> None:
    """Run a CLI as its console script: usage errors exit 2 as click prints them, and with --json
    also print a JSON error object on stdout, as every other failure does."""
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as exc:  # click's usage errors (typer carries its own click)
        exit_code = getattr(exc, "exit_code", EXIT_USAGE)
        if isinstance(getattr(exc, "message", None), str):
            exc.message = plain_words(exc.message)
        if "--json" in sys.argv[1:]:
            print_json(error_document(" ".join(exc.format_message().split()), exit_code))
        exc.show()
        sys.exit(exit_code)
    except typer.Abort:
        sys.stderr.write("Aborted!\n")
        sys.exit(EXIT_USER_ERROR)
    sys.exit(code if isinstance(code, int) else EXIT_OK)


def choices(name: str, members: tuple[enum.Enum | str, ...]) -> type[enum.StrEnum]:
    """A CLI choice type offering exactly the library's members (by their values; plain strings as they are)."""
    values = [getattr(m, "value", m) for m in members]
    return enum.StrEnum(name, {v: v for v in values})  # type: ignore[return-value]


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


def quiet_option() -> Any:
    return typer.Option(
        False, "--quiet", "-q", help="Print one summary line instead of tables (for CI logs)."
    )


def json_option() -> Any:
    return typer.Option(False, "--json", help="Print one JSON document instead of tables.")


def trust_pickle_option() -> Any:
    return typer.Option(
        False,
        "--trust-pickle",
        help="Let a .pt2 run the pickles and code it holds, and skip the check of its program (names, "
        "operator allowlist, sizes). Off by default: a .pt2 from someone else can run any command "
        "when torch loads it; use this only for files you made yourself.",
    )


def allow_empty_option() -> Any:
    return typer.Option(
        False,
        "--allow-empty",
        help="Write the output even when the options changed nothing (nothing compressed, a pattern or op "
        "name that matches nothing); without it such a run exits 1 and writes nothing.",
    )


def force_option() -> Any:
    return typer.Option(False, "--force", help="Overwrite an existing output.")


def load_plugins() -> None:
    """The registry's plugins loaded before the commands are built; one line on stderr for each
    that failed (the rest of the CLI works without it)."""
    from coreai_opt.compression import load_plugins as load

    for name, problem in load().items():
        if problem is not None:
            Console(stderr=True).print(f"coreopt: plugin {name!r} was not loaded ({problem})", markup=False)
