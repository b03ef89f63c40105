"""The steps a recipe is made of, as frozen records that serialise to plain data.

- `Compress`: a weight pass (`QuantizeConfig`, `PalettizeConfig`, `SparsifyConfig`, with its
  per-weight overrides and method; `calibration` names samples for methods that learn from data);
- `QuantizeActivations`: W8A8 of a `.pt2` (weights and activations, calibrated on samples);
- `Cast`: the 16-bit casts of a `.pt2`, checked against the program before it;
- `Convert`: a `.pt2` to a Core AI program;
- `Budget`: a check the program must pass here (its stored bytes), or the recipe fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coreai_opt._errors import ConfigError
from coreai_opt.compression import Config, config_from_dict


@dataclass(frozen=True, kw_only=True)
class Compress:
    config: Config
    calibration: str | None = None  # samples: a safetensors file or folder, a text file, or "random"
    calibration_samples: int | None = None
    calibration_tokens: int | None = None
    calibration_program: str | None = None  # an .aimodel's .pt2 source: statistics found by weight name
    device: str | None = None  # where calibration runs and GPTQ / SparseGPT solve (None: the CPU)
    exact_gradients: bool = False  # the Fisher pass in the program's dtypes (not bfloat16 products)

    KIND = "compress"

    def __post_init__(self) -> None:
        if not isinstance(self.exact_gradients, bool):
            raise ConfigError("exact_gradients is true or false", "exact_gradients")

    def tag(self) -> str:
        return str(self.config.tag)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"config": self.config.to_dict()}
        for name in (
            "calibration",
            "calibration_samples",
            "calibration_tokens",
            "calibration_program",
            "device",
        ):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        if self.exact_gradients:
            data["exact_gradients"] = True
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Compress:
        return cls(config=config_from_dict(data.get("config")), **_only(data, cls, ("config",)))


@dataclass(frozen=True, kw_only=True)
class QuantizeActivations:
    config: Any  # a quantization.QuantizerConfig
    calibration: str
    calibration_samples: int = 32
    seed: int = 0

    KIND = "quantize_activations"

    def tag(self) -> str:
        op = self.config.global_config
        weights = f"w{op.weights.dtype.bits}" if op.weights is not None else "wf"
        activations = f"a{op.activations.dtype.bits}" if op.activations is not None else "af"
        return f"{weights}{activations}"

    def to_dict(self) -> dict[str, Any]:
        op = self.config.global_config
        acts = op.activations
        return {
            "weights": op.weights.to_dict() if op.weights is not None else None,
            "activations": None if acts is None else {
                "dtype": acts.dtype.value, "qscheme": acts.qscheme.value, "observer": acts.observer.value,
                "percentile": acts.percentile, "averaging_constant": acts.averaging_constant,
            },
            "calibration": self.calibration, "calibration_samples": self.calibration_samples, "seed": self.seed,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuantizeActivations:
        from coreai_opt.compression import QuantizeConfig
        from coreai_opt.quantization import ActivationConfig, OpConfig, QuantizerConfig

        weights = data.get("weights")
        acts = data.get("activations")
        op = OpConfig(
            weights=QuantizeConfig.from_dict(weights) if weights is not None else None,
            activations=ActivationConfig(**acts) if isinstance(acts, dict) else None,
        )
        return cls(config=QuantizerConfig(op), **_only(data, cls, ("weights", "activations")))


@dataclass(frozen=True, kw_only=True)
class Cast:
    to: str = "16bit"  # fp16, int16 or 16bit
    ignored_ops: tuple[str, ...] = ()
    check: bool = True
    inputs: str | None = None  # a safetensors file of example inputs for the check
    seed: int = 0
    keep_failed: bool = False  # a program that fails its check still goes on (the run fails at the end)

    KIND = "cast"

    def __post_init__(self) -> None:
        from coreai_opt.casting import CastTarget

        try:
            CastTarget(self.to)
        except ValueError:
            raise ConfigError(f"cast to fp16, int16 or 16bit, not {self.to!r}", "to") from None
        object.__setattr__(self, "ignored_ops", tuple(self.ignored_ops))

    def tag(self) -> str:
        from coreai_opt.casting import CastTarget

        return CastTarget(self.to).suffix.lstrip(".")

    def to_dict(self) -> dict[str, Any]:
        return {"to": self.to, "ignored_ops": list(self.ignored_ops), "check": self.check, "inputs": self.inputs,
                "seed": self.seed, "keep_failed": self.keep_failed}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cast:
        return cls(**_only(data, cls))


@dataclass(frozen=True, kw_only=True)
class Convert:
    KIND = "convert"

    def tag(self) -> str:
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Convert:
        return cls(**_only(data, cls))


@dataclass(frozen=True, kw_only=True)
class Budget:
    """The program's stored weight bytes must not exceed `max_bytes` at this point."""

    max_bytes: int | None = None

    KIND = "budget"

    def tag(self) -> str:
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {"max_bytes": self.max_bytes}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Budget:
        return cls(**_only(data, cls))


Step = Compress | QuantizeActivations | Cast | Convert | Budget
STEP_TYPES: dict[str, type] = {s.KIND: s for s in (Compress, QuantizeActivations, Cast, Convert, Budget)}


def _only(data: Any, step: type, taken: tuple[str, ...] = ()) -> dict[str, Any]:
    """The step's own fields of `data`, refusing any other key (naming it)."""
    import dataclasses

    if not isinstance(data, dict):
        raise ConfigError(f"a {step.KIND} step is a mapping, not {type(data).__name__}", step.KIND)  # type: ignore[attr-defined]
    names = {f.name for f in dataclasses.fields(step)}
    unknown = sorted(set(data) - names - set(taken))
    if unknown:
        raise ConfigError(f"a {step.KIND} step has no option {unknown[0]!r}", unknown[0])  # type: ignore[attr-defined]
    values = {k: v for k, v in data.items() if k not in taken}
    if "ignored_ops" in values and isinstance(values["ignored_ops"], list):
        values["ignored_ops"] = tuple(values["ignored_ops"])
    return values
