"""Confirmation: the plan made and measured, round after round, until the budget is met as well as
the rounds allow. Damage is not additive (errors of earlier layers reach later ones; GPTQ in the
final run compensates what the trials could not), so for an accuracy bound the measured damage
over the predicted one rescales the bound (`allowed_damage`) and the plan is solved again,
bracketing between the largest plan that failed and the smallest that passed; the smallest plan
that met it is kept, moved into place (converted for `.aimodel`) with its sidecars, and settled
into the report (`settle`, which a dry run uses alone). A size budget is met by construction
(checked on the written file for `max_size_mb`). Kept apart from the search (`_optimize`), which
only estimates: here models are made (`_recipe`), measured (`_judge`) and compared (`_uniform`).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coreai_opt.io import write_atomically

from ._costs import CostTable
from ._recipe import Steps, make, plan_recipe
from ._records import Goal, Measured, OptimizeReport, Round
from ._solve import Plan, solve
from ._uniform import compare_uniform

if TYPE_CHECKING:
    from coreai_opt.models import Sidecars

    from ._judge import Judge

Say = Callable[[str], None]


def confirm(
    report: OptimizeReport, table: CostTable, plan: Plan, knapsack: Any, steps: Steps, judge: Judge, out: Path,
    sidecars: Sidecars, to_aimodel: bool, rounds: int, uniform: int, note: Say,
) -> Any:  # fmt: skip
    """The rounds, the file kept moved into place (converted for `.aimodel`) with the sidecars read
    before the search, the uniform settings beside it; the recipe of the plan kept."""
    from coreai_opt.models import write_sidecars
    from coreai_opt.recipes import Recipe

    out.parent.mkdir(parents=True, exist_ok=True)  # as every writer does (`io.atomic_output`)
    work = Path(tempfile.mkdtemp(prefix=".coreopt-optimize-", dir=out.parent))
    try:
        accepted, plan = _rounds(report, table, plan, knapsack, steps, judge, work, report.goal, rounds, note)
        settle(report, table, plan)
        if to_aimodel:
            note("converting to a Core AI program")
            accepted = make(Recipe(steps.convert()), accepted, work / "final.aimodel")
            note("scoring the .aimodel on the Core AI runtime")
            report.converted = judge(accepted)
        write_atomically(out, lambda tmp: shutil.move(str(accepted), str(tmp)))
        write_sidecars(sidecars, report.program, out)
        compare_uniform(report, table, steps, plan, judge, work, uniform, note)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return steps.recipe(plan, to_aimodel=to_aimodel)


def _rounds(
    report: OptimizeReport, table: CostTable, plan: Plan, knapsack: Any, steps: Steps, judge: Judge,
    work: Path, budget: Goal, rounds: int, say: Say,
) -> tuple[Path, Plan]:  # fmt: skip
    """Make and measure plans until the budget is met as well as `rounds` allow; the file kept
    and its plan. A size budget takes one round (two if the file came out over `max_size_mb`)."""
    tried: dict[tuple[int, ...], tuple[Path, bool]] = {}
    best: tuple[Path, Plan] | None = None
    failed_bytes, passed_bytes = -math.inf, math.inf
    scale: float | None = None
    limit = rounds if budget.on_accuracy else 2
    last: tuple[Path, Plan] | None = None
    for index in range(1, limit + 1):
        if plan.picks in tried:
            break
        began = time.perf_counter()
        say(
            f"round {index}: {table.bits(plan.nbytes):.3f} bits per weight, predicted damage {plan.damage:.4g}"
        )
        made = make(plan_recipe(steps, plan), judge.reference_path, work / f"round{index}.pt2")
        measured = judge(made)
        ok = _meets(budget, measured)
        report.rounds.append(Round(index, table.bits(plan.nbytes), plan.nbytes, plan.damage, measured, ok,
                                   time.perf_counter() - began))  # fmt: skip
        tried[plan.picks] = (made, ok)
        last = (made, plan)
        if ok and (best is None or plan.nbytes < best[1].nbytes):
            best = (made, plan)
        if not budget.on_accuracy:
            if ok:
                break
            excess = measured.size_bytes - budget.value * 1e6
            plan = solve(table, plan.nbytes - excess - 1) or plan
            continue
        if ok:
            passed_bytes = min(passed_bytes, plan.nbytes)
        else:
            failed_bytes = max(failed_bytes, plan.nbytes)
        if plan.damage > 0:
            scale = measured.damage(budget.kind) / plan.damage
        bound = allowed_damage(budget, scale)
        following = knapsack.smallest_within(bound) if bound is not None else None
        if following is None or not failed_bytes < following.nbytes < passed_bytes:
            following = _between(knapsack, failed_bytes, passed_bytes, table)
        if following is None or (ok and _close(budget, measured)):
            break
        plan = following
    kept = best or last
    assert kept is not None
    report.met = best is not None
    return kept[0], kept[1]


def _between(knapsack: Any, low: float, high: float, table: CostTable) -> Plan | None:
    """A plan halfway (in bytes) between the largest that failed and the smallest that passed."""
    if not math.isfinite(high):
        high = sum(max(b for b in row if math.isfinite(b)) for row in table.nbytes)
    if not math.isfinite(low):
        low = sum(min(row) for row in table.nbytes)
    middle = (low + high) / 2
    if high - low < 0.005 * high:
        return None
    return knapsack.best(int(middle // knapsack.unit))


def allowed_damage(budget: Goal, scale: float | None) -> float | None:
    """The estimated damage the accuracy bound allows, the estimate scaled by measured / predicted
    (None before any measurement of a cosine bound: its scale is the outputs' energy)."""
    s = scale if scale and math.isfinite(scale) and scale > 0 else None
    if budget.kind == "max_kl":
        return budget.value / (s or 1.0)
    if budget.kind == "max_ppl_increase":
        return math.log1p(budget.value) / (s or 1.0)
    if budget.kind == "min_cosine":
        return None if s is None else (1.0 - budget.value) / s
    return None


def _meets(budget: Goal, measured: Measured) -> bool:
    v = budget.value
    if budget.kind == "max_ppl_increase":
        return measured.perplexity_increase is not None and measured.perplexity_increase <= v
    if budget.kind == "max_kl":
        return measured.kl_mean is not None and measured.kl_mean <= v
    if budget.kind == "min_cosine":
        return measured.cosine is not None and measured.cosine >= v
    if budget.kind == "max_size_mb":
        return measured.size_bytes <= v * 1e6
    return True  # target bits: met by construction


def _close(budget: Goal, measured: Measured) -> bool:
    """Within 15% of an accuracy bound (little left to gain from another round)."""
    v = budget.value
    if budget.kind == "max_ppl_increase":
        return (measured.perplexity_increase or 0.0) >= 0.85 * v
    if budget.kind == "max_kl":
        return (measured.kl_mean or 0.0) >= 0.85 * v
    return 1.0 - (measured.cosine or 1.0) >= 0.85 * (1.0 - v)


def settle(report: OptimizeReport, table: CostTable, plan: Plan) -> None:
    report.weights = [
        {"name": n, "choice": table.choices[k], "bytes": int(table.nbytes[w][k]),
         "predicted_damage": table.damage[w][k], "estimated_damage": table.estimate[w][k],
         "measured": k in table.measured[w], "elements": table.counts[w]}
        for w, (n, k) in enumerate(zip(table.names, plan.picks, strict=True))
    ]  # fmt: skip
    report.bits, report.weight_bytes, report.predicted = table.bits(plan.nbytes), plan.nbytes, plan.damage
    report.slack_bytes = plan.slack_bytes
