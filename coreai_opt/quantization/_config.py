"""What `Quantizer` does to each op: frozen, validated configs resolved per op.

An op's config comes from the first `module_name_configs` pattern matching the module it runs in,
else the first `op_type_configs` entry naming its type, else `global_config` (the order
coremltools uses); a None entry leaves the op in float. Weights take the compression package's
`QuantizeConfig` (the same options and numerics as `quantize_weights`); activations an
`ActivationConfig`.
"""

from __future__ import annotations

import dataclasses
import enum
import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from coreai_opt.compression import DType, QScheme, QuantizeConfig
from coreai_opt.errors import ConfigError, shown


class ExportBackend(enum.Enum):
    """What `Quantizer.finalize` builds the model for."""

    CoreAI = "coreai"  # coreai-torch's quantize/dequantize and weight decompression ops


class Observer(enum.Enum):
    """How an activation's range is found from the calibration passes."""

    MINMAX = "minmax"  # the smallest and largest value seen
    MOVING_AVERAGE = "moving_average"  # per-pass min and max, exponentially averaged
    PERCENTILE = "percentile"  # the given percentile at each end (outliers clipped)
    MSE = "mse"  # least squared error per activation, kept where the model's output agrees (else min-max)


class OpType(enum.Enum):
    """The ops whose activation inputs are quantized (`op_type_configs` keys)."""

    LINEAR = "linear"
    CONV = "conv"
    MATMUL = "matmul"  # mm, bmm, matmul, addmm, baddbmm


ACTIVATION_DTYPES = (DType.INT8, DType.UINT8)


def _enum(kind: type[enum.Enum], value: Any, field_name: str) -> Any:
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(str(m.value) for m in kind)
        raise ConfigError(f"unknown {kind.__name__} {value!r}; choose one of {choices}", field_name) from None


@dataclass(frozen=True)
class ActivationConfig:
    """Per-tensor activation quantization: 8-bit codes, one scale (and zero point) per tensor.

    `percentile` is the share of values kept inside the range at each end (PERCENTILE);
    `averaging_constant` the weight of each new pass (MOVING_AVERAGE).
    """

    dtype: DType = DType.INT8
    qscheme: QScheme = QScheme.ASYMMETRIC
    observer: Observer = Observer.MINMAX
    percentile: float = 99.99
    averaging_constant: float = 0.01

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _enum(DType, self.dtype, "dtype"))
        object.__setattr__(self, "qscheme", _enum(QScheme, self.qscheme, "qscheme"))
        object.__setattr__(self, "observer", _enum(Observer, self.observer, "observer"))
        if self.dtype not in ACTIVATION_DTYPES:
            raise ConfigError(f"activations are quantized to int8 or uint8, not {self.dtype.value}", "dtype")
        if not 50.0 < float(self.percentile) <= 100.0:
            raise ConfigError(f"percentile must lie in (50, 100], not {self.percentile}", "percentile")
        if not 0.0 < float(self.averaging_constant) <= 1.0:
            raise ConfigError(
                f"averaging_constant must lie in (0, 1], not {self.averaging_constant}", "averaging_constant"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype.value, "qscheme": self.qscheme.value, "observer": self.observer.value,
                "percentile": self.percentile, "averaging_constant": self.averaging_constant}  # fmt: skip


def _default_weights() -> QuantizeConfig:
    # every weight of a quantized op, however small: its activations are quantized too
    return QuantizeConfig(dtype=DType.INT8, weight_num_threshold=0)


