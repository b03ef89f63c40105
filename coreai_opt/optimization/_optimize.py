"""`optimize`: a setting per weight under one budget - size (mean bits per weight, megabytes) or
accuracy (perplexity increase, KL, cosine) - then the model made, evaluated and reported.

1. Costs: every choice on every weight, its stored bytes and estimated damage (`_costs`), each
   weight's two smallest choices measured for a language model (`_trials`); cached.
2. The allocation (`_solve`): least estimated damage within the size, or the smallest plan
   within the accuracy bound.
3. Confirmation: the plan becomes a recipe (compress steps with a per-weight override each),
   applied to the program as `coreopt apply` would, and evaluated on the evaluation data.
   Damage is not additive (errors of earlier layers reach later ones; GPTQ in the final run
   compensates what the trials could not), so for an accuracy bound the measured damage over
   the predicted one rescales the bound and the plan is solved again - each round reported -
   keeping the smallest plan that met it. A size budget is met by construction (checked on
   the written file for `max_size_mb`).
4. Beside it, the uniform settings nearest in size, made and evaluated the same way.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from coreai_opt._errors import ConfigError
from coreai_opt.io import ModelFormat, check_output, model_format, require_existing, write_atomically

from ._choices import Choice, parse_choices
from ._config import OptimizeConfig
from ._costs import CostTable, cost_table
from ._solve import Plan, front, solve

if TYPE_CHECKING:
    from coreai_opt.models import Sidecars

Progress = Callable[[int, int, str], None]
Say = Callable[[str], None]


@dataclass(frozen=True)
class Goal:
    """Exactly one budget: a size (`target_bits` mean bits per weight over the weights the choices
    cover, as stored; `max_size_mb` the file, 1 MB = 10^6 bytes) or an accuracy bound with the size
    minimised (`max_ppl_increase` as a fraction, 0.05 = +5%; `max_kl` per token; `min_cosine`, the
    worst output cosine over the evaluation samples, for models that are not language models)."""

    target_bits: float | None = None
    max_size_mb: float | None = None
    max_ppl_increase: float | None = None
    max_kl: float | None = None
    min_cosine: float | None = None

    def __post_init__(self) -> None:
        given = [(k, v) for k, v in dataclasses.asdict(self).items() if v is not None]
        if len(given) != 1:
            raise ConfigError(
                "give exactly one budget: target_bits, max_size_mb, max_ppl_increase, max_kl or min_cosine",
                "budget",
            )
        name, value = given[0]
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{name} must be a positive number, not {value!r}", name)
        if name == "min_cosine" and value >= 1:
            raise ConfigError("min_cosine must lie below 1", name)

    @property
    def kind(self) -> str:
        return next(k for k, v in dataclasses.asdict(self).items() if v is not None)

    @property
    def value(self) -> float:
        return float(getattr(self, self.kind))

    @property
    def on_accuracy(self) -> bool:
        return self.kind in ("max_ppl_increase", "max_kl", "min_cosine")

    def describe(self) -> str:
        v = self.value
        return {
            "target_bits": f"at most {v:g} bits per weight",
            "max_size_mb": f"at most {v:g} MB",
            "max_ppl_increase": f"perplexity at most +{100 * v:g}%",
            "max_kl": f"KL at most {v:g}",
            "min_cosine": f"cosine at least {v:g}",
        }[self.kind]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value}


@dataclass
class Measured:
    """A program's numbers on the evaluation data (language models: perplexity, KL, top-1;
    others: the worst and mean output cosine)."""

    path: Path
    size_bytes: int
    perplexity: float | None = None
    perplexity_increase: float | None = None
    kl_mean: float | None = None
    top1: float | None = None
    cosine: float | None = None
    mean_cosine: float | None = None
    seconds: float = 0.0

    def damage(self, kind: str = "max_kl") -> float:
        """The measured counterpart of the estimate for a bound of `kind`: the rise of the log
        perplexity for a perplexity bound, else KL per token, or 1 - worst cosine."""
        if kind == "max_ppl_increase" and self.perplexity_increase is not None:
            return math.log1p(max(self.perplexity_increase, 0.0))
        if self.kl_mean is not None:
            return max(self.kl_mean, 0.0)
        return max(1.0 - (self.cosine if self.cosine is not None else 0.0), 0.0)

    def to_dict(self) -> dict[str, Any]:
        def num(v: float | None) -> float | str | None:
            return None if v is None else (round(v, 8) if math.isfinite(v) else str(v))

        return {
            "size_bytes": self.size_bytes, "perplexity": num(self.perplexity),
            "perplexity_increase": num(self.perplexity_increase), "kl_mean": num(self.kl_mean),
            "top1": num(self.top1), "cosine": num(self.cosine), "mean_cosine": num(self.mean_cosine),
            "seconds": round(self.seconds, 3),
        }  # fmt: skip


@dataclass
class Round:
    index: int
    bits: float
    weight_bytes: float
    predicted: float  # estimated damage summed over weights
    measured: Measured | None
    ok: bool | None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.index, "bits_per_weight": round(self.bits, 4), "weight_bytes": int(self.weight_bytes),
            "predicted_damage": self.predicted, "measured": None if self.measured is None else self.measured.to_dict(),
            "ok": self.ok, "seconds": round(self.seconds, 3),
        }  # fmt: skip


@dataclass
class Uniform:
    """One choice on every weight (those it cannot take kept), made and evaluated as the plan was."""

    choice: str
    bits: float
    weight_bytes: float
    predicted: float
    measured: Measured | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "choice": self.choice, "bits_per_weight": round(self.bits, 4), "weight_bytes": int(self.weight_bytes),
            "predicted_damage": self.predicted, "measured": None if self.measured is None else self.measured.to_dict(),
        }  # fmt: skip


@dataclass
class OptimizeReport:
    program: Path
    output: Path | None
    goal: Goal
    choices: list[str]
    weights: list[dict[str, Any]]  # name, choice, bytes, predicted damage
    bits: float
    weight_bytes: float
    predicted: float
    met: bool | None  # None: nothing measured (dry run)
    reference: Measured | None = None
    rounds: list[Round] = field(default_factory=list)
    converted: Measured | None = None  # the .aimodel written, scored on the Core AI runtime
    uniform: list[Uniform] = field(default_factory=list)
    curve: list[tuple[float, float]] = field(
        default_factory=list
    )  # (bits per weight, least predicted damage)
    cost_seconds: float = 0.0
    cached: list[str] = field(default_factory=list)
    trial_tokens: int = 0  # calibration tokens each measured choice was tried on (0: estimates only)
    trials: int = 0  # choices measured, over all weights
    trial_seconds: float = 0.0
    solve_seconds: float = 0.0
    seconds: float = 0.0
    slack_bytes: float = 0.0
    elements: int = 0

    @property
    def final(self) -> Measured | None:
        kept = [r for r in self.rounds if r.ok and r.measured is not None]
        return kept[-1].measured if kept else (self.rounds[-1].measured if self.rounds else None)

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for row in self.weights:
            found[row["choice"]] = found.get(row["choice"], 0) + 1
        return found

    def to_csv(self) -> str:
        """The solutions visited: the estimated curve, each round and each uniform setting measured."""
        import csv
        import io

        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["row", "bits_per_weight", "predicted_damage", "perplexity", "perplexity_increase", "kl_mean",
                         "top1", "cosine", "size_bytes"])  # fmt: skip

        def measured(m: Measured | None) -> list[Any]:
            if m is None:
                return ["", "", "", "", "", ""]
            return [m.perplexity, m.perplexity_increase, m.kl_mean, m.top1, m.cosine, m.size_bytes]

        for bits, damage in self.curve:
            writer.writerow(["curve", f"{bits:.4f}", damage, *measured(None)])
        for r in self.rounds:
            writer.writerow([f"round {r.index}", f"{r.bits:.4f}", r.predicted, *measured(r.measured)])
        for u in self.uniform:
            writer.writerow([f"uniform {u.choice}", f"{u.bits:.4f}", u.predicted, *measured(u.measured)])
        return buffer.getvalue()

    def to_dict(self) -> dict[str, Any]:
        return {
            "program": str(self.program), "output": None if self.output is None else str(self.output),
            "goal": self.goal.to_dict(), "met": self.met, "choices": self.choices, "counts": self.counts(),
            "bits_per_weight": round(self.bits, 4), "weight_bytes": int(self.weight_bytes),
            "weights_elements": self.elements, "predicted_damage": self.predicted,
            "slack_bytes": int(self.slack_bytes),
            "reference": None if self.reference is None else self.reference.to_dict(),
            "rounds": [r.to_dict() for r in self.rounds],
            "converted": None if self.converted is None else self.converted.to_dict(), "uniform": [u.to_dict() for u in self.uniform],
            "curve": [{"bits_per_weight": round(b, 4), "predicted_damage": d} for b, d in self.curve],
            "weights": self.weights, "cost_seconds": round(self.cost_seconds, 3), "cached_choices": self.cached,
            "trial_tokens": self.trial_tokens, "trials": self.trials, "trial_seconds": round(self.trial_seconds, 3),
            "solve_seconds": round(self.solve_seconds, 4), "seconds": round(self.seconds, 3),
        }  # fmt: skip


class Optimized(NamedTuple):
    program: Path | None  # the file written (None: a dry run)
    recipe: Any  # a recipes.Recipe that `coreopt apply` reproduces it with
    report: OptimizeReport


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
    start = time.perf_counter()
    path, sidecars = _source(program)
    note = say or (lambda _: None)
    picked, left_out = _usable(choices if choices is not None else config.candidates)
    _check_goal(budget, evaluation, config.dry_run)
    out = None if config.dry_run else _output(path, output, config.to == "aimodel", force)
    loaded = _checked(path)  # checked, and its first run done, before anything is said or computed
    for line in left_out:
        note(line)
    samples = _samples(
        calibration, config.calibration_tokens, config.calibration_samples, sidecars.tokenizer_file(path)
    )
    note(f"estimating {len(picked) - 1} choices on every weight from {samples.describe()}")
    table = _costs(path, loaded, picked, samples, config, progress)
    loaded = None  # the rounds load the file afresh: let this copy go
    steps = _Steps(picked, table, str(Path(calibration).resolve()) if str(calibration) != "random" else "random",
                   config.calibration_tokens, config.calibration_samples, config.device, config.threshold)  # fmt: skip
    knapsack, plan, report = _search(path, out, budget, picked, table)
    if out is None:
        _settle(report, table, plan)
        recipe = _recipe(steps, plan)
    else:
        assert evaluation is not None
        judge = _Judge(path, Path(evaluation) if str(evaluation) != "random" else None, config.eval_tokens,
                       config.eval_samples, progress)  # fmt: skip
        recipe = _confirm(report, table, plan, knapsack, steps, judge, out, sidecars, config.to == "aimodel",
                          config.rounds, config.uniform, note)  # fmt: skip
        report.reference = judge.reference
    report.seconds = time.perf_counter() - start
    return Optimized(out, recipe, report)


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
    progress: Progress | None,
) -> Any:  # fmt: skip
    """Each candidate's bytes and damage for every weight (a failing run named by the file)."""
    from coreai_opt.io import running

    with running(path):
        return cost_table(path, lambda: program, picked, samples, threshold=config.threshold,
                          trial_tokens=config.trial_tokens, device=config.device, progress=progress)  # fmt: skip


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


