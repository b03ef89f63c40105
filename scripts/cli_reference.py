"""The reference part of docs/cli.md: every command's `--help`, as the CLI prints it.

    python scripts/cli_reference.py write    # rewrite the part below the marker
    python scripts/cli_reference.py check    # exit 1 when docs/cli.md is out of date

The help comes from the commands themselves (their options from the configs' fields), so the
reference cannot drift from the code; 100 columns, no colour.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "cli.md"
MARKER = "<!-- reference: generated below by scripts/cli_reference.py; do not edit by hand -->"


def _help(app: object, args: list[str]) -> str:
    from typer.testing import CliRunner

    result = CliRunner().invoke(
        app, [*args, "--help"], env={"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}
    )
    lines = [line.rstrip() for line in result.stdout.splitlines()]
    return "\n".join(lines).strip("\n").replace("python -m cli.coreopt_app", "coreopt")


def reference() -> str:
    """The markdown of every command's help, in the order `coreopt --help` lists them."""
    sys.path[:0] = [str(ROOT)]
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    from cli.coreopt_app import app
    from cli.tcast_app import app as tcast_app

    names = [c.name or c.callback.__name__ for c in app.registered_commands]  # type: ignore[union-attr]
    parts = ["## Reference", "", "### coreopt", "", "```text", _help(app, []), "```"]
    for name in names:
        parts += ["", f"### coreopt {name}", "", "```text", _help(app, [name]), "```"]
    parts += ["", "### tcast", "", "```text", _help(tcast_app, []), "```"]
    return "\n".join(parts) + "\n"


def current() -> str:
    text = DOC.read_text()
    return text[: text.index(MARKER) + len(MARKER)] + "\n\n" + reference()


def main() -> None:
    action = sys.argv[1] if len(sys.argv) > 1 else "check"
    wanted = current()
    if action == "write":
        DOC.write_text(wanted)
        return
    sys.exit(0 if DOC.read_text() == wanted else 1)


if __name__ == "__main__":
    main()
