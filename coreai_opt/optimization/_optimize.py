"""`optimize`: a setting per weight under one budget - size (mean bits per weight, megabytes) or
accuracy (perplexity increase, KL, cosine) - then the model made, evaluated and reported.

1. Costs: every choice on every weight, its stored bytes and estimated damage (`_costs`), each
   weight's two smallest choices measured for a language model (`_trials`); cached.
2. The allocation (`_solve`): least estimated damage within the size, or the smallest plan
   within the accuracy bound.
3. Confirmation (`_confirm`): the plan becomes a recipe (`_recipe`: compress steps with a
   per-weight override each), applied to the program as `coreopt apply` would, and evaluated on
   the evaluation data (`_judge`). Damage is not additive (errors of earlier layers reach later
   ones; GPTQ in the final run compensates what the trials could not), so for an accuracy bound
   the measured damage over the predicted one rescales the bound and the plan is solved again -
   each round reported - keeping the smallest plan that met it. A size budget is met by
   construction (checked on the written file for `max_size_mb`).
4. Beside it, the uniform settings nearest in size, made and evaluated the same way (`_uniform`).

This module holds the run from end to end - the inputs checked before anything is computed, the
costs, the search and its report (`_records`) - and hands the making and measuring to the
modules above.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coreai_opt._memory import release_garbage
from coreai_opt.errors import ConfigError
from coreai_opt.io import ModelFormat, check_output, model_format, require_existing

from ._choices import Choice, parse_choices
from ._config import OptimizeConfig
from ._confirm import allowed_damage, confirm, settle
from ._costs import CostTable, cost_table
from ._judge import Judge
from ._recipe import Steps, plan_recipe
from ._records import Goal, Optimized, OptimizeReport
from ._solve import Plan, front, solve

Progress = Callable[[int, int, str], None]
Say = Callable[[str], None]


def optimize(
    program: Path | str,
    budget: Goal,
    calibration: Path | str,
    evaluation: Path | str | None = None,
    *,
    config: OptimizeConfig | None = None,
    output: Path | str | None = None,
    choices: tuple[Choice, ...] | None = None,
    force: bool = False,
    progress: Progress | None = None,
    say: Say | None = None,
    **options: Any,
) -> Optimized:
    """The smallest model within `budget` (or the least damaged within a size) from `program`
    (a `.pt2`): see the module. `calibration` feeds the estimates and the methods that learn
    from data; `evaluation` (text, token ids or model inputs - never the calibration data)
    confirms the plan. How it searches is `config` (an `OptimizeConfig`), with any of its fields
    given here replacing the config's (`threshold=0`); `choices`, Choice records instead of
    the config's `candidates` text."""
    config = dataclasses.replace(config or OptimizeConfig(), **options)
    path, sidecars = _source(program)
    note = say or (lambda _: None)
    picked = _picked(choices if choices is not None else config.candidates)
    _check_goal(budget, evaluation, config.dry_run)
    auto = config.rotate == "auto"
    if auto:
        config = dataclasses.replace(config, rotate=_auto_rotation(path, note))
    if config.rotate not in (None, "none"):
        try:
            return _rotated(
                path, budget, calibration, evaluation, config, output, picked, force, progress, say
            )
        except _RotationRefused as why:  # the program left as it was: auto searches it unrotated
            if not auto:
                raise why.refusal from None
            note(f"no rotation: {why.refusal}")
            config = dataclasses.replace(config, rotate="none")
    out = None if config.dry_run else _output(path, output, config.to == "aimodel", force)
    return _optimized((path, sidecars, out), budget, calibration, evaluation, config, picked, progress, note)


