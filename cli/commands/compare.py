"""`coreopt compare`: run a reference and candidates on the same samples and measure agreement."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from .._common import (
    json_option,
    option_errors,
    print_json,
    quiet_option,
    trust_pickle_option,
    user_errors,
)
from .._progress import weight_progress


def register(app: typer.Typer) -> None:
    app.command()(compare)


_REFERENCE = typer.Argument(
    ..., help="The reference .aimodel or .pt2 (e.g. before compression; a .pt2 runs in PyTorch)."
)
_CANDIDATES = typer.Argument(
    ..., help="One or more .aimodel or .pt2 files to check against it (several: one row each)."
)
_INPUTS = typer.Option(
    None,
    "--inputs",
    help="Real samples: a safetensors file with one tensor per model input, by input name (N samples: "
    "[N, *shape], or [N, ...] for an input of [1, ...]), or a directory of such files.",
)
_SAMPLES = typer.Option(
    1, "--samples", min=1, help="Number of seeded random samples when no --inputs are given."
)
_SEED = typer.Option(0, "--seed", help="Seed of the random inputs.")
_INT_RANGE = typer.Option(
    None,
    "--int-range",
    help="Draw every integer input from [LOW, HIGH), e.g. 0:100 (default: ids from the table they "
    "index, masks and flags from {0, 1}).",
)
_MIN_COSINE = typer.Option(
    None, "--min-cosine", help="Exit 1 when any output's cosine falls below this (for CI)."
)
_CSV = typer.Option(False, "--csv", help="Print one CSV row per candidate instead of tables.")
_PLOT = typer.Option(
    None, "--plot", help="Also write a size-vs-accuracy plot as PNG here (pip install 'coreopt\\[plot]')."
)


def compare(
    reference: Path = _REFERENCE,
    candidates: list[Path] = _CANDIDATES,
    inputs: Path | None = _INPUTS,
    samples: int = _SAMPLES,
    seed: int = _SEED,
    int_range: str | None = _INT_RANGE,
    min_cosine: float | None = _MIN_COSINE,
    as_csv: bool = _CSV,
    plot: Path | None = _PLOT,
    trust_pickle: bool = trust_pickle_option(),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Run models on the same samples; per output cosine, SNR and max abs error.

    An .aimodel runs on the Core AI runtime, a .pt2 in PyTorch (compressed weights decoded once).
    Over several samples each metric is its worst sample's, with the mean cosine and SNR beside it.
    With several candidates the reference runs once and each candidate gets one row: size on disk,
    bits per weight, cosine mean/min and SNR (a size/accuracy sweep).

    Example: coreopt compare sample_models/transformer.aimodel build/t.int8.aimodel --min-cosine 0.999

    Example: coreopt compare sample_models/transformer.pt2 build/t4.pt2 --min-cosine 0.99

    Example: coreopt compare ref.aimodel cand.aimodel --inputs batch.safetensors --json

    Example: coreopt compare model.pt2 model.int4.pt2 --samples 16

    Example: coreopt compare ref.aimodel a.aimodel b.aimodel c.aimodel --inputs samples/ --csv --plot sweep.png
    """
    parsed_range = _checked(inputs, samples, int_range, as_csv, as_json, plot)
    options = {"inputs": inputs, "samples": samples, "seed": seed, "int_range": parsed_range,
               "min_cosine": min_cosine, "trust_pickle": trust_pickle}  # fmt: skip
    result, one = _run(reference, candidates, options, plot, as_json, as_csv, quiet)
    _show(result, one, as_csv, as_json, quiet)
    if result.ok is False:
        raise typer.Exit(1)


def _checked(inputs: Path | None, samples: int, int_range: str | None, as_csv: bool, as_json: bool,
             plot: Path | None) -> Any:  # fmt: skip
    """The usage errors, before any model loads; returns the parsed --int-range."""
    from coreai_opt.comparison import check_plot_path, parse_int_range

    if inputs is not None and samples != 1:
        raise typer.BadParameter("give --inputs or --samples, not both", param_hint="--samples")
    if as_csv and as_json:
        raise typer.BadParameter("give --csv or --json, not both", param_hint="--csv")
    with option_errors({}, "--int-range"):
        parsed_range = parse_int_range(int_range) if int_range is not None else None
    if plot is not None:
        with option_errors({}, "--plot"):
            check_plot_path(plot)
    return parsed_range


def _run(reference: Path, candidates: list[Path], options: dict[str, Any], plot: Path | None, as_json: bool,
         as_csv: bool, quiet: bool) -> tuple[Any, Any]:  # fmt: skip
    """(the sweep or comparison, the one comparison to show when there is one candidate)."""
    from coreai_opt.comparison import compare_files, compare_sweep, plot_sweep

    flags = {"min_cosine": "--min-cosine", "samples": "--samples"}
    bar = not (as_json or quiet)  # with --csv too: a bar or log lines go to stderr
    with user_errors(as_json, flags), weight_progress(bar, "comparing") as progress:
        # a sweep's rows inspect every model for its size: only when rows are asked for
        sweep = len(candidates) > 1 or as_csv or plot is not None
        result = (
            compare_sweep(reference, candidates, progress=progress, **options)
            if sweep
            else compare_files(reference, candidates[0], progress=progress, **options)
        )
        if plot is not None:
            plot_sweep(result, plot)
    # one candidate is shown as its comparison, every output of it
    one = None if len(candidates) > 1 else (result.comparisons[0] if sweep else result)
    return result, one


def _show(result: Any, one: Any, as_csv: bool, as_json: bool, quiet: bool) -> None:
    from ..render import comparison_line, print_line, render_comparison, render_sweep, sweep_line

    if as_csv:
        sys.stdout.write(result.to_csv())
    elif as_json:
        print_json((one or result).to_dict())
    elif quiet:
        print_line(comparison_line(one) if one is not None else sweep_line(result))
    elif one is not None:
        render_comparison(one)
    else:
        render_sweep(result)
