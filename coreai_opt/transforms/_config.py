"""`TransformConfig`: the base of every program transform's config - frozen, keyword-only,
serialisable with its kind and a version, and checked against the transformed program's
outputs (`tolerance`)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, TypeVar

from coreai_opt.errors import ConfigError

CONFIG_VERSION = 1  # of `to_dict`'s layout
T = TypeVar("T", bound="TransformConfig")
_ROUNDINGS = 10  # a default tolerance: this many machine epsilons of the weights' coarsest float dtype


def default_tolerance(state: dict[str, Any]) -> float:
    """`_ROUNDINGS` machine epsilons of the coarsest float dtype among the program's weights
    (float32: 1.2e-6; float16: 9.8e-3; bfloat16: 7.8e-2): a transform stores every weight it
    turns again in its own dtype, so a float16 program cannot come closer than its rounding."""
    import torch

    dtypes = {value.dtype for value in state.values() if value.is_floating_point()} or {torch.float32}
    return _ROUNDINGS * max(torch.finfo(dtype).eps for dtype in dtypes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformConfig:
    """What every transform shares: how closely the transformed program must reproduce the
    original's outputs - the RMS of the difference over the RMS of the outputs, both computed in
    float64 (in their own dtypes where an op has no float64 kernel) on `samples` seeded inputs -
    before anything is written (`tolerance`; None: `default_tolerance` of the program, what
    storing its weights again in their own dtype may cost)."""

    KIND: ClassVar[str]
    TAG: ClassVar[str]  # in default output names: model.<tag>.pt2
    NEEDS_DATA: ClassVar[bool] = False  # True: its edit takes a calibration (weights.Calibration)
    tolerance: float | None = None
    samples: int = 2

    def __post_init__(self) -> None:
        if self.tolerance is not None and (
            isinstance(self.tolerance, bool)
            or not isinstance(self.tolerance, (int, float))
            or not (0 < self.tolerance < 1)
        ):
            raise ConfigError(f"tolerance is a relative error in (0, 1), not {self.tolerance!r}", "tolerance")
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or not 1 <= self.samples <= 64:
            raise ConfigError(f"samples is 1 to 64 seeded inputs, not {self.samples!r}", "samples")

    def learns(self) -> bool:
        """Whether this transform reads calibration data (its edit then takes a calibration)."""
        return self.NEEDS_DATA

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the kind, the layout's version and every field."""
        data: dict[str, Any] = {"kind": self.KIND, "version": CONFIG_VERSION}
        data.update((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
        return data

    @classmethod
    def from_dict(cls: type[T], data: Any) -> T:
        """A config from `to_dict`'s data (unknown fields and versions refused, naming them)."""
        from coreai_opt.compression import plain_fields

        return cls(**plain_fields(cls, data, CONFIG_VERSION))


@dataclasses.dataclass(frozen=True, kw_only=True)
class FoldNormsConfig(TransformConfig):
    """Fold each normalization's elementwise scale (and a LayerNorm's shift) into the linear
    layers that read it, leaving the norm with scale 1 and shift 0: the program computes the
    same function, and its linear weights carry the scales - the first step of rotating a
    residual stream, and what makes a norm's output the same for every channel's scale."""

    KIND: ClassVar[str] = "fold_norms"
    TAG: ClassVar[str] = "folded"


ROTATIONS = ("hadamard", "random", "learned")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RotateConfig(TransformConfig):
    """Rotate the residual stream by an orthogonal matrix folded into the weights (norms folded
    first): `rotation` "hadamard" (random signs times a Hadamard matrix - a Kronecker product
    with a random orthogonal factor where the width has no Hadamard matrix here) or "random"
    (Haar), drawn from `seed`, or "learned" from that start on calibration data; with `heads`,
    also every attention layer's values and outputs by one rotation of the head dimension (seed
    + 1: off by default - on SmolLM2-135M it cost int4 GPTQ accuracy, docs/benchmarks.md). The program computes the same function with
    weights whose channels carry equal energy."""

    KIND: ClassVar[str] = "rotate"
    TAG: ClassVar[str] = "rotated"
    rotation: str = "hadamard"
    seed: int = 0
    heads: bool = False
    steps: int = 300
    learning_rate: float = 1e-3
    bits: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rotation not in ROTATIONS:
            raise ConfigError(f"rotation is one of {', '.join(ROTATIONS)}, not {self.rotation!r}", "rotation")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**62:
            raise ConfigError(f"seed is a non-negative integer, not {self.seed!r}", "seed")
        if not isinstance(self.heads, bool):
            raise ConfigError(f"heads is true or false, not {self.heads!r}", "heads")
        for name, low, high in (("steps", 1, 100_000), ("bits", 2, 8)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(f"{name} is an integer from {low} to {high}, not {value!r}", name)
        rate = self.learning_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < 1:
            raise ConfigError(f"learning_rate is in (0, 1), not {rate!r}", "learning_rate")

    def learns(self) -> bool:
        return self.rotation == "learned"


SCALINGS = ("awq", "smooth")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScaleConfig(TransformConfig):
    """Per-channel scales between each norm and the linears reading it, and between a gated
    MLP's up and down projections (AWQ), searched on calibration data: `grid` + 1 strengths
    a in [0, 1] of the activations' RMS, judged by round to nearest of the readers' weights with
    `bits` bits, symmetric, per output channel (`group_size` 0) or per group of inputs; or
    SmoothQuant's migration at strength `alpha` (`method` "smooth", for W8A8)."""

    KIND: ClassVar[str] = "scale"
    TAG: ClassVar[str] = "scaled"
    NEEDS_DATA: ClassVar[bool] = True
    method: str = "awq"
    bits: int = 4
    group_size: int = 0
    grid: int = 20
    alpha: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.method not in SCALINGS:
            raise ConfigError(f"method is one of {', '.join(SCALINGS)}, not {self.method!r}", "method")
        for name, low, high in (("bits", 2, 8), ("group_size", 0, 4096), ("grid", 1, 100)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(f"{name} is an integer from {low} to {high}, not {value!r}", name)
        if (
            isinstance(self.alpha, bool)
            or not isinstance(self.alpha, (int, float))
            or not 0 <= self.alpha <= 1
        ):
            raise ConfigError(f"alpha is a migration strength from 0 to 1, not {self.alpha!r}", "alpha")
