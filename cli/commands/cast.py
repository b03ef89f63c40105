"""`coreopt cast`: the 16-bit casts of a `.pt2`, checked against the original (a one-step recipe)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import typer

from coreai_opt.casting import CastTarget  # an enum in a module of its own: no torch behind it

from .._common import (
    allow_empty_option,
    err_console,
    force_option,
    json_option,
    plain,
    print_json,
    quiet_option,
    shown,
    trust_pickle_option,
    user_errors,
)


def register(app: typer.Typer) -> None:
    app.command()(cast)


_MODEL = typer.Argument(..., help="The .pt2 file to cast (it is never modified).")
_TO = typer.Option(
    CastTarget.BOTH.value, "--to", help="fp16 (FP32->FP16), int16 (INT32/64->INT16) or 16bit (both)."
)
_OUTPUT = typer.Option(
    None,
    "-o",
    "--output",
    help="Output .pt2 (default: model.fp16.pt2 / .int16.pt2 / .16bit.pt2 beside the input).",
)
_IGNORE_OP = typer.Option(
    [],
    "--ignore-op",
    help="Run this op in fp32 (e.g. aten.exp.default, or aten.exp for every overload). Repeatable.",
)
_CHECK = typer.Option(True, "--check/--no-check", help="Run original and cast program and compare outputs.")
_INPUTS = typer.Option(
    None,
    "--inputs",
    help="safetensors file with one tensor per user input (by input name) for the check.",
)
_SEED = typer.Option(0, "--seed", help="Seed of the random check inputs.")
_KEEP_FAILED = typer.Option(
    False, "--keep-failed", help="Write the output even when it fails its check (exit code 1 still)."
)


def cast(
    model: Path = _MODEL,
    to: CastTarget = _TO,
    output: Path | None = _OUTPUT,
    ignore_op: list[str] = _IGNORE_OP,
    check: bool = _CHECK,
    inputs: Path | None = _INPUTS,
    seed: int = _SEED,
    keep_failed: bool = _KEEP_FAILED,
    allow_empty: bool = allow_empty_option(),
    force: bool = force_option(),
    trust_pickle: bool = trust_pickle_option(),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Cast a torch.export program to 16 bits and report every dtype it changed.

    Example: coreopt cast sample_models/transformer.pt2 --to 16bit -o build/transformer.16bit.pt2

    Example: coreopt cast model.pt2 --to fp16 --ignore-op aten.exp.default --json
    """
    from coreai_opt.recipes import cast_file

    with (
        user_errors(as_json, {"ignored_ops": "--ignore-op"}),
        err_console.status(f"casting {shown(model)} ...", spinner="dots")
        if not (as_json or quiet)
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
            trust_pickle=trust_pickle,
            allow_empty=allow_empty,
            keep_failed=keep_failed,
        )
    _show(result, as_json, quiet)
    if result.check is not None and not result.check.ok:
        _fail(model, result)


def _show(result: Any, as_json: bool, quiet: bool) -> None:
    """The cast's report in the form asked for: JSON, one line, or the tables."""
    from ..render import cast_line, print_line, render_cast

    if as_json:
        print_json(result.to_dict())
    elif quiet:
        print_line(cast_line(result))
    else:
        render_cast(result)


def _fail(model: Path, result: Any) -> None:
    """Exit 1 for a cast that fails its check, saying whether the file was written anyway."""
    kept = (
        f"written to {result.output} as asked" if result.written else "not written (--keep-failed writes it)"
    )
    sys.stderr.write(
        plain(f"error: {model}: the cast program fails its check against the original; {kept}\n")
    )
    raise typer.Exit(1)
