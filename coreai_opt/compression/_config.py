"""One frozen, validated config per pass, and per-weight overrides by name pattern.

A config names everything its pass needs (as seed 002's keyword arguments do) and refuses a
combination the pass cannot carry out when it is made, so bad options fail before any file is read.
`overrides` change the config for the weights whose names match a pattern - skip them, or change
some fields - as coremltools' `op_name_configs` and torchao's `FqnToConfig` let users do; the first
override whose pattern matches wins.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass, field
from typing import Any, TypeVar

from coreai_opt._errors import ConfigError

from ._options import CompressionGranularity, DType, QScheme

G = CompressionGranularity
# What each option takes (the CLI offers exactly these).
WEIGHT_DTYPES = tuple(d for d in DType if d is not DType.FP8_E8M0FNU)
N_BITS = (1, 2, 3, 4, 6, 8)
LUT_DTYPES = (DType.INT8, DType.UINT8, DType.FP8_E4M3FN, DType.FP8_E5M2)
JOINT_DTYPES = (DType.INT8, DType.UINT8, DType.FP8_E4M3FN, DType.FP8_E5M2)
QUANTIZE_GRANULARITIES = (G.PER_TENSOR, G.PER_CHANNEL, G.PER_BLOCK)
PALETTIZE_GRANULARITIES = (G.PER_TENSOR, G.PER_CHANNEL, G.PER_GROUPED_CHANNEL)


@dataclass(frozen=True)
class Override:
    """Weights whose name matches `pattern` (a glob over the whole name, e.g. `layers.*.attn.*`)
    are skipped, or compressed with the config's fields in `changes` replaced."""

    pattern: str
    skip: bool = False
    changes: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, pattern: str, skip: bool = False, **changes: Any) -> Override:
        """`Override.of("embed*", skip=True)`, `Override.of("layers.*.attn.*", dtype=DType.INT8)`."""
        return cls(pattern, skip, tuple(sorted(changes.items())))

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str) or not self.pattern:
            raise ValueError("an override needs a non-empty name pattern")
        if self.skip and self.changes:
            raise ValueError(f"override {self.pattern!r}: skip takes no other changes")
        if not self.skip and not self.changes:
            raise ValueError(f"override {self.pattern!r} changes nothing: give skip or some options")
        if any(key in ("overrides", "weight_num_threshold") for key, _ in self.changes):
            raise ValueError(
                f"override {self.pattern!r}: overrides and the threshold apply to the whole program"
            )

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.pattern)

    def describe(self) -> str:
        return f"{self.pattern}: " + (
            "skip" if self.skip else ", ".join(f"{k}={_text(v)}" for k, v in self.changes)
        )


def _text(value: Any) -> str:
    return str(getattr(value, "value", value))


def parse_override(text: str, config_type: type) -> Override:
    """`PATTERN:skip` or `PATTERN:OPTION=VALUE[,OPTION=VALUE...]` (the CLI's --override), the
    values read as the config's fields take them (`n_m_ratio=2:4`, `enable_per_channel_scale=true`)."""
    pattern, sep, spec = text.rpartition(":") if text.endswith(":skip") else text.partition(":")
    if not sep or not pattern or not spec:
        raise ValueError(f"override {text!r} is not PATTERN:skip or PATTERN:OPTION=VALUE[,OPTION=VALUE]")
    if spec == "skip":
        return Override.of(pattern, skip=True)
    fields = {f.name: str(f.type) for f in dataclasses.fields(config_type)}
    changes: dict[str, Any] = {}
    for item in spec.split(","):
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in fields:
            raise ValueError(f"override {text!r}: {key!r} is not an option of {config_type.__name__}")
        changes[key] = _field_value(fields[key], value.strip(), text)
    return Override.of(pattern, **changes)


def _field_value(annotation: str, value: str, text: str) -> Any:
    if value.lower() == "none":
        return None
    try:
        if annotation.startswith("bool"):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        if annotation.startswith("tuple[int, int]"):
            n, m = value.split(":")
            return (int(n), int(m))
        if annotation.startswith("int"):
            return int(value)
        if annotation.startswith("float"):
            return float(value)
    except ValueError:
        raise ValueError(f"override {text!r}: {value!r} is not a {annotation.split(' ')[0]}") from None
    return value  # an enum's value: the config turns it into the enum and checks it


