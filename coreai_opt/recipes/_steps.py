"""The steps a recipe is made of, as frozen records that serialise to plain data.

- `Compress`: a weight pass (`QuantizeConfig`, `PalettizeConfig`, `SparsifyConfig`, with its
  per-weight overrides and method; `calibration` names samples for methods that learn from data);
- `QuantizeActivations`: W8A8 of a `.pt2` (weights and activations, calibrated on samples);
- `Cast`: the 16-bit casts of a `.pt2`, checked against the program before it;
- `Convert`: a `.pt2` to a Core AI program;
- `Budget`: a check the program must pass here (its stored bytes), or the recipe fails;
- `KVCache`: a stateful decoder's key/value cache kept as int8, fp8 or int4 codes.

Every field is type-checked against its annotation when a step is made (`_values`), and a step
read from plain data checks its nested configs' values the same way before they are built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from coreai_opt.compression import WeightConfig
from coreai_opt.errors import ConfigError

from ._values import check_fields, check_record, least, shown


@dataclass(frozen=True, kw_only=True)
class Compress:
    """A weight pass; a method that learns from data reads the recipe's calibration."""

    config: WeightConfig

    KIND = "compress"

    def __post_init__(self) -> None:
        check_record(self)

    def tag(self) -> str:
        """The config's tag, and the method where it learns from data (`lut4-gptq`): a data-free
        and a data-aware run of the same setting write different default names."""
        from coreai_opt.compression import algorithm_for

        learns = not algorithm_for(self.config).data_free
        return str(self.config.tag) + (f"-{self.config.method}" if learns else "")

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Compress:
        values = _only(data, cls, ("config",), built=("config",))
        return cls(config=config_of(data.get("config"), "config"), **values)


# a compress step's own calibration fields, as recipes written before `Recipe.calibration` held
# them -> the CalibrationSpec field each one is now
STEP_CALIBRATION = {"calibration": "source", "calibration_samples": "samples", "calibration_tokens": "tokens",
                    "calibration_program": "program", "device": "device", "exact_gradients": "exact_gradients"}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class QuantizeActivations:
    config: Any  # a quantization.QuantizerConfig
    calibration: str
    calibration_samples: int = field(default=32, metadata=least(1))  # seeded draws of "random"
    calibration_tokens: int | str | None = None  # at most this many of a text ("all": every one)
    seed: int = field(default=0, metadata=least(0))

    KIND = "quantize_activations"

    def __post_init__(self) -> None:
        from coreai_opt.calibration import token_budget
        from coreai_opt.quantization import QuantizerConfig

        check_record(self)
        budget = token_budget(self.calibration_tokens, "calibration_tokens", self.calibration)
        object.__setattr__(self, "calibration_tokens", budget)  # a text's budget written out
        if not isinstance(self.config, QuantizerConfig):
            raise ConfigError(f"config must be a QuantizerConfig, not {type(self.config).__name__}", "config")

    def tag(self) -> str:
        op = self.config.global_config
        weights = f"w{op.weights.dtype.bits}" if op.weights is not None else "wf"
        activations = f"a{op.activations.dtype.bits}" if op.activations is not None else "af"
        return f"{weights}{activations}"

    def to_dict(self) -> dict[str, Any]:
        """The global op config at the top (`weights`, `activations`), the per-module and per-op-type
        entries beside it when there are any."""
        config = self.config.to_dict()
        data: dict[str, Any] = dict(config["global_config"])
        data.update((k, config[k]) for k in ("module_name_configs", "op_type_configs") if config[k])
        tokens = {} if self.calibration_tokens is None else {"calibration_tokens": self.calibration_tokens}
        return data | {"calibration": self.calibration, "calibration_samples": self.calibration_samples,
                       **tokens, "seed": self.seed}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuantizeActivations:
        from coreai_opt.calibration import recorded_budget
        from coreai_opt.quantization import QuantizerConfig

        parts = ("weights", "activations", "module_name_configs", "op_type_configs")
        values = _only(data, cls, parts, built=("config",))
        values["calibration_tokens"] = recorded_budget(
            values.get("calibration_tokens"), values.get("calibration")
        )
        plain = {
            "global_config": {k: data[k] for k in ("weights", "activations") if k in data},
            **{k: data[k] for k in ("module_name_configs", "op_type_configs") if k in data},
        }
        return cls(config=QuantizerConfig.from_dict(plain, check_fields), **values)


