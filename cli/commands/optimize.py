"""`coreopt optimize`: a setting per weight - the smallest model within an accuracy bound, or the
most accurate within a size."""

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
from pathlib import Path
from typing import Any

import typer

from coreai_opt.compression import flag_names
from coreai_opt.optimization import OptimizeConfig

from .._common import (
    force_option,
    human_bytes,
    json_option,
    option_errors,
    print_json,
    quiet_option,
    shown,
    user_errors,
)
from .._config_options import config_from_options, config_parameters, keyword
from .._progress import weight_progress
from ._weights import kmeans_kernels, palettizes


def register(app: typer.Typer) -> None:
    app.command("optimize")(optimize)


_MODEL = typer.Argument(..., help="The .pt2 to optimize (e.g. from coreopt export); never modified.")
_CALIBRATION = typer.Option(
    ...,
    "--calibration",
    help="Data the estimates and the methods learn from: a text file (language models), a safetensors "
    "file or folder of inputs, or 'random'.",
)
_EVAL = typer.Option(
    None,
    "--eval",
    help="Data the plan is confirmed on (never the calibration data): a text file or token ids "
    "(language models), else a safetensors file or folder of inputs.",
)
_TARGET_BITS = typer.Option(
    None, "--target-bits", help="Budget: mean bits per weight (LUTs, scales, masks counted as stored)."
)
_MAX_SIZE = typer.Option(None, "--max-size", help="Budget: the file's size in MB (10^6 bytes).")
_MAX_PPL = typer.Option(
    None, "--max-ppl-increase", help="Bound: perplexity at most this many percent above the model's."
)
_MAX_KL = typer.Option(None, "--max-kl", help="Bound: mean KL per token at most this.")
_MIN_COSINE = typer.Option(
    None, "--min-cosine", help="Bound (not language models): the worst output cosine over --eval's samples."
)
_OUTPUT = typer.Option(
    None, "-o", "--output", help="The model written (default: MODEL.optimized.pt2 / .aimodel)."
)
_RECIPE = typer.Option(
    None,
    "--recipe",
    help="Also write the recipe (.yaml or .json) that coreopt apply reproduces the model with.",
)
_CSV = typer.Option(False, "--csv", help="Print the curve, the rounds and the uniform settings as CSV.")
_PLOT = typer.Option(None, "--plot", help="Also write a PNG of damage against bits per weight.")
_FLAGS = {"target_bits": "--target-bits", "max_size_mb": "--max-size", "max_ppl_increase": "--max-ppl-increase",
          "max_kl": "--max-kl", "min_cosine": "--min-cosine", "evaluation": "--eval"} | flag_names(OptimizeConfig)  # fmt: skip


def optimize(**values: Any) -> None:
    """Pick each weight's compression - kept, int8, int4 blocks, 8- to 2-bit look-up tables (data-aware
    methods), optionally sparsity - for one budget: a size (--target-bits, --max-size) or an accuracy
    bound with the size minimised (--max-ppl-increase, --max-kl, --min-cosine). Each candidate is tried on every weight in memory and its damage estimated from the calibration
    data (second-order, Fisher); for a language model each weight's two smallest choices are also
    measured alone (--trial-tokens) and correct the estimate (all cached, so a new budget re-solves
    in seconds); an exact knapsack over
    the stored bytes picks the plan; the plan is made as a recipe, applied and evaluated on --eval,
    and for an accuracy bound solved again with the measured damage until it holds (each round
    reported). Exit 1 when the bound is not met. 3-bit LUTs are left out: the .pt2 route cannot carry them.

    Example: coreopt optimize smol.pt2 --calibration calib.txt --eval held.txt --target-bits 4 -o smol.mixed.pt2

    Example: coreopt optimize smol.pt2 --calibration calib.txt --eval held.txt --max-ppl-increase 10 --recipe r.yaml

    Example: coreopt optimize cnn.pt2 --calibration train.safetensors --eval val.safetensors --min-cosine 0.99 --to aimodel

    Example: coreopt optimize smol.pt2 --calibration calib.txt --target-bits 3 --dry-run --json
    """
    budgets = {flag: values[name] for name, flag in _BUDGETS.items()}
    as_csv, as_json, quiet, dry_run = values["as_csv"], values["as_json"], values["quiet"], values["dry_run"]
    goal = _parse(budgets, values["evaluation"] is None and not dry_run, values["plot"], as_csv, as_json)
    config = config_from_options(OptimizeConfig, {k: v for k, v in values.items() if k in _SEARCH})
    talk = not (quiet or as_json or as_csv)
    model = values["model"]
    found = _run(model, goal, config, values["calibration"], values["evaluation"], talk, as_json, values["recipe"],
                 values["plot"], output=values["output"], force=values["force"])  # fmt: skip
    _show(found, as_json, as_csv, quiet, values["recipe"])
    _exit_unmet(model, found.report)


_BUDGETS = {"target_bits": "--target-bits", "max_size": "--max-size", "max_ppl_increase": "--max-ppl-increase",
            "max_kl": "--max-kl", "min_cosine": "--min-cosine"}  # fmt: skip
