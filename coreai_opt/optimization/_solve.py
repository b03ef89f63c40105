"""The allocation: one choice per weight, least total estimated damage within a byte budget
(a multiple-choice knapsack), solved exactly by dynamic programming over bytes counted in units.

Each choice's bytes are rounded up to whole units of `budget / resolution`, so every plan found
fits the real budget, and its damage is at most that of the best plan of `budget - weights x unit`
bytes: near-exact by at most one unit per weight (0.1% of the budget for 200 weights at the
default resolution). The same table run to the largest size gives the least damage of every
size at once (`front`), from which the smallest plan within a damage bound is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._costs import CostTable

RESOLUTION = 200_000  # budget units


@dataclass(frozen=True)
class Plan:
    picks: tuple[int, ...]  # a choice (column) per weight
    nbytes: float  # of the table's weights, as stored
    damage: float  # estimated, summed over weights
    slack_bytes: float = 0.0  # the unit rounding's bound: optimal for at least budget - slack

    def names(self, table: CostTable) -> dict[str, str]:
        return {w: table.choices[k] for w, k in zip(table.names, self.picks, strict=True)}


def solve(table: CostTable, max_bytes: float, resolution: int = RESOLUTION) -> Plan | None:
    """The plan of least estimated damage whose weights take at most `max_bytes`; None if even
    the smallest choices do not fit."""
    if max_bytes < _least_bytes(table):
        return None
    unit = max(max_bytes / resolution, 1.0)
    return _Knapsack(table, unit, int(max_bytes // unit)).best(int(max_bytes // unit))


def front(table: CostTable, resolution: int = RESOLUTION) -> _Knapsack:
    """The dynamic program up to the largest plan's size: least damage for every size."""
    largest = sum(max(b for b in row if math.isfinite(b)) for row in table.nbytes)
    unit = max(largest / resolution, 1.0)
    return _Knapsack(table, unit, math.ceil(largest / unit) + len(table.names))


class _Knapsack:
    """dp[c]: the least damage of plans of exactly c units; the choice made per weight and size."""

    def __init__(self, table: CostTable, unit: float, capacity: int) -> None:
        self.table, self.unit, self.capacity = table, unit, capacity
        dp = np.full(capacity + 1, np.inf)
        dp[0] = 0.0
        self.args: list[np.ndarray] = []
        for row_bytes, row_damage in zip(table.nbytes, table.damage, strict=True):
            new = np.full(capacity + 1, np.inf)
            arg = np.full(
                capacity + 1, -1, dtype=np.int8 if len(row_bytes) < 128 else np.int16
            )  # kept to the end
            for k, (b, d) in enumerate(zip(row_bytes, row_damage, strict=True)):
                if not (math.isfinite(b) and math.isfinite(d)):
                    continue
                units = math.ceil(b / unit)
                if units > capacity:
                    continue
                tried = dp[: capacity + 1 - units] + d
                better = tried < new[units:]
                new[units:][better] = tried[better]
                arg[units:][better] = k
            dp = new
            self.args.append(arg)
        self.dp = dp
        self.least = np.minimum.accumulate(dp)  # at most c units

    def best(self, units: int) -> Plan | None:
        """The least-damage plan within `units` units."""
        units = min(units, self.capacity)
        if not math.isfinite(self.least[units]):
            return None
        end = int(np.argmin(self.dp[: units + 1]))  # the first size reaching the least damage
        return self._plan(end)

    def smallest_within(self, max_damage: float) -> Plan | None:
        """The smallest plan whose estimated damage is at most `max_damage`."""
        ok = np.nonzero(np.isfinite(self.least) & (self.least <= max_damage))[0]
        return None if len(ok) == 0 else self.best(int(ok[0]))

    def points(self, count: int = 64) -> list[tuple[float, float]]:
        """(bytes, least damage) on `count` sizes where the least damage drops: the curve."""
        with np.errstate(invalid="ignore"):  # inf - inf before the first plan
            drops = np.nonzero(np.diff(self.least, prepend=np.inf) < 0)[0]
        if len(drops) > count:
            drops = drops[np.linspace(0, len(drops) - 1, count).round().astype(int)]
        return [(float(c * self.unit), float(self.least[c])) for c in drops]

    def _plan(self, end: int) -> Plan:
        picks = []
        c = end
        for w in range(len(self.args) - 1, -1, -1):
            k = int(self.args[w][c])
            picks.append(k)
            c -= math.ceil(self.table.nbytes[w][k] / self.unit)
        picks.reverse()
        table = self.table
        nbytes = sum(table.nbytes[w][k] for w, k in enumerate(picks))
        damage = sum(table.damage[w][k] for w, k in enumerate(picks))
        return Plan(tuple(picks), nbytes, damage, len(picks) * self.unit)


def _least_bytes(table: CostTable) -> float:
    return sum(min(b for b in row if math.isfinite(b)) for row in table.nbytes)