def _optimized(
    files: tuple[Path, Any, Path | None], budget: Goal, calibration: Path | str, evaluation: Path | str | None,
    config: OptimizeConfig, picked: tuple[Choice, ...], progress: Progress | None, note: Say,
    derived: tuple[str | None, Any] = (None, None),
) -> Optimized:  # fmt: skip
    """The search and the plan made (`optimize` with its inputs checked): `files`, the program,
    its sidecars and the output (None: a dry run); `derived`, the digest of calibration samples
    and statistics of the program on them that a transform derived (a dict the cost table reads
    where the samples match, and empties)."""
    path, sidecars, out = files
    start = time.perf_counter()
    loaded = _checked(path)  # checked, and its first run done, before anything is said or computed
    samples = _samples(
        calibration, config.calibration_tokens, config.calibration_samples, sidecars.tokenizer_file(path)
    )
    note(f"estimating {len(picked) - 1} choices on every weight from {samples.describe()}")
    digest, statistics = derived
    if statistics is not None and digest != samples.digest():
        statistics.clear()  # of other samples: nothing reads them
    table = _costs(path, loaded, picked, samples, config, progress, statistics)
    loaded = None  # the rounds load the file afresh: let this copy go, with what the table's
    release_garbage(path.stat().st_size)  # calibration hung on it (only the cyclic collector frees it)
    steps = Steps(picked, table, str(Path(calibration).resolve()) if str(calibration) != "random" else "random",
                   config.calibration_tokens, config.calibration_samples, config.device, config.threshold,
                   config.tune_epochs, config.tune_blocks)  # fmt: skip
    knapsack, plan, report = _search(path, out, budget, picked, table)
    report.estimate_sample, report.sampled = config.estimate_sample, len(table.sampled)
    if out is None:
        settle(report, table, plan)
        recipe = plan_recipe(steps, plan)
    else:
        assert evaluation is not None
        judge = Judge(path, Path(evaluation) if str(evaluation) != "random" else None, config.eval_tokens,
                       config.eval_samples, progress, config.device)  # fmt: skip
        recipe = confirm(report, table, plan, knapsack, steps, judge, out, sidecars, config.to == "aimodel",
                          config.rounds, config.uniform, note)  # fmt: skip
        report.reference = judge.reference
    report.seconds = time.perf_counter() - start
    return Optimized(out, recipe, report)


class _RotationRefused(Exception):
    """The rotation before the search refused by its check (`refusal`, the TransformError)."""

    def __init__(self, refusal: Exception) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal


def _rotated(
    path: Path, budget: Goal, calibration: Path | str, evaluation: Path | str | None,
    config: OptimizeConfig, output: Path | str | None, picked: tuple[Choice, ...], force: bool,
    progress: Progress | None, say: Say | None,
) -> Optimized:  # fmt: skip
    """The search on the program rotated first (written to a private folder beside the output,
    removed after), its recipe starting with that transform: `coreopt apply` of it on the
    original program makes the same file. The statistics of the rotated program that the
    rotation knows from its own (a learned one's Gram matrices, turned) are not taken again."""
    import tempfile

    from coreai_opt.calibration import CalibrationSpec
    from coreai_opt.recipes import Recipe, Transform, apply_recipe
    from coreai_opt.transforms import RotateConfig, TransformError

    step = Transform(config=RotateConfig(rotation=config.rotate))
    source = str(calibration) if str(calibration) == "random" else str(Path(calibration).resolve())
    spec = CalibrationSpec(source=source, samples=config.calibration_samples, tokens=config.calibration_tokens,
                           device=config.device)  # fmt: skip
    out = None if config.dry_run else _output(path, output, config.to == "aimodel", force)
    note = say or (lambda _: None)
    note(f"rotating the residual stream ({config.rotate})")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)  # the output's folder holds the rotated copy
    with tempfile.TemporaryDirectory(prefix=".coreopt-rotate-", dir=out.parent if out else None) as folder:
        try:
            made = apply_recipe(
                Recipe((step,), spec), path, Path(folder) / path.name, progress=progress, keep_statistics=True
            )
        except TransformError as why:
            raise _RotationRefused(why) from None
        derived = (made.steps[0][1].samples_digest, made.steps[0][1].known)  # the cost table empties them
        del made
        turned, sidecars = _source(Path(folder) / path.name)
        inner = dataclasses.replace(config, rotate=None)
        found = _optimized((turned, sidecars, out), budget, calibration, evaluation, inner, picked, progress, note,
                           derived)  # fmt: skip
    found.report.program = path
    recipe = Recipe((step, *found.recipe.steps), found.recipe.calibration or spec)
    return Optimized(found.program, recipe, found.report)


def _auto_rotation(path: Path, note: Say) -> str:
    """`--rotate auto`: learned where the program's residual stream can be rotated, else none
    (said with the reason)."""
    from coreai_opt.io import load_pt2
    from coreai_opt.transforms import rotation_problem

    problem = rotation_problem(load_pt2(path))
    if problem is not None:
        note(f"no rotation: {problem}")
    return "none" if problem is not None else "learned"


def _source(program: Path | str) -> tuple[Path, Any]:
    """The program's path, once it names an existing `.pt2`, and its sidecars - parsed now, so a
    bad one fails before the search (they are written beside the output)."""
    from coreai_opt.models import read_sidecars

    path = Path(program)
    require_existing(path)
    model_format(path, (ModelFormat.PT2,))
    return path, read_sidecars(path)


