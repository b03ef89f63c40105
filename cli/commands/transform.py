"""`coreopt transform`: an equivalent float program whose weights a format represents better
(norms folded, the residual stream rotated), checked against the input's outputs before it is
written (a one-step recipe)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

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

_FLAGS = {"rotation": "--rotate", "seed": "--seed", "tolerance": "--tolerance", "samples": "--samples"}


def register(app: typer.Typer) -> None:
    app.command()(transform)


def transform(
    model: Path = typer.Argument(..., help="The .pt2 file to transform (it is never modified)."),
    rotate: str | None = typer.Option(
        None,
        "--rotate",
        help="Rotate the residual stream: hadamard (random signs x Hadamard) or random (Haar).",
    ),
    fold_norms: bool = typer.Option(
        False,
        "--fold-norms",
        help="Only fold every norm's scale into the linears that read it (--rotate does it too).",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the rotation's random signs / matrix."),
    tolerance: float = typer.Option(
        1e-5,
        "--tolerance",
        help="Largest relative RMS difference of any output from the input's, on seeded inputs.",
    ),
    samples: int = typer.Option(2, "--samples", help="How many seeded inputs the check runs."),
    output: Path | None = typer.Option(
        None,
        "-o",
        "--output",
        help="Output .pt2 (default: model.rotated.pt2 / model.folded.pt2 beside the input).",
    ),
    force: bool = force_option(),
    trust_pickle: bool = trust_pickle_option(),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Write an equivalent .pt2 whose weights compress with less error.

    Norms are folded into the linears that read them and the residual stream is rotated by an
    orthogonal matrix folded into the weights. The result is checked against the input on seeded
    inputs and refused beyond --tolerance; every compression command works on it unchanged.

    Example: coreopt transform model.pt2 --rotate hadamard -o model.rot.pt2

    Example: coreopt transform model.pt2 --fold-norms --json
    """
    from coreai_opt.recipes import Recipe, Transform, apply_recipe

    with user_errors(as_json, _FLAGS):
        step = Transform(config=_config(rotate, fold_norms, seed, tolerance, samples))
        with (
            err_console.status(f"transforming {shown(model)} ...", spinner="dots")
            if not (as_json or quiet)
            else contextlib.nullcontext()
        ):
            result = apply_recipe(Recipe((step,)), model, output, force=force, trust_pickle=trust_pickle)
    _show(result, as_json, quiet)


def _config(rotate: str | None, fold_norms: bool, seed: int, tolerance: float, samples: int) -> Any:
    from coreai_opt.errors import ConfigError
    from coreai_opt.transforms import FoldNormsConfig, RotateConfig

    if rotate is None and not fold_norms:
        raise ConfigError("nothing to do: give --rotate hadamard|random or --fold-norms", "rotation")
    if rotate is not None:
        return RotateConfig(rotation=rotate, seed=seed, tolerance=tolerance, samples=samples)
    return FoldNormsConfig(tolerance=tolerance, samples=samples)


def _show(result: Any, as_json: bool, quiet: bool) -> None:
    from ..render import print_line, render_transform, transform_line

    report = result.steps[0][1]
    if as_json:
        print_json({"source": str(result.source), "output": str(result.output), "seconds": result.seconds,
                    **report.to_dict()})  # fmt: skip
    elif quiet:
        print_line(transform_line(result.output, report))
    else:
        render_transform(result.source, result.output, result.seconds, report)
