"""How each input is drawn: the rule per input, and the seeded draw."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


class Kind(enum.Enum):
    FLOAT = "float"
    INT = "int"
    BOOL = "bool"

    @classmethod
    def of(cls, dtype: object) -> Kind:
        """The kind of a numpy or torch dtype."""
        name = str(dtype).removeprefix("torch.")
        if name in ("bool", "bool_"):
            return cls.BOOL
        if "int" in name:
            return cls.INT
        return cls.FLOAT


@dataclass(frozen=True)
class InputSpec:
    name: str
    kind: Kind
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Usage:
    """What a program does with one input."""

    index_rows: int | None = None  # rows of the smallest table it indexes (None: indexes nothing)
    through_arithmetic: bool = False  # it passes through arithmetic before indexing (ids * 2 + 3)


class Draw(enum.Enum):
    INDEX = "index"  # integers in [0, rows) of the table they index
    BINARY = "binary"  # {0, 1}: integers and booleans that feed arithmetic, where or masks
    NORMAL = "normal"  # floats from N(0, 1)
    RANGE = "range"  # integers from a range the user gave
    FILE = "file"  # read from the user's file


@dataclass(frozen=True)
class InputRule:
    """How one input is drawn, and why."""

    name: str
    draw: Draw
    low: int = 0
    high: int = 2  # exclusive
    reason: str = ""

    def describe(self) -> str:
        if self.draw is Draw.NORMAL:
            text = "floats from N(0, 1)"
        elif self.draw is Draw.FILE:
            text = "from the inputs file"
        elif self.draw is Draw.BINARY:
            text = "values in {0, 1}"
        else:
            text = f"integers in [{self.low}, {self.high})"
        return f"{text} ({self.reason})" if self.reason else text

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "draw": self.draw.value, "low": self.low, "high": self.high,
                "reason": self.reason, "description": self.describe()}  # fmt: skip


def _rule(spec: InputSpec, usage: Usage, int_range: tuple[int, int] | None) -> InputRule:
    if spec.kind is Kind.FLOAT:
        return InputRule(spec.name, Draw.NORMAL)
    if spec.kind is Kind.INT and int_range is not None:
        return InputRule(spec.name, Draw.RANGE, int_range[0], int_range[1], "the range given")
    if spec.kind is Kind.INT and usage.index_rows is not None:
        rows = usage.index_rows
        if usage.through_arithmetic:
            # ids may be shifted or scaled before they index: a quarter of the table keeps them in it
            return InputRule(spec.name, Draw.INDEX, 0, max(2, rows // 4),
                             f"indexes a table of {rows} rows after arithmetic: a quarter of it")  # fmt: skip
        return InputRule(spec.name, Draw.INDEX, 0, max(1, rows), f"indexes a table of {rows} rows")
    reason = "a mask or flag" if spec.kind is Kind.BOOL else "feeds arithmetic or a mask, never an index"
    return InputRule(spec.name, Draw.BINARY, 0, 2, reason)


def input_rules(
    specs: Sequence[InputSpec], usage: Mapping[str, Usage], int_range: tuple[int, int] | None = None
) -> list[InputRule]:
    """The rule for each input, from what the program does with it (`int_range` overrides
    integers)."""
    return [_rule(spec, usage.get(spec.name, Usage()), int_range) for spec in specs]


def draw_inputs(
    specs: Sequence[InputSpec], rules: Sequence[InputRule], seed: int = 0
) -> dict[str, np.ndarray]:
    """Seeded inputs by name: float32, int64 or bool arrays (the caller converts to the model's dtypes)."""
    rng = np.random.default_rng(seed)
    out = {}
    for spec, rule in zip(specs, rules, strict=True):
        if spec.kind is Kind.FLOAT:
            out[spec.name] = rng.standard_normal(spec.shape).astype(np.float32)
        elif spec.kind is Kind.BOOL:
            out[spec.name] = rng.integers(0, 2, spec.shape).astype(np.bool_)
        else:
            out[spec.name] = rng.integers(rule.low, rule.high, spec.shape).astype(np.int64)
    return out


def seeded_samples(
    specs: Sequence[InputSpec], rules: Sequence[InputRule], seeds: range
) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """One draw per seed, labelled `seed N` (drawn as they are consumed)."""
    return ((f"seed {seed}", draw_inputs(specs, rules, seed)) for seed in seeds)


def seeded_source(seeds: range) -> str:
    """How reports name seeded draws: `seeded random (seed 0)`, `seeded random (seeds 0..31)`."""
    if len(seeds) == 1:
        return f"seeded random (seed {seeds[0]})"
    return f"seeded random (seeds {seeds[0]}..{seeds[-1]})"
