"""Cast options as enums, and per-thread defaults set by `tcast.initialize`."""

from __future__ import annotations

import contextvars
import enum
from dataclasses import dataclass, replace
from typing import Any


class RoundMode(enum.Enum):
    EVEN = "even"  # round to nearest, ties to even
    NEAREST = "nearest"  # round to nearest, ties away from zero
    ZERO = "zero"  # truncate toward zero
    STOCHASTIC = "stochastic"  # round up with probability equal to the remainder


class ScaleMode(enum.Enum):
    """How a block's power-of-two scale follows its amax (float scales read every mode but CEIL
    as MAX: to nearest). Also spelt as torchao and cuBLAS name them: `floor` is MAX, `rceil`
    (ceil of amax / the element's max) is CEIL."""

    MAX = "max"  # OCP MX: floor(log2(amax)) - emax; the largest values may saturate
    MIDMAX = "midmax"  # one exponent higher when amax lies above the format's midmax
    CEIL = "ceil"  # the smallest power of two at which nothing saturates
    EVEN = "even"  # torchao's EVEN: amax rounded to the element's mantissa bits (half up), then MAX


_SPELLINGS = {"floor": "max", "rceil": "ceil"}


class CastMode(enum.Enum):
    VIRTUAL = "virtual"  # fake-quantized tensor in the input's dtype
    ACTUAL = "actual"  # a tcast.Tensor of packed codes plus scales


class ComputeMode(enum.Enum):
    AUTO = "auto"
    TORCH = "torch"
    TRITON = "triton"


@dataclass(frozen=True)
class Defaults:
    roundmode: RoundMode = RoundMode.EVEN
    scalemode: ScaleMode = ScaleMode.MAX
    computemode: ComputeMode = ComputeMode.AUTO


_DEFAULTS: contextvars.ContextVar[Defaults] = contextvars.ContextVar("tcast_defaults", default=Defaults())  # noqa: B039  (frozen, immutable)


def _coerce(enum_type: type[enum.Enum], value: Any) -> Any:
    if isinstance(value, enum_type):
        return value
    text = str(value).lower()
    if enum_type is ScaleMode:
        text = _SPELLINGS.get(text, text)
    try:
        return enum_type(text)
    except ValueError:
        choices = ", ".join(m.value for m in enum_type)
        raise ValueError(f"unknown {enum_type.__name__} {value!r}; choose one of {choices}") from None


def initialize(roundmode: Any = None, scalemode: Any = None, computemode: Any = None) -> Defaults:
    """Set this thread's (this context's) default modes; other threads keep their own."""
    current = _DEFAULTS.get()
    updated = replace(
        current,
        roundmode=_coerce(RoundMode, roundmode) if roundmode is not None else current.roundmode,
        scalemode=_coerce(ScaleMode, scalemode) if scalemode is not None else current.scalemode,
        computemode=_coerce(ComputeMode, computemode) if computemode is not None else current.computemode,
    )
    _DEFAULTS.set(updated)
    return updated


def defaults() -> Defaults:
    return _DEFAULTS.get()


def resolve_round(value: Any) -> RoundMode:
    return defaults().roundmode if value is None else _coerce(RoundMode, value)


def resolve_scale(value: Any) -> ScaleMode:
    return defaults().scalemode if value is None else _coerce(ScaleMode, value)


def resolve_compute(value: Any) -> ComputeMode:
    return defaults().computemode if value is None else _coerce(ComputeMode, value)


def resolve_cast(value: Any) -> CastMode:
    return CastMode.VIRTUAL if value is None else _coerce(CastMode, value)
