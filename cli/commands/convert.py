"""`coreopt convert`: a `.pt2` to a Core AI asset (a one-step recipe)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import typer

from .._common import (
    err_console,
    force_option,
    json_option,
    print_json,
    quiet_option,
    shown,
    trust_pickle_option,
    user_errors,
)


def register(app: typer.Typer) -> None:
    app.command()(convert)


def convert(
    model: Path = typer.Argument(
        ..., help="The .pt2 file to convert (exported with coreai-torch's decompositions)."
    ),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Output .aimodel (default: beside the input)."
    ),
    force: bool = force_option(),
    trust_pickle: bool = trust_pickle_option(),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Convert a torch.export program to a Core AI asset through coreai-torch.

    Example: coreopt convert sample_models/mlp.pt2 -o build/mlp.aimodel
    """
    from coreai_opt.inspection import inspect_model
    from coreai_opt.recipes import convert_file

    from ..render import conversion_line, print_line, render_conversion

    with user_errors(as_json):
        with (
            err_console.status(f"converting {shown(model)} ...", spinner="dots")
            if not (as_json or quiet)
            else contextlib.nullcontext()
        ):
            result = convert_file(model, output, force=force, trust_pickle=trust_pickle)
        report = inspect_model(result.output)
    if as_json:
        print_json(
            {
                "source": str(result.source),
                "output": str(result.output),
                "seconds": round(result.seconds, 4),
                "converter_log": result.converter_log,
                "model": report.to_dict(),
            }
        )
    elif quiet:
        print_line(conversion_line(result, report))
    else:
        render_conversion(result, report)
