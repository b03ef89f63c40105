"""`TransformConfig`: the base of every program transform's config - frozen, keyword-only,
serialisable with its kind and a version, and checked against the transformed program's
outputs (`tolerance`)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, TypeVar

from coreai_opt.errors import ConfigError

CONFIG_VERSION = 1  # of `to_dict`'s layout
T = TypeVar("T", bound="TransformConfig")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformConfig:
    """What every transform shares: how closely the transformed program must reproduce the
    original's outputs - the RMS of the difference over the RMS of the outputs, on `samples`
    seeded inputs - before anything is written (`tolerance`: a few fp32 roundings by default)."""

    KIND: ClassVar[str]
    tolerance: float = 1e-5
    samples: int = 2

    def __post_init__(self) -> None:
        if (
            isinstance(self.tolerance, bool)
            or not isinstance(self.tolerance, (int, float))
            or not (0 < self.tolerance < 1)
        ):
            raise ConfigError(f"tolerance is a relative error in (0, 1), not {self.tolerance!r}", "tolerance")
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or not 1 <= self.samples <= 64:
            raise ConfigError(f"samples is 1 to 64 seeded inputs, not {self.samples!r}", "samples")

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
