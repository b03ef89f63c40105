"""What `Quantizer` does to each op: frozen, validated configs resolved per op.

An op's config comes from the first `module_name_configs` pattern matching the module it runs in,
else the first `op_type_configs` entry naming its type, else `global_config` (the order
coremltools uses); a None entry leaves the op in float. Weights take the compression package's
`QuantizeConfig` (the same options and numerics as `quantize_weights`); activations an
`ActivationConfig`.
"""

from __future__ import annotations

import enum
import fnmatch
from dataclasses import dataclass, field
from typing import Any

from coreai_opt._errors import ConfigError
from coreai_opt.compression import DType, QScheme, QuantizeConfig


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


Entries = tuple[tuple[str, OpConfig | None], ...]


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

    @classmethod
    def w8a8(cls, observer: Observer | str = Observer.MINMAX) -> QuantizerConfig:
        return cls(OpConfig(activations=ActivationConfig(observer=_enum(Observer, observer, "observer"))))