def _samples(calibration: Path | str, tokens: int | None, count: int | None, tokenizer: Any) -> Any:
    from coreai_opt.calibration import Samples

    return Samples.of(calibration, tokens=tokens, count=count, tokenizer=tokenizer)


def _search(
    path: Path, out: Path | None, budget: Goal, picked: tuple[Choice, ...], table: Any
) -> tuple[Any, Any, OptimizeReport]:
    """The front of least damage for every size, the first plan within the budget, the report."""
    began = time.perf_counter()
    knapsack = front(table)
    plan = _first_plan(table, budget, knapsack)
    return knapsack, plan, _report(path, out, budget, picked, table, knapsack, time.perf_counter() - began)


def _checked(path: Path) -> Any:
    """The program, checked and run once in a child (`ready_to_run`)."""
    from coreai_opt._export import ready_to_run
    from coreai_opt.io import load_pt2

    program = load_pt2(path)
    ready_to_run(program)
    return program


def _costs(
    path: Path, program: Any, picked: tuple[Choice, ...], samples: Any, config: OptimizeConfig,
    progress: Progress | None, known: Any = None,
) -> Any:  # fmt: skip
    """Each candidate's bytes and damage for every weight (a failing run named by the file)."""
    from coreai_opt.io import running

    with running(path):
        return cost_table(path, lambda: program, picked, samples, threshold=config.threshold,
                          trial_tokens=config.trial_tokens, sample_elements=config.estimate_sample,
                          device=config.device, progress=progress, known=known)  # fmt: skip


def _check_goal(budget: Goal, evaluation: Path | str | None, dry_run: bool) -> None:
    """A plan is confirmed on evaluation data unless it is a dry run; a bound on accuracy is met
    only by measuring."""
    if not dry_run and evaluation is None:
        raise ConfigError("give evaluation data (--eval) to confirm the plan, or a dry run", "evaluation")
    if budget.on_accuracy and dry_run:
        raise ConfigError("an accuracy bound is met by measuring: it cannot be a dry run", "dry_run")


def _report(
    path: Path, out: Path | None, budget: Goal, picked: tuple[Choice, ...], table: Any, knapsack: Any,
    solve_seconds: float,
) -> OptimizeReport:  # fmt: skip
    """The report as the search leaves it, before a plan is settled or confirmed."""
    return OptimizeReport(path, out, budget, [c.name for c in picked], [], 0.0, 0.0, 0.0, None,
                          curve=[(table.bits(b), d) for b, d in knapsack.points()], cost_seconds=table.seconds,
                          cached=table.cached, solve_seconds=solve_seconds, elements=table.elements,
                          trial_tokens=table.trial_tokens, trials=sum(map(len, table.measured)),
                          trial_seconds=table.trial_seconds)  # fmt: skip


def _picked(choices: str | tuple[Choice, ...] | None) -> tuple[Choice, ...]:
    """The candidates: parsed from text, or as given (at least one besides keep)."""
    picked = parse_choices(choices) if choices is None or isinstance(choices, str) else tuple(choices)
    if len(picked) < 2:
        raise ConfigError("give at least one candidate besides keep", "candidates")
    return picked


def _output(path: Path, output: Path | str | None, to_aimodel: bool, force: bool) -> Path:
    suffix = ".aimodel" if to_aimodel else ".pt2"
    out = Path(output) if output is not None else path.with_suffix(".optimized" + suffix)
    model_format(out, (ModelFormat.AIMODEL if to_aimodel else ModelFormat.PT2,))
    check_output(out, force=force, inputs=(path,))
    return out


def _first_plan(table: CostTable, budget: Goal, knapsack: Any) -> Plan:
    """The least damaged plan within a size, or the smallest within the accuracy bound as estimated."""
    if budget.kind == "target_bits":
        plan = solve(table, budget.value / 8.0 * table.elements)
    elif budget.kind == "max_size_mb":
        plan = solve(table, budget.value * 1e6 - table.fixed_bytes)
    else:
        plan = knapsack.smallest_within(allowed_damage(budget, None) or math.inf)
    if plan is None:
        least = sum(min(r) for r in table.nbytes)
        raise ConfigError(f"no plan fits {budget.describe()}: the smallest choices take {table.bits(least):.2f} bits "
                          f"per weight ({(least + table.fixed_bytes) / 1e6:.2f} MB)", budget.kind)  # fmt: skip
    return plan