C = TypeVar("C", bound="_Config")


class _Config:
    """What every pass's config shares: the size threshold and the overrides."""

    weight_num_threshold: int
    overrides: tuple[Override, ...]

    def _check_common(self) -> None:
        from ._algorithms import algorithm_for

        algorithm_for(self)  # the method must be registered for this config type
        if not isinstance(self.weight_num_threshold, int) or self.weight_num_threshold < 0:
            raise ConfigError("weight_num_threshold must be 0 or more", "weight_num_threshold")
        object.__setattr__(self, "overrides", tuple(self.overrides))
        for override in self.overrides:
            if not isinstance(override, Override):
                raise ConfigError(f"overrides take Override records, not {override!r}", "overrides")
            names = {f.name for f in dataclasses.fields(self)}  # type: ignore[arg-type]
            unknown = [key for key, _ in override.changes if key not in names]
            if unknown:
                raise ConfigError(
                    f"override {override.pattern!r}: {type(self).__name__} has no option {unknown[0]!r}",
                    "overrides",
                )
            if not override.skip:  # the changed config must be valid too: fail now, not mid-run
                try:
                    dataclasses.replace(self, overrides=(), **self._changes(override))  # type: ignore[type-var]
                except (ValueError, TypeError) as exc:
                    raise ConfigError(f"override {override.pattern!r}: {exc}", "overrides") from None

    def for_weight(self: C, name: str) -> C | Override | None:
        """The config for one weight: itself, the first matching override's version of it, or the
        skipping override (the caller reports it)."""
        for override in self.overrides:
            if override.matches(name):
                if override.skip:
                    return override
                return dataclasses.replace(self, overrides=(), **self._changes(override))  # type: ignore[type-var]
        return self

    def _changes(self, override: Override) -> dict[str, Any]:
        """The fields an override replaces (a config may add the ones they imply)."""
        return dict(override.changes)

    def unmatched_overrides(self, names: list[str]) -> list[Override]:
        """Overrides whose pattern matches none of `names` (a typo, most likely)."""
        return [o for o in self.overrides if not any(o.matches(n) for n in names)]

    def options(self) -> dict[str, Any]:
        """The options as plain JSON values (enums by their value, overrides described)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "overrides":
                out[f.name] = [o.describe() for o in value]
            elif isinstance(value, tuple):
                out[f.name] = [_text(v) for v in value]
            else:
                out[f.name] = (
                    None
                    if value is None
                    else (value if isinstance(value, (bool, int, float)) else _text(value))
                )
        return out


def _enum(kind: type, value: Any, field_name: str) -> Any:
    if value is None or isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise ConfigError(f"unknown {kind.__name__} {value!r}; choose one of {choices}", field_name) from None


@dataclass(frozen=True)
class QuantizeConfig(_Config):
    """`quantize_weights`: integer, FP8 or MX FP4 codes with a scale per tensor, channel or block.

    granularity None takes per channel, or per block for MX FP4 (which is per block by definition).
    """

    dtype: DType = DType.INT8
    qscheme: QScheme = QScheme.SYMMETRIC
    granularity: CompressionGranularity | None = None
    block_size: int = 32
    scale_dtype: DType | None = None
    weight_num_threshold: int = 1024
    overrides: tuple[Override, ...] = ()
    method: str = "rtn"  # the algorithm (`_algorithms`): rtn unless data-driven

    def __post_init__(self) -> None:
        for name, kind in (
            ("dtype", DType),
            ("qscheme", QScheme),
            ("granularity", G),
            ("scale_dtype", DType),
        ):
            object.__setattr__(self, name, _enum(kind, getattr(self, name), name))
        if self.granularity is None:
            object.__setattr__(
                self, "granularity", G.PER_BLOCK if self.dtype is DType.FP4_E2M1FN else G.PER_CHANNEL
            )
        self._check_common()
        dtype, granularity = self.dtype, self.granularity
        if dtype is DType.FP8_E8M0FNU:
            raise ConfigError("FP8_E8M0FNU is a scale dtype, not a weight dtype", "dtype")
        if granularity not in QUANTIZE_GRANULARITIES:
            raise ConfigError(
                "quantization takes per-tensor, per-channel or per-block granularity", "granularity"
            )
        if not dtype.is_int and self.qscheme is QScheme.ASYMMETRIC:
            raise ConfigError(
                f"{dtype.name} takes the symmetric scheme only (floating-point data has no zero point)",
                "qscheme",
            )
        if self.scale_dtype is not None and self.scale_dtype is not DType.FP8_E8M0FNU:
            raise ConfigError("scale_dtype is None (the weight's float dtype) or FP8_E8M0FNU", "scale_dtype")
        if self.scale_dtype is not None and dtype.is_int:
            raise ConfigError(
                "scale_dtype applies to FP8/FP4 data; integer data takes float scales", "scale_dtype"
            )
        if dtype is DType.FP4_E2M1FN and (granularity is not G.PER_BLOCK or self.block_size != 32):
            raise ConfigError(
                "FP4_E2M1FN is MX: per-block granularity with block_size 32", "block_size", "granularity"
            )
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ConfigError("block_size must be a positive integer", "block_size")

    @property
    def e8m0_scales(self) -> bool:
        """Power-of-two (E8M0) scales: asked for, or MX FP4."""
        return self.scale_dtype is DType.FP8_E8M0FNU or self.dtype is DType.FP4_E2M1FN

    @property
    def tag(self) -> str:
        """Names the default output file: model.int8.aimodel."""
        return self.dtype.value


@dataclass(frozen=True)
class PalettizeConfig(_Config):
    """`palettize_weights`: exact k-means look-up tables of 2**n_bits entries per tensor, channel or
    group of channels; `num_kmeans_workers` threads share the work (results do not depend on it)."""

    n_bits: int = 4
    lut_dtype: DType | None = None
    granularity: CompressionGranularity = G.PER_TENSOR
    group_size: int = 32
    cluster_dim: int = 1
    enable_per_channel_scale: bool = False
    num_kmeans_workers: int = 1
    enable_fast_kmeans_mode: bool = False
    rounding_precision: int = 4
    weight_num_threshold: int = 1024
    overrides: tuple[Override, ...] = ()
    method: str = "kmeans"  # the algorithm (`_algorithms`): kmeans unless data-driven

    def __post_init__(self) -> None:
        object.__setattr__(self, "lut_dtype", _enum(DType, self.lut_dtype, "lut_dtype"))
        object.__setattr__(self, "granularity", _enum(G, self.granularity, "granularity"))
        self._check_common()
        if self.n_bits not in N_BITS:
            raise ConfigError(
                f"n_bits must be one of {', '.join(map(str, N_BITS))}, not {self.n_bits}", "n_bits"
            )
        if self.lut_dtype is not None and self.lut_dtype not in LUT_DTYPES:
            raise ConfigError("lut_dtype is None, INT8, UINT8, FP8_E4M3FN or FP8_E5M2", "lut_dtype")
        if self.granularity not in PALETTIZE_GRANULARITIES:
            raise ConfigError(
                "palettization takes per-tensor, per-channel or per-grouped-channel granularity",
                "granularity",
            )
        if self.group_size < 1:
            raise ConfigError("group_size must be positive", "group_size")
        if self.cluster_dim < 1:
            raise ConfigError("cluster_dim must be positive", "cluster_dim")
        if self.cluster_dim > 1 and self.granularity is G.PER_CHANNEL:
            raise ConfigError(
                "cluster_dim > 1 clusters vectors across output channels: use per-tensor or grouped granularity",
                "cluster_dim",
                "granularity",
            )
        if (
            self.cluster_dim > 1
            and self.granularity is G.PER_GROUPED_CHANNEL
            and self.group_size % self.cluster_dim
        ):
            raise ConfigError("group_size must be a multiple of cluster_dim", "group_size", "cluster_dim")
        if self.num_kmeans_workers < 1:
            raise ConfigError("num_kmeans_workers must be 1 or more", "num_kmeans_workers")
        if self.rounding_precision < 0:
            raise ConfigError("rounding_precision must be 0 or more", "rounding_precision")

    @property
    def tag(self) -> str:
        return f"lut{self.n_bits}"


@dataclass(frozen=True)
class SparsifyConfig(_Config):
    """`sparsify_weights`: magnitude (`target_sparsity`, by default 0.5), block (`block_size` output
    channels at a time) or n:m (`n_m_ratio=(n, m)`: n of every m kept) pruning, the kept values
    optionally quantized (`quantize_dtype`) or palettized (`palettize_nbits`)."""

    target_sparsity: float | None = None
    block_size: int | None = None
    n_m_ratio: tuple[int, int] | None = None
    quantize_dtype: DType | None = None
    palettize_nbits: int | None = None
    weight_num_threshold: int = 1024
    overrides: tuple[Override, ...] = field(default=())
    method: str = "magnitude"  # the algorithm (`_algorithms`): magnitude unless data-driven

    def __post_init__(self) -> None:
        object.__setattr__(self, "quantize_dtype", _enum(DType, self.quantize_dtype, "quantize_dtype"))
        if self.n_m_ratio is not None:
            object.__setattr__(self, "n_m_ratio", tuple(self.n_m_ratio))
        self._check_common()
        if self.n_m_ratio is None:
            if self.target_sparsity is None:
                object.__setattr__(self, "target_sparsity", 0.5)
            if not 0.0 < float(self.target_sparsity) < 1.0:  # type: ignore[arg-type]
                raise ConfigError(
                    f"target_sparsity must lie strictly between 0 and 1, not {self.target_sparsity}",
                    "target_sparsity",
                )
        else:
            if self.target_sparsity is not None:
                raise ConfigError(
                    "give exactly one of target_sparsity and n_m_ratio", "n_m_ratio", "target_sparsity"
                )
            ratio = self.n_m_ratio
            if (
                len(ratio) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in ratio)
                or not 0 < ratio[0] < ratio[1]
            ):
                raise ConfigError(
                    f"n_m_ratio is (n, m) with 0 < n < m: n of every m weights are kept, not {ratio}",
                    "n_m_ratio",
                )
            if self.block_size is not None:
                raise ConfigError("block_size applies to magnitude sparsity, not to n:m", "block_size")
        if self.block_size is not None and (not isinstance(self.block_size, int) or self.block_size < 2):
            raise ConfigError("block_size must be 2 or more (None prunes single weights)", "block_size")
        if self.quantize_dtype is not None and self.palettize_nbits is not None:
            raise ConfigError(
                "give at most one of quantize_dtype and palettize_nbits", "palettize_nbits", "quantize_dtype"
            )
        if self.quantize_dtype is not None and self.quantize_dtype not in JOINT_DTYPES:
            raise ConfigError("quantize_dtype is INT8, UINT8, FP8_E4M3FN or FP8_E5M2", "quantize_dtype")
        if self.palettize_nbits is not None and self.palettize_nbits not in N_BITS:
            raise ConfigError(
                f"palettize_nbits must be one of {', '.join(map(str, N_BITS))}", "palettize_nbits"
            )

    def _changes(self, override: Override) -> dict[str, Any]:
        """Switching between magnitude and n:m pruning clears the other one."""
        changes = dict(override.changes)
        if changes.get("n_m_ratio") is not None:
            changes.setdefault("target_sparsity", None)
        if changes.get("target_sparsity") is not None:
            changes.setdefault("n_m_ratio", None)
        return changes

    @property
    def tag(self) -> str:
        """Names the default output file: sparse50, sparse2of4, sparse50-b4-int8, sparse2of4-lut4."""
        if self.n_m_ratio is not None:
            tag = f"sparse{self.n_m_ratio[0]}of{self.n_m_ratio[1]}"
        else:
            tag = f"sparse{round(float(self.target_sparsity or 0) * 100)}"
            if self.block_size is not None:
                tag += f"-b{self.block_size}"
        if self.quantize_dtype is not None:
            tag += f"-{self.quantize_dtype.value}"
        if self.palettize_nbits is not None:
            tag += f"-lut{self.palettize_nbits}"
        return tag


Config = QuantizeConfig | PalettizeConfig | SparsifyConfig