@dataclass(frozen=True)
class OpConfig:
    """How one op is quantized; None leaves that part in float."""

    weights: QuantizeConfig | None = field(default_factory=_default_weights)
    activations: ActivationConfig | None = field(default_factory=ActivationConfig)

    def __post_init__(self) -> None:
        if self.weights is not None and not isinstance(self.weights, QuantizeConfig):
            raise ConfigError(f"weights takes a QuantizeConfig or None, not {self.weights!r}", "weights")
        if self.weights is not None and self.weights.overrides:
            raise ConfigError(
                "per-weight choices go in module_name_configs, not in weight overrides", "weights"
            )
        if self.activations is not None and not isinstance(self.activations, ActivationConfig):
            raise ConfigError(
                f"activations takes an ActivationConfig or None, not {self.activations!r}", "activations"
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the weights' config (without its kind) and the activations', None for float."""
        weights = (
            None if self.weights is None else {k: v for k, v in self.weights.to_dict().items() if k != "kind"}
        )
        return {
            "weights": weights,
            "activations": None if self.activations is None else self.activations.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any, check: Check | None = None) -> OpConfig:
        """An OpConfig from `to_dict`'s data; `check(owner, values, place)` sees every mapping
        before it is read (a recipe file's type checks)."""
        data = _mapping(data, "op config")
        unknown = sorted(set(data) - {"weights", "activations"})
        if unknown:
            raise ConfigError(f"an op config has no option {unknown[0]!r}", unknown[0])
        weights, acts = data.get("weights"), data.get("activations")
        if weights is not None:
            weights = {"kind": QuantizeConfig.KIND, **_mapping(weights, "weights")}
            (check or _no_check)(QuantizeConfig, weights, "weights.")
            weights = QuantizeConfig.from_dict(weights)
        if acts is not None:
            acts = _mapping(acts, "activations")
            unknown = sorted(set(acts) - {f.name for f in dataclasses.fields(ActivationConfig)})
            if unknown:
                raise ConfigError(f"activations: ActivationConfig has no option {unknown[0]!r}", unknown[0])
            (check or _no_check)(ActivationConfig, acts, "activations.")
            acts = ActivationConfig(**acts)
        return cls(weights=weights, activations=acts)


Check = Callable[[type, dict[str, Any], str], None]


def _no_check(owner: type, values: dict[str, Any], place: str) -> None:
    del owner, values, place


def _mapping(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{what} must be a mapping of options, not {shown(data)}", what.split()[-1])
    return data


Entries = tuple[tuple[str, OpConfig | None], ...]
_VERSION = 1  # of `to_dict`'s layout


def _entries(value: Any, what: str) -> Entries:
    items = value.items() if isinstance(value, dict) else value
    entries = tuple((key, config) for key, config in items)
    for key, config in entries:
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{what} keys are non-empty strings, not {key!r}", what)
        if config is not None and not isinstance(config, OpConfig):
            raise ConfigError(
                f"{what}[{key!r}] takes an OpConfig or None (leave in float), not {config!r}", what
            )
    return entries


@dataclass(frozen=True)
class QuantizerConfig:
    """W8A8 by default: int8 per-channel symmetric weights, int8 per-tensor activations (min-max).

    `module_name_configs` maps a glob over module names (`encoder.layers.*.attn`, `classifier`)
    to an OpConfig or None; `op_type_configs` maps `linear`, `conv` or `matmul` likewise. Both take
    a dict or (key, config) pairs; the first match wins.
    """

    global_config: OpConfig = field(default_factory=OpConfig)
    module_name_configs: Entries = ()
    op_type_configs: Entries = ()

    def __post_init__(self) -> None:
        if not isinstance(self.global_config, OpConfig):
            raise ConfigError(f"global_config takes an OpConfig, not {self.global_config!r}", "global_config")
        object.__setattr__(
            self, "module_name_configs", _entries(self.module_name_configs, "module_name_configs")
        )
        types = _entries(self.op_type_configs, "op_type_configs")
        for key, _ in types:
            _enum(OpType, key, "op_type_configs")
        object.__setattr__(self, "op_type_configs", types)

    def for_op(self, module: str, op_type: OpType) -> OpConfig | None:
        """The config of an op of `op_type` running in module `module` (None: leave it in float)."""
        for pattern, config in self.module_name_configs:
            if fnmatch.fnmatchcase(module, pattern):
                return config
        for key, config in self.op_type_configs:
            if OpType(key) is op_type:
                return config
        return self.global_config

    def to_dict(self) -> dict[str, Any]:
        """Plain data, every part: the global op config and both lists of entries (None: float)."""

        def entries(items: Entries, key: str) -> list[dict[str, Any]]:
            return [{key: k, "config": None if c is None else c.to_dict()} for k, c in items]

        return {"kind": "w8a8", "version": _VERSION, "global_config": self.global_config.to_dict(),
                "module_name_configs": entries(self.module_name_configs, "pattern"),
                "op_type_configs": entries(self.op_type_configs, "op_type")}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Any, check: Check | None = None) -> QuantizerConfig:
        """A QuantizerConfig from `to_dict`'s data (unknown keys and versions refused)."""
        data = _mapping(data, "quantizer config")
        if data.get("version", _VERSION) != _VERSION:
            raise ConfigError(
                f"quantizer config version {data.get('version')!r} is not {_VERSION}", "version"
            )
        unknown = sorted(
            set(data) - {"kind", "version", "global_config", "module_name_configs", "op_type_configs"}
        )
        if unknown:
            raise ConfigError(f"a quantizer config has no option {unknown[0]!r}", unknown[0])

        def entries(key: str, name: str) -> list[tuple[str, OpConfig | None]]:
            items = data.get(name) or []
            if not isinstance(items, list):
                raise ConfigError(f"{name} is a list of entries, not {type(items).__name__}", name)
            found = []
            for item in items:
                item = _mapping(item, f"an entry of {name}")
                if set(item) - {key, "config"} or not isinstance(item.get(key), str):
                    raise ConfigError(
                        f"an entry of {name} is {{{key}: TEXT, config: OP CONFIG or null}}", name
                    )
                config = item.get("config")
                found.append((item[key], None if config is None else OpConfig.from_dict(config, check)))
            return found

        global_config = OpConfig.from_dict(data.get("global_config", {}), check)
        return cls(
            global_config, entries("pattern", "module_name_configs"), entries("op_type", "op_type_configs")
        )

    @classmethod
    def w8a8(cls, observer: Observer | str = Observer.MINMAX) -> QuantizerConfig:
        return cls(OpConfig(activations=ActivationConfig(observer=_enum(Observer, observer, "observer"))))
