"""`coreopt apply RECIPE MODEL -o OUT`: run a recipe file's steps on a model."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from .._common import (
    allow_empty_option,
    force_option,
    json_option,
    plain,
    print_json,
    quiet_option,
    trust_pickle_option,
    user_errors,
)
from .._progress import weight_progress


def register(app: typer.Typer) -> None:
    app.command()(apply)


def apply(
    recipe: Path = typer.Argument(
        ..., help="A recipe file (.json, or .yaml / .yml): an ordered list of steps."
    ),
    model: Path = typer.Argument(..., help="The .pt2 or .aimodel to run it on (never modified)."),
    output: Path | None = typer.Option(
        None,
        "-o",
        "--output",
        help="Output file (default: model.<each step's tag>.<suffix> beside the input).",
    ),
    allow_empty: bool = allow_empty_option(),
    force: bool = force_option(),
    trust_pickle: bool = trust_pickle_option(),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Run a recipe - compress, quantize activations, cast, convert, check a budget, in its order - on a
    model, loading it once and writing the result once.

    Example: coreopt apply recipe.yaml model.pt2 -o model.lut4.fp16.aimodel

    Example: coreopt apply optimized.json model.pt2 --json   (a recipe coreopt optimize wrote)
    """
    from coreai_opt.recipes import Recipe, apply_recipe

    with user_errors(as_json), weight_progress(not (as_json or quiet), "compressing") as progress:
        steps = Recipe.load(recipe)
        result = apply_recipe(steps, model, output, force=force, progress=progress, trust_pickle=trust_pickle,
                              allow_empty=allow_empty)  # fmt: skip
    if as_json:
        print_json(result.to_dict())
    else:
        _render(result, quiet)
    if result.failed is not None:
        kept = f"written to {result.output}" if result.written else "nothing written"
        sys.stderr.write(plain(f"error: {model}: the {result.failed} failed; {kept}\n"))
        raise typer.Exit(1)


def _render(result: Any, quiet: bool) -> None:
    from ..render import cast_line, compression_line, print_line, render_cast, render_compression

    for kind, step in result.steps:
        if kind == "compress" and not quiet:
            render_compression(step)
        elif kind == "cast" and not quiet:
            render_cast(step)
        elif kind == "compress":
            print_line(compression_line(step))
        elif kind == "cast":
            print_line(cast_line(step))
        elif kind == "budget":
            verdict = "ok" if step.ok else "EXCEEDED"
            print_line(f"budget: {step.weight_bytes:,} weight bytes, at most {step.max_bytes:,}: {verdict}")
        elif kind == "convert":
            print_line(f"converted to a Core AI program in {step.seconds:.1f} s")
        elif kind == "transform":
            eq = step.equivalence
            print_line(
                f"transformed ({step.kind}): {len(step.changes)} changes, outputs within {eq.relative_rms:.2g} (relative RMS)"
            )
        elif kind == "kv_cache":
            print_line(step.line())
        elif kind == "quantize_activations":
            print_line(f"weights and activations quantized on {step.samples} samples from {step.calibration}")
    state = "written" if result.written else "not written"
    print_line(
        f"apply: {result.source} -> {result.output} ({state}), {len(result.steps)} steps, {result.seconds:.1f} s"
    )