_SEARCH = {f.name for f in dataclasses.fields(OptimizeConfig)}


def _signature() -> inspect.Signature:
    """The command's options: the model and data, one budget, the search's (OptimizeConfig's
    fields, declared there once), and how the result is written and shown."""

    return inspect.Signature([
        keyword("model", _MODEL, Path), keyword("calibration", _CALIBRATION, str),
        keyword("evaluation", _EVAL, Path | None), keyword("target_bits", _TARGET_BITS, float | None),
        keyword("max_size", _MAX_SIZE, float | None), keyword("max_ppl_increase", _MAX_PPL, float | None),
        keyword("max_kl", _MAX_KL, float | None), keyword("min_cosine", _MIN_COSINE, float | None),
        *config_parameters(OptimizeConfig), keyword("output", _OUTPUT, Path | None),
        keyword("recipe", _RECIPE, Path | None), keyword("as_csv", _CSV, bool), keyword("plot", _PLOT, Path | None),
        keyword("force", force_option(), bool), keyword("quiet", quiet_option(), bool),
        keyword("as_json", json_option(), bool),
    ])  # fmt: skip


optimize.__signature__ = _signature()  # type: ignore[attr-defined]


def _parse(
    budgets: dict[str, float | None], no_eval: bool, plot: Path | None, as_csv: bool, as_json: bool
) -> Any:
    """The goal, or a usage error naming the flag (before anything is read)."""
    from coreai_opt.optimization import Goal

    if as_csv and as_json:
        raise typer.BadParameter("give --csv or --json, not both", param_hint="--csv")
    given = [flag for flag, value in budgets.items() if value is not None]
    if len(given) != 1:
        raise typer.BadParameter("give exactly one budget: " + ", ".join(budgets), param_hint="--target-bits")
    with option_errors(_FLAGS, given[0]):
        rise = budgets["--max-ppl-increase"]
        goal = Goal(
            target_bits=budgets["--target-bits"], max_size_mb=budgets["--max-size"],
            max_ppl_increase=None if rise is None else rise / 100, max_kl=budgets["--max-kl"],
            min_cosine=budgets["--min-cosine"],
        )  # fmt: skip
        if no_eval:
            raise ValueError("give --eval data to confirm the plan on (or --dry-run for a size budget)")
        if plot is not None:
            from coreai_opt.comparison import check_plot_path

            check_plot_path(plot)
    return goal


def _run(model: Path, goal: Any, config: Any, calibration: str, evaluation: Path | None, talk: bool,
         as_json: bool, recipe: Path | None, plot: Path | None, **settings: Any) -> Any:  # fmt: skip
    """The search under a progress bar, with the recipe and the plot asked for; the k-means kernels
    are readied first when a choice palettizes, so their compile is not taken for a hang."""
    from coreai_opt.optimization import optimize as run
    from coreai_opt.optimization import parse_choices, plot_optimization

    choices = parse_choices(config.candidates)
    if any(c.config is not None and palettizes(c.config) for c in choices) and model.exists():
        kmeans_kernels(talk)
    with user_errors(as_json, _FLAGS), weight_progress(talk, "optimizing") as bar:
        found = run(model, goal, calibration, evaluation, config=config, choices=choices, progress=bar,
                    say=_say if talk else None, **settings)  # fmt: skip
        if recipe is not None:
            found.recipe.save(recipe)
        if plot is not None:
            plot_optimization(found.report, plot)
    return found


def _exit_unmet(model: Path, report: Any) -> None:
    """Exit 1 when an accuracy bound still fails after the last round (the closest plan is written)."""
    if report.met is False:
        sys.stderr.write(f"error: {model}: {report.goal.describe()} not met in {len(report.rounds)} rounds; "
                         f"the closest plan was written to {report.output}\n")  # fmt: skip
        raise typer.Exit(1)


def _show(found: Any, as_json: bool, as_csv: bool, quiet: bool, recipe: Path | None) -> None:
    report = found.report
    if as_json:
        print_json(report.to_dict() | {"recipe": found.recipe.to_dict()})
    elif as_csv:
        sys.stdout.write(report.to_csv())
    elif quiet:
        from ..render import print_line

        print_line(_line(report))
    else:
        _render(report, recipe)


def _say(line: str) -> None:
    from .._common import err_console

    if err_console.is_terminal:
        err_console.print(f"[dim]{shown(line)}[/dim]")
    else:
        sys.stderr.write(line + "\n")


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else ("inf" if not math.isfinite(value) else format(value, spec))


def _pct(value: float | None) -> str:
    return "-" if value is None else ("inf" if not math.isfinite(value) else f"{100 * value:+.2f}%")


