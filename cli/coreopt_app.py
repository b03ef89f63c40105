"""`coreopt`: inspect, convert, cast (and, as they land, compress) models for Core AI."""

from __future__ import annotations

import contextlib
import enum
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


class CastTo(enum.StrEnum):
    fp16 = "fp16"
    int16 = "int16"
    both = "16bit"


@app.command()
def cast(
    model: Path = typer.Argument(..., help="The .pt2 file to cast (it is never modified)."),
    to: CastTo = typer.Option(
        CastTo.both, "--to", help="fp16 (FP32->FP16), int16 (INT32/64->INT16) or 16bit (both)."
    ),
    output: Path | None = typer.Option(
        None,
        "-o",
        "--output",
        help="Output .pt2 (default: model.fp16.pt2 / .int16.pt2 / .16bit.pt2 beside the input).",
    ),
    ignore_op: list[str] = typer.Option(
        [],
        "--ignore-op",
        help="Run this op in fp32 (e.g. aten.exp.default, or aten.exp for every overload). Repeatable.",
    ),
    check: bool = typer.Option(
        True, "--check/--no-check", help="Run original and cast program and compare outputs."
    ),
    inputs: Path | None = typer.Option(
        None,
        "--inputs",
        help="safetensors file with one tensor per user input (by input name) for the check.",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the random check inputs."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of tables."),
) -> None:
    """Cast a torch.export program to 16 bits and report every dtype it changed.

    Example: coreopt cast sample_models/transformer.pt2 --to 16bit -o build/transformer.16bit.pt2

    Example: coreopt cast model.pt2 --to fp16 --ignore-op aten.exp.default --json
    """
    from coreai_opt.casting import cast_file

    from ._render import render_cast

    with (
        user_errors(),
        err_console.status(f"casting {model} ...", spinner="dots")
        if not as_json
        else contextlib.nullcontext(),
    ):
        result = cast_file(
            model,
            to.value,
            output,
            ignored_ops=tuple(ignore_op),
            check=check,
            inputs=inputs,
            seed=seed,
            force=force,
        )
    if as_json:
        print_json(result.to_dict())
    else:
        render_cast(result)
    if result.check is not None and not result.check.ok:
        raise typer.Exit(1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
