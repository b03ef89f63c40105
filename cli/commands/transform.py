"""`coreopt transform`: an equivalent float program whose weights a format represents better
(norms folded, the residual stream rotated, channels scaled), checked against the input's
outputs before it is written (a recipe of one step per transform asked for)."""

from __future__ import annotations

import contextlib
import inspect
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
from .._config_options import keyword
from .._progress import weight_progress
from ._weights import calibration_parameters

_FLAGS = {"rotation": "--rotate", "seed": "--seed", "tolerance": "--tolerance", "samples": "--samples",
          "method": "--scale", "alpha": "--scale-alpha", "bits": "--bits", "steps": "--steps", "group_size": "--scale-group-size", "source": "--calibration",
          "tokens": "--calibration-tokens"}  # fmt: skip
_CALIBRATION = ("calibration", "calibration_samples", "calibration_tokens", "device")
_DOC = """Write an equivalent .pt2 whose weights compress with less error.

    Norms are folded into the linears that read them, the residual stream is rotated by an
    orthogonal matrix folded into the weights (--rotate) and channels are scaled between each
    activation and its readers by scales searched on calibration data (--scale awq). The result
    is checked against the input on seeded inputs (both computed in float64) and refused beyond
    --tolerance; every compression command works on it unchanged.

    Example: coreopt transform model.pt2 --rotate hadamard -o model.rot.pt2

    Example: coreopt transform model.pt2 --rotate hadamard --scale awq --calibration text.txt --json
    """


def register(app: typer.Typer) -> None:
    app.command(name="transform")(_command())


def _command() -> Any:
    def transform(**values: Any) -> None:
        _run(values)

    own = [
        keyword("model", typer.Argument(..., help="The .pt2 file to transform (it is never modified)."), Path),
        keyword("rotate", typer.Option(None, "--rotate", help="Rotate the residual stream: hadamard (random signs x Hadamard), random (Haar) or learned (from hadamard, on --calibration)."), str | None),
        keyword("scale", typer.Option(None, "--scale", help="Scale channels between activations and their readers: awq (weights; searched) or smooth (W8A8: SmoothQuant), on --calibration."), str | None),
        keyword("scale_alpha", typer.Option(0.5, "--scale-alpha", help="smooth: the migration strength (0: none, 1: all of the range into the weights)."), float),
        keyword("scale_bits", typer.Option(4, "--bits", help="Bits of the round to nearest that --scale awq and --rotate learned aim at."), int),
        keyword("scale_group_size", typer.Option(0, "--scale-group-size", help="Its inputs per scale (0: one scale per output channel)."), int),
        keyword("fold_norms", typer.Option(False, "--fold-norms", help="Only fold every norm's scale into the linears that read it (--rotate does it too)."), bool),
        keyword("heads", typer.Option(False, "--heads", help="--rotate: also each attention layer's values and outputs, head by head."), bool),
        keyword("seed", typer.Option(0, "--seed", help="Seed of the rotation's random signs / matrix."), int),
        keyword("steps", typer.Option(300, "--steps", help="--rotate learned: optimisation steps (one layer's weights each)."), int),
        keyword("tolerance", typer.Option(None, "--tolerance", help="Largest relative RMS difference of any output from the input's, both computed in float64 (in their own dtypes where an op has no float64 kernel) on seeded inputs (default: 10 machine epsilons of the weights' coarsest float dtype: 1.2e-6 for float32, 9.8e-3 for float16)."), float | None),
        keyword("samples", typer.Option(2, "--samples", help="How many seeded inputs the check runs."), int),
        keyword("output", typer.Option(None, "-o", "--output", help="Output .pt2 (default: model.<rotated|scaled|folded>.pt2 beside the input)."), Path | None),
    ]  # fmt: skip
    calibration = [p for p in calibration_parameters() if p.name in _CALIBRATION]
    common = [keyword("force", force_option(), bool), keyword("trust_pickle", trust_pickle_option(), bool),
              keyword("quiet", quiet_option(), bool), keyword("as_json", json_option(), bool)]  # fmt: skip
    transform.__signature__ = inspect.Signature([*own, *calibration, *common])  # type: ignore[attr-defined]
    transform.__doc__ = _DOC
    return transform


def _run(values: dict[str, Any]) -> None:
    from coreai_opt.recipes import Recipe, apply_recipe

    as_json, quiet, model = values["as_json"], values["quiet"], values["model"]
    talk = not (as_json or quiet)
    with user_errors(as_json, _FLAGS):
        recipe = Recipe(_steps(values), _calibration(values))
        learns = any(step.config.learns() for step in recipe.steps)  # steps to count: a bar with an ETA
        with (
            weight_progress(talk, "learning") if learns else contextlib.nullcontext()
        ) as progress, (
            err_console.status(f"transforming {shown(model)} ...", spinner="dots")
            if talk and not learns
            else contextlib.nullcontext()
        ):  # fmt: skip
            result = apply_recipe(recipe, model, values["output"], force=values["force"],
                                  trust_pickle=values["trust_pickle"], progress=progress)  # fmt: skip
    _show(result, as_json, quiet)


def _steps(values: dict[str, Any]) -> tuple[Any, ...]:
    from coreai_opt.errors import ConfigError
    from coreai_opt.recipes import Transform
    from coreai_opt.transforms import FoldNormsConfig, RotateConfig, ScaleConfig

    check = {"tolerance": values["tolerance"], "samples": values["samples"]}
    steps = []
    if values["rotate"] is not None:
        steps.append(RotateConfig(rotation=values["rotate"], seed=values["seed"], steps=values["steps"], heads=values["heads"],
                                  bits=values["scale_bits"], **check))  # fmt: skip
    elif values["fold_norms"]:
        steps.append(FoldNormsConfig(**check))
    if values["scale"] is not None:
        steps.append(ScaleConfig(method=values["scale"], bits=values["scale_bits"],
                                 group_size=values["scale_group_size"], alpha=values["scale_alpha"], **check))  # fmt: skip
    if not steps:
        raise ConfigError("nothing to do: give --rotate, --scale or --fold-norms", "rotation")
    learning = [f"--{c.KIND} {c.rotation if c.KIND == 'rotate' else c.method}" for c in steps if c.learns()]
    if learning and values["calibration"] is None:
        raise ConfigError(f"{' and '.join(learning)} learn from data: give --calibration", "source")
    return tuple(Transform(config=config) for config in steps)


def _calibration(values: dict[str, Any]) -> Any:
    from coreai_opt.calibration import CalibrationSpec

    if values["calibration"] is None:
        return None
    return CalibrationSpec(source=str(values["calibration"]), samples=values["calibration_samples"],
                           tokens=values["calibration_tokens"], device=values["device"])  # fmt: skip


def _show(result: Any, as_json: bool, quiet: bool) -> None:
    from ..render import print_line, render_transform, transform_line

    reports = [report for _, report in result.steps]
    if as_json:
        print_json({"source": str(result.source), "output": str(result.output), "seconds": result.seconds,
                    "transforms": [report.to_dict() for report in reports]})  # fmt: skip
        return
    for report in reports:
        if quiet:
            print_line(transform_line(result.output, report))
        else:
            render_transform(result.source, result.output, result.seconds, report)
