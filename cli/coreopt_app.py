"""`coreopt`: inspect, convert (and, as they land, cast and compress) models for Core AI."""

from __future__ import annotations

import contextlib
from pathlib import Path

import typer

from coreai_opt import __version__

from ._common import err_console, print_json, user_errors, version_option

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


@app.command()
def inspect(
    model: Path = typer.Argument(..., help="A .pt2 (torch.export) or .aimodel (Core AI) file."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of tables."),
) -> None:
    """Show inputs, outputs, an op histogram and how every weight is stored.

    Example: coreopt inspect sample_models/transformer.aimodel --json
    """
    from coreai_opt.inspection import inspect_model

    from ._render import render_model_report

    with user_errors():
        report = inspect_model(model)
    if as_json:
        print_json(report.to_dict())
    else:
        render_model_report(report)


@app.command()
def convert(
    model: Path = typer.Argument(
        ..., help="The .pt2 file to convert (exported with coreai-torch's decompositions)."
    ),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Output .aimodel (default: beside the input)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of tables."),
) -> None:
    """Convert a torch.export program to a Core AI asset through coreai-torch.

    Example: coreopt convert sample_models/mlp.pt2 -o build/mlp.aimodel
    """
    from coreai_opt.conversion import convert_file
    from coreai_opt.inspection import inspect_model

    from ._render import render_conversion

    with user_errors():
        with (
            err_console.status(f"converting {model} ...", spinner="dots")
            if not as_json
            else contextlib.nullcontext()
        ):
            result = convert_file(model, output, force=force)
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
    else:
        render_conversion(result, report)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