@dataclass(frozen=True, kw_only=True)
class Cast:
    to: str = "16bit"  # fp16, int16 or 16bit
    ignored_ops: tuple[str, ...] = ()
    check: bool = True
    inputs: str | None = None  # a safetensors file of example inputs for the check
    seed: int = field(default=0, metadata=least(0))
    keep_failed: bool = False  # a program that fails its check still goes on (the run fails at the end)

    KIND = "cast"

    def __post_init__(self) -> None:
        from coreai_opt.casting import CastTarget

        check_record(self)
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

    max_bytes: int = field(metadata=least(0))

    KIND = "budget"

    def __post_init__(self) -> None:
        check_record(self)

    def tag(self) -> str:
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {"max_bytes": self.max_bytes}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Budget:
        return cls(**_only(data, cls))


@dataclass(frozen=True, kw_only=True)
class Transform:
    """An equivalence-preserving edit of the program (`coreai_opt.transforms`: a norm's scale
    folded into its linears, ...), checked against the program's own outputs before the next step."""

    config: Any  # a transforms.TransformConfig

    KIND = "transform"

    def __post_init__(self) -> None:
        from coreai_opt.transforms import TransformConfig

        if not isinstance(self.config, TransformConfig):
            raise ConfigError(f"config must be a TransformConfig, not {shown(self.config)}", "config")

    def tag(self) -> str:
        return str(self.config.TAG)

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Transform:
        from coreai_opt.transforms import transform_types

        _only(data, cls, ("config",), built=("config",))
        return cls(config=_config(data.get("config"), "config", tuple(transform_types().values())))


@dataclass(frozen=True, kw_only=True)
class KVCache:
    """A stateful decoder's key/value cache kept as `dtype` codes with float16 scales
    (`models.quantize_kv_cache`: the float decoder exported again with the exporter's own cache)."""

    dtype: str

    KIND = "kv_cache"

    def __post_init__(self) -> None:
        from coreai_opt.models import check_kv_dtype

        check_record(self)
        check_kv_dtype(self.dtype, "dtype")

    def tag(self) -> str:
        return f"kv{self.dtype}"

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KVCache:
        return cls(**_only(data, cls))


Step = Compress | QuantizeActivations | Cast | Convert | Budget | Transform | KVCache
STEP_TYPES: dict[str, type] = {
    s.KIND: s for s in (Transform, KVCache, Compress, QuantizeActivations, Cast, Convert, Budget)
}


def _only(data: Any, step: type, taken: tuple[str, ...] = (), built: tuple[str, ...] = ()) -> dict[str, Any]:
    """The options of `data` a step takes as they are: its fields, less those the caller `built`
    and the keys it has `taken` to read itself; any other key, or a required one missing, refused."""
    if not isinstance(data, dict):
        raise ConfigError(f"a {step.KIND} step is a mapping, not {type(data).__name__}", step.KIND)  # type: ignore[attr-defined]
    fields = [f for f in dataclasses.fields(step) if f.name not in built]
    unknown = sorted(set(data) - {f.name for f in fields} - set(taken))
    if unknown:
        raise ConfigError(f"a {step.KIND} step has no option {unknown[0]!r}", unknown[0])  # type: ignore[attr-defined]
    missing = [f.name for f in fields if f.name not in data and f.name not in taken and _required(f)]
    if missing:
        raise ConfigError(f"a {step.KIND} step needs {missing[0]}", missing[0])  # type: ignore[attr-defined]
    return {k: v for k, v in data.items() if k not in taken}


def _required(spec: dataclasses.Field[Any]) -> bool:
    return spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING


def _mapping(data: Any, name: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{name} must be a mapping of options, not {shown(data)}", name)
    return data


def _config(data: Any, name: str, kinds: tuple[type, ...]) -> Any:
    """A config from plain data (`to_dict`'s form: its kind, version and options), every value
    type-checked before the config reads it."""
    by_kind = {kind.KIND: kind for kind in kinds}
    kind = _mapping(data, name).get("kind")
    if not isinstance(kind, str) or kind not in by_kind:
        raise ConfigError(f"{name}.kind must be one of {', '.join(by_kind)}, not {shown(kind)}", "kind")
    if type(data.get("version", 1)) is not int:  # the config compares it: `true == 1`
        raise ConfigError(f"{name}.version must be an integer, not {shown(data['version'])}", "version")
    check_fields(by_kind[kind], data, f"{name}.")
    return by_kind[kind].from_dict(data)  # type: ignore[no-any-return]


def config_of(data: Any, name: str) -> WeightConfig:
    """A compression config of any registered kind from plain data, every value type-checked."""
    from coreai_opt.compression import config_types

    return _config(data, name, tuple(config_types().values()))
