"""`coreopt`: inspect, convert, cast, compress, compare and apply recipes to models for Core AI.

Each command is a module of `cli.commands` (parse, call one library function, render); the
compression commands' options are their configs' fields.
"""

from __future__ import annotations

import typer

from coreai_opt import __version__

from ._common import load_plugins, quiet_library_warnings, run, version_option
from .commands import (
    apply,
    cast,
    compare,
    compress,
    convert,
    evaluate,
    export,
    generate,
    inspect,
    optimize,
    sensitivity,
    transform,
)

app = typer.Typer(
    name="coreopt",
    help="Shrink PyTorch models for Apple's Core AI stack.\n\nExample: coreopt inspect sample_models/mlp.aimodel",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(version: bool = version_option("coreopt", __version__)) -> None:
    """Shrink PyTorch models for Apple's Core AI stack."""
    quiet_library_warnings()


load_plugins()  # installed packages' passes and algorithms get their commands and methods
for _command in (
    inspect,
    export,
    convert,
    cast,
    transform,
    compress,
    compare,
    evaluate,
    sensitivity,
    optimize,
    apply,
    generate,
):
    _command.register(app)


def main() -> None:
    run(app)


if __name__ == "__main__":
    main()