def _usable(choices: str | tuple[Choice, ...] | None) -> tuple[tuple[Choice, ...], list[str]]:
    """The candidates a `.pt2` can carry, and why each of the others is left out."""
    picked = parse_choices(choices) if choices is None or isinstance(choices, str) else tuple(choices)
    refused = [c for c in picked if c.pt2_refusal() is not None]
    picked = tuple(c for c in picked if c not in refused)
    if len(picked) < 2:
        raise ConfigError("no candidate besides keep is left", "candidates")
    return picked, [f"left out {c.pt2_refusal()}" for c in refused]


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
        plan = knapsack.smallest_within(_bound(budget, None) or math.inf)
    if plan is None:
        least = sum(min(r) for r in table.nbytes)
        raise ConfigError(f"no plan fits {budget.describe()}: the smallest choices take {table.bits(least):.2f} bits "
                          f"per weight ({(least + table.fixed_bytes) / 1e6:.2f} MB)", budget.kind)  # fmt: skip
    return plan


def _confirm(
    report: OptimizeReport, table: CostTable, plan: Plan, knapsack: Any, steps: _Steps, judge: _Judge, out: Path,
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
        _settle(report, table, plan)
        if to_aimodel:
            note("converting to a Core AI program")
            accepted = _apply(Recipe(steps.convert()), accepted, work / "final.aimodel")
            note("scoring the .aimodel on the Core AI runtime")
            report.converted = judge(accepted)
        write_atomically(out, lambda tmp: shutil.move(str(accepted), str(tmp)))
        write_sidecars(sidecars, report.program, out)
        for u in _nearest_uniform(table, steps.choices, plan, uniform):
            note(f"uniform {u.choice} for comparison")
            made = _apply(_recipe(steps, _uniform_plan(table, u.choice)), report.program,
                          work / f"uniform-{u.choice}.pt2")  # fmt: skip
            u.measured = judge(made)
            report.uniform.append(u)
            made.unlink(missing_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Recipe(steps.of(plan, to_aimodel=to_aimodel))


def _rounds(
    report: OptimizeReport, table: CostTable, plan: Plan, knapsack: Any, steps: _Steps, judge: _Judge,
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
        made = _apply(_recipe(steps, plan), judge.reference_path, work / f"round{index}.pt2")
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
        bound = _bound(budget, scale)
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


def _recipe(steps: _Steps, plan: Plan) -> Any:
    from coreai_opt.recipes import Recipe

    return Recipe(steps.of(plan, to_aimodel=False))


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


def _bound(budget: Goal, scale: float | None) -> float | None:
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


def _settle(report: OptimizeReport, table: CostTable, plan: Plan) -> None:
    report.weights = [
        {"name": n, "choice": table.choices[k], "bytes": int(table.nbytes[w][k]),
         "predicted_damage": table.damage[w][k], "estimated_damage": table.estimate[w][k],
         "measured": k in table.measured[w], "elements": table.counts[w]}
        for w, (n, k) in enumerate(zip(table.names, plan.picks, strict=True))
    ]  # fmt: skip
    report.bits, report.weight_bytes, report.predicted = table.bits(plan.nbytes), plan.nbytes, plan.damage
    report.slack_bytes = plan.slack_bytes


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


def _apply(recipe: Any, source: Path, out: Path) -> Path:
    from coreai_opt.recipes import apply_recipe

    result = apply_recipe(recipe, source, out, force=True, allow_empty=True)
    if result.failed is not None:
        raise ConfigError(f"the plan's {result.failed} failed", "recipe")
    return out


def _literal(name: str) -> str:
    """An fnmatch glob matching exactly `name`."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


@dataclass
class _Steps:
    """Plans as recipe steps: one compress step per config kind (palettize, quantize, sparsify),
    its base the kind's most used choice, a per-weight override for every weight it takes (the
    fields where its choice differs) and `*: skip` for the rest."""

    choices: tuple[Choice, ...]
    table: CostTable
    calibration: str
    tokens: int | None
    samples: int | None
    device: str | None
    threshold: int

    def of(self, plan: Plan, *, to_aimodel: bool) -> tuple[Any, ...]:
        from coreai_opt.compression import Override
        from coreai_opt.recipes import Compress

        by_choice: dict[str, list[str]] = {}
        for name, k in zip(self.table.names, plan.picks, strict=True):
            by_choice.setdefault(self.table.choices[k], []).append(name)
        configs = {c.name: c.config_for(True, self.threshold) for c in self.choices}
        kinds: dict[str, list[str]] = {}
        for choice in by_choice:
            config = configs[choice]
            if config is not None:
                kinds.setdefault(config.KIND, []).append(choice)
        found: list[Any] = []
        for kind in ("palettize", "quantize", "sparsify"):
            if kind not in kinds:
                continue
            members = sorted(kinds[kind], key=lambda c: (-len(by_choice[c]), c))
            base = configs[members[0]]
            overrides = []
            for name in self.table.names:
                choice = next((c for c in members if name in by_choice[c]), None)
                if choice is None:
                    continue
                changes = _differences(configs[choice], base) or {"method": base.method}
                overrides.append(Override.of(_literal(name), **changes))
            overrides.append(Override.of("*", skip=True))
            config = dataclasses.replace(base, overrides=tuple(overrides))
            found.append(Compress(config=config, calibration=self.calibration, calibration_tokens=self.tokens,
                                  calibration_samples=self.samples, device=self.device))  # fmt: skip
        if to_aimodel:
            found.extend(self.convert())
        return tuple(found)

    def convert(self) -> tuple[Any, ...]:
        from coreai_opt.recipes import Convert

        return (Convert(),)


def _differences(config: Any, base: Any) -> dict[str, Any]:
    a, b = config.to_dict(), base.to_dict()
    return {
        k: getattr(config, k)
        for k in a
        if k not in ("overrides", "weight_num_threshold", "kind", "version") and a[k] != b[k]
    }


class _Judge:
    """Measures programs against the reference on the evaluation data: a language model on text
    or token ids (`evaluate_text`), any other on model inputs (`compare_many`, worst cosine)."""

    def __init__(self, reference: Path, evaluation: Path | None, tokens: int | None, samples: int,
                 progress: Progress | None) -> None:  # fmt: skip
        self.reference_path = reference
        self.evaluation, self.tokens, self.samples, self.progress = evaluation, tokens, samples, progress
        self.language = evaluation is not None and (
            evaluation.suffix in (".txt", ".md", ".text") or _token_ids(evaluation)
        )
        self.reference: Measured | None = None

    def __call__(self, candidate: Path) -> Measured:
        from coreai_opt.io import asset_bytes

        began = time.perf_counter()
        size = asset_bytes(candidate)
        if self.language:
            from coreai_opt.evaluation import evaluate_text

            text = self.evaluation if self.evaluation.suffix != ".safetensors" else None  # type: ignore[union-attr]
            ids = None if text is not None else self.evaluation
            found = evaluate_text(self.reference_path, [candidate], text=text, tokens=ids, max_tokens=self.tokens,
                                  progress=self.progress)  # fmt: skip
            ref, row = found.reference, found.candidates[0]
            if self.reference is None:
                self.reference = Measured(
                    self.reference_path, asset_bytes(self.reference_path), ref.perplexity
                )
            return Measured(candidate, size, row.perplexity, row.perplexity_increase, row.kl_mean, row.top1,
                            seconds=time.perf_counter() - began)  # fmt: skip
        from coreai_opt.comparison import compare_many

        (result,) = compare_many(self.reference_path, [candidate], inputs=self.evaluation,
                                 samples=self.samples if self.evaluation is None else 1,
                                 progress=self.progress)  # fmt: skip
        if self.reference is None:
            self.reference = Measured(self.reference_path, asset_bytes(self.reference_path))
        means = [o.spread.cosine_mean for o in result.outputs if o.spread.cosine_mean is not None]
        return Measured(candidate, size, cosine=result.worst_cosine, mean_cosine=min(means) if means else None,
                        seconds=time.perf_counter() - began)  # fmt: skip


def _token_ids(path: Path) -> bool:
    """Whether a safetensors file holds token ids (integers) rather than model inputs."""
    if path.suffix != ".safetensors" or not path.is_file():
        return False
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            keys = list(handle.keys())
            return len(keys) == 1 and str(handle.get_slice(keys[0]).get_dtype()).upper().startswith(
                ("I", "U")
            )
    except Exception:
        return False