def _line(report: Any) -> str:
    counts = ", ".join(f"{n} {k}" for k, n in sorted(report.counts().items(), key=lambda kv: -kv[1]))
    final = report.final
    measured = ""
    if final is not None:
        measured = (f"; ppl {_num(final.perplexity, '.3f')} ({_pct(final.perplexity_increase)}), KL {_num(final.kl_mean, '.4f')}"
                    if final.kl_mean is not None else f"; cosine {_num(final.cosine, '.5f')}")  # fmt: skip
    verdict = {True: "met", False: "NOT met", None: "dry run"}[report.met]
    where = f" -> {report.output}" if report.output else ""
    return (f"optimize {report.program.name}{where}: {report.goal.describe()} {verdict}; {report.bits:.3f} bits per "
            f"weight ({counts}){measured}; {report.seconds:.1f} s")  # fmt: skip


def _render(report: Any, recipe: Path | None) -> None:
    from ..render import console, fitted_table

    columns = [("choice", "left"), ("weights", "right"), ("elements", "right"), ("stored", "right"),
               ("bits/w", "right"), ("est. damage", "right")]  # fmt: skip
    console.print(fitted_table(f"Plan: {report.bits:.3f} bits per weight over {report.elements:,} weights' elements",
                               columns, _plan_rows(report)))  # fmt: skip
    detail = [[w["name"], w["choice"], human_bytes(w["bytes"]), _num(w["predicted_damage"], ".3g")]
              for w in sorted(report.weights, key=lambda w: -w["predicted_damage"])[:12]]  # fmt: skip
    console.print(fitted_table("Most damaged weights (--json: every weight)", [("weight", "left"), ("choice", "left"),
                               ("stored", "right"), ("est. damage", "right")], detail))  # fmt: skip
    if report.rounds or report.uniform:
        console.print(_confirmation(report))
    if report.converted is not None:
        c, kept = report.converted, report.final
        console.print(f"the .aimodel on the Core AI runtime: {' / '.join(_measured(c)[:3])}"
                      + ("" if kept is None else f" (the .pt2: {' / '.join(_measured(kept)[:3])})"))  # fmt: skip
    if report.reference is not None and report.reference.perplexity is not None:
        console.print(f"reference perplexity {report.reference.perplexity:.3f}")
    console.print(_line(report))
    trials = (f"; {report.trials} trials on {report.trial_tokens} tokens, {report.trial_seconds:.1f} s of it"
              if report.trials else "")  # fmt: skip
    sampled = (f"; {report.sampled} weights estimated on a sample of their channels (--estimate-sample "
               f"{report.estimate_sample:,}; 16/k of it for tables of k > 16 entries)" if report.sampled else "")  # fmt: skip
    console.print(f"costs {report.cost_seconds:.1f} s ({len(report.cached)} choices from the cache{trials}{sampled}), "
                  f"solve {report.solve_seconds:.2f} s; the plan is optimal to within {human_bytes(report.slack_bytes)}")  # fmt: skip
    if recipe is not None:
        console.print(
            f"recipe written to {shown(recipe)}: coreopt apply {shown(recipe)} {shown(report.program)} -o OUT"
        )


def _plan_rows(report: Any) -> list[list[str]]:
    """One row per choice the plan uses, in the order of --candidates: its weights and their bytes."""
    counts = report.counts()
    rows = []
    by_choice: dict[str, list[dict[str, Any]]] = {}
    for w in report.weights:
        by_choice.setdefault(w["choice"], []).append(w)
    for choice in report.choices:
        members = by_choice.get(choice, [])
        if not members:
            continue
        elements = sum(w["elements"] for w in members)
        nbytes = sum(w["bytes"] for w in members)
        rows.append([choice, str(counts[choice]), f"{elements:,}", human_bytes(nbytes), _num(8 * nbytes / max(elements, 1), ".2f"),
                     _num(sum(w["predicted_damage"] for w in members), ".4g")])  # fmt: skip
    return rows


def _confirmation(report: Any) -> Any:
    """The rounds' measurements beside the uniform settings', so the plan's gain over them shows."""
    from ..render import fitted_table

    lines = []
    for r in report.rounds:
        lines.append([f"round {r.index}", _num(r.bits, ".3f"), _num(r.predicted, ".4g"), *_measured(r.measured),
                      {True: "ok", False: "over", None: "-"}[r.ok]])  # fmt: skip
    for u in report.uniform:
        lines.append(
            [
                f"uniform {u.choice}",
                _num(u.bits, ".3f"),
                _num(u.predicted, ".4g"),
                *_measured(u.measured),
                "",
            ]
        )
    language = any(r.measured is not None and r.measured.kl_mean is not None for r in report.rounds)
    heads = ["perplexity", "Δ ppl", "KL"] if language else ["cosine", "mean cos", ""]
    columns = (
        [("", "left"), ("bits/w", "right"), ("est.", "right")]
        + [(h, "right") for h in heads]
        + [("", "left")]
    )
    return fitted_table("Confirmation (measured on --eval) and uniform settings", columns, lines)


def _measured(m: Any) -> list[str]:
    if m is None:
        return ["-", "-", "-"]
    if m.kl_mean is not None:
        return [_num(m.perplexity, ".3f"), _pct(m.perplexity_increase), _num(m.kl_mean, ".3g")]
    return [_num(m.cosine, ".5f"), _num(m.mean_cosine, ".5f"), ""]
