"""The goal of an optimization and the records of its run: `Goal` (the one budget, checked when
made), `Measured` (a program's numbers on the evaluation data), `Round` (one confirmation round),
`Uniform` (one uniform setting compared), `OptimizeReport` (everything the run found, as a dict or
CSV) and `Optimized` (what `optimize` returns). Plain data, no model work: the search
(`_optimize`), the rounds (`_confirm`), the judge (`_judge`), the plot (`_plot`) and the CLI all read
and write these, so they sit below every other module of the optimization.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from coreai_opt.errors import ConfigError

_FLOAT_BITS = 32  # a float32 weight's bits: the most a weight takes as stored


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
        if name == "target_bits" and value >= _FLOAT_BITS:
            raise ConfigError(
                f"target_bits {value:g} is not below {_FLOAT_BITS}, a float32 weight's bits: no plan compresses "
                "to it", name,
            )  # fmt: skip

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
    estimate_sample: int = 0  # values: a larger weight was estimated on a sample (k-entry tables: 16/k)
    sampled: int = 0  # weights estimated on a sample

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
            "estimate_sample": {"values": self.estimate_sample, "weights": self.sampled},
        }  # fmt: skip


class Optimized(NamedTuple):
    program: Path | None  # the file written (None: a dry run)
    recipe: Any  # a recipes.Recipe that `coreopt apply` reproduces it with
    report: OptimizeReport
