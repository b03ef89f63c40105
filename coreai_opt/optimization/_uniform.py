"""The uniform settings the plan is compared with: one choice on every weight (those it cannot take
kept), the few nearest the plan in size, each made and measured exactly as the plan was. They are
the report's yardstick - what a mixed plan gains over the plain setting of about the same size - and
play no part in choosing the plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ._choices import Choice
from ._costs import CostTable
from ._recipe import Steps, make, plan_recipe
from ._records import OptimizeReport, Uniform
from ._solve import Plan

if TYPE_CHECKING:
    from ._judge import Judge

Say = Callable[[str], None]


def _uniform_plan(table: CostTable, choice: str) -> Plan:
    k, keep = table.column(choice), table.column("keep")
    picks = tuple(k if math.isfinite(row[k]) else keep for row in table.damage)
    return Plan(picks, *table.uniform(choice))


def _nearest_uniform(table: CostTable, choices: tuple[Choice, ...], plan: Plan, count: int) -> list[Uniform]:
    """The `count` uniform settings closest in size at or above the plan's (the smaller ones too
    when none is as large)."""
    rows = []
    for c in choices:
        if c.config is None:
            continue
        k = table.column(c.name)
        taken = sum(n for n, row in zip(table.counts, table.damage, strict=True) if math.isfinite(row[k]))
        if taken < table.elements / 2:
            continue  # a choice most weights cannot take is no uniform setting
        nbytes, damage = table.uniform(c.name)
        rows.append(Uniform(c.name, table.bits(nbytes), nbytes, damage))
    above = sorted((u for u in rows if u.weight_bytes >= plan.nbytes * 0.999), key=lambda u: u.weight_bytes)
    below = sorted((u for u in rows if u.weight_bytes < plan.nbytes * 0.999), key=lambda u: -u.weight_bytes)
    return (above + below)[:count]


def compare_uniform(
    report: OptimizeReport, table: CostTable, steps: Steps, plan: Plan, judge: Judge, work: Path, count: int,
    note: Say,
) -> None:  # fmt: skip
    """The `count` uniform settings nearest the plan in size, each made in `work`, measured by `judge`
    and added to the report (its file removed once measured)."""
    for u in _nearest_uniform(table, steps.choices, plan, count):
        note(f"uniform {u.choice} for comparison")
        made = make(plan_recipe(steps, _uniform_plan(table, u.choice)), report.program,
                    work / f"uniform-{u.choice}.pt2")  # fmt: skip
        u.measured = judge(made)
        report.uniform.append(u)
        made.unlink(missing_ok=True)
