"""The report `coreopt inspect` renders: plain dataclasses that turn into JSON."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class WeightInfo:
    """One stored tensor: a parameter, buffer or constant; for Core AI, a (possibly compressed) weight."""

    name: str
    shape: tuple[int, ...]
    encoding: str
    nbytes: int
    kind: str = "weight"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.nbytes / self.numel if self.numel else 0.0


@dataclass(frozen=True)
class ModelReport:
    path: str
    format: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    ops: dict[str, int]
    weights: tuple[WeightInfo, ...]
    parameters: int
    notes: tuple[str, ...] = field(default=())

    @property
    def weight_elements(self) -> int:
        return sum(w.numel for w in self.weights)

    @property
    def weight_bytes(self) -> int:
        return sum(w.nbytes for w in self.weights)

    @property
    def mean_bits_per_weight(self) -> float:
        elements = self.weight_elements
        return 8.0 * self.weight_bytes / elements if elements else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "inputs": [asdict(t) | {"shape": list(t.shape)} for t in self.inputs],
            "outputs": [asdict(t) | {"shape": list(t.shape)} for t in self.outputs],
            "ops": dict(self.ops),
            "weights": [
                asdict(w)
                | {"shape": list(w.shape), "numel": w.numel, "bits_per_weight": round(w.bits_per_weight, 4)}
                for w in self.weights
            ],
            "totals": {
                "parameters": self.parameters,
                "weights": len(self.weights),
                "weight_elements": self.weight_elements,
                "weight_bytes": self.weight_bytes,
                "mean_bits_per_weight": round(self.mean_bits_per_weight, 4),
            },
            "notes": list(self.notes),
        }
