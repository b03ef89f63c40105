"""What a cast did, as plain records: the CLI renders them and `--json` emits them."""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


class OpOutcome(enum.Enum):
    FP16 = "now fp16"
    INT16 = "now int16"
    KEPT_FP32_OVERFLOW = "kept fp32 (overflow)"
    KEPT_FP32_IGNORED = "kept fp32 (ignored op)"
    KEPT_FP32_INPUT = "kept fp32 (fp32 input)"
    KEPT_FP32_NORM = "kept fp32 (norm statistic)"
    KEPT_INDEX_SAFETY = "kept for index safety"
    CONSTANT_FOLDABLE = "constant-foldable"


class StateOutcome(enum.Enum):
    TO_FP16 = "fp32 -> fp16"
    KEPT_FP32_OVERFLOW = "kept fp32 (overflow)"
    UNCHANGED = "unchanged"


@dataclass(frozen=True)
class IOChange:
    name: str
    kind: str  # "input" or "output"
    before: str
    after: str


@dataclass(frozen=True)
class StateChange:
    name: str
    kind: str  # parameter, buffer, constant
    shape: tuple[int, ...]
    before: str
    after: str
    outcome: StateOutcome
    max_abs: float | None = None  # the offending finite value when kept for overflow
    bytes_before: int = 0
    bytes_after: int = 0


@dataclass(frozen=True)
class OpChange:
    node: str
    target: str
    outcome: OpOutcome
    detail: str = ""

    @classmethod
    def of(cls, node: Any, outcome: OpOutcome, detail: str = "") -> OpChange:
        """The record of an FX node's outcome."""
        return cls(node.name, str(node.target), outcome, detail)


@dataclass
class CastReport:
    """Everything one run of the passes changed in an ExportedProgram."""

    passes: list[str] = field(default_factory=list)
    io: list[IOChange] = field(default_factory=list)
    state: list[StateChange] = field(default_factory=list)
    ops: list[OpChange] = field(default_factory=list)
    casts_inserted: int = 0
    casts_removed: int = 0
    nodes_before: int = 0
    nodes_after: int = 0

    @property
    def state_bytes_before(self) -> int:
        return sum(s.bytes_before for s in self.state)

    @property
    def state_bytes_after(self) -> int:
        return sum(s.bytes_after for s in self.state)

    def op_counts(self) -> dict[str, dict[str, int]]:
        """{outcome: {target: count}}, most frequent targets first."""
        grouped: dict[str, Counter[str]] = {}
        for op in self.ops:
            grouped.setdefault(op.outcome.value, Counter())[op.target] += 1
        return {outcome: dict(counter.most_common()) for outcome, counter in grouped.items()}

    def to_dict(self) -> dict[str, Any]:
        def plain(record: Any) -> dict[str, Any]:
            data = asdict(record)
            for key, value in data.items():
                if isinstance(value, enum.Enum):
                    data[key] = value.value
                elif isinstance(value, tuple):
                    data[key] = list(value)
            return data

        return {
            "passes": self.passes,
            "io": [plain(c) for c in self.io],
            "state": [plain(s) for s in self.state],
            "ops": self.op_counts(),
            "op_nodes": [plain(o) for o in self.ops],
            "casts_inserted": self.casts_inserted,
            "casts_removed": self.casts_removed,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "state_bytes_before": self.state_bytes_before,
            "state_bytes_after": self.state_bytes_after,
        }
