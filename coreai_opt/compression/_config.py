"""One frozen, validated config per pass, and per-weight overrides by name pattern.

A config names everything its pass needs (as seed 002's keyword arguments do), is built by keyword
only, and refuses a combination the pass cannot carry out when it is made (`ConfigError`, naming
the field), so bad options fail before any file is read. `overrides` change the config for the
weights whose names match a pattern - skip them, or change some fields - as coremltools'
`op_name_configs` and torchao's `FqnToConfig` let users do; the first override whose pattern
matches wins.

Each field carries its command-line flag and help (`Flag`, in the field's metadata): the CLI's
options, its flag names in errors and the `--override` parser are made from them. A config
serialises to plain data with its kind and a version (`to_dict` / `config_from_dict`; JSON or
YAML files through `coreai_opt.recipes`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from coreai_opt._errors import ConfigError

from ._options import CompressionGranularity, DType, QScheme

G = CompressionGranularity
CONFIG_VERSION = 1  # of `to_dict`'s layout


@dataclass(frozen=True)
class Flag:
    """How a config field appears on the command line: its flag, its help, the values it offers
    (None: any of its type), and the CLI's own default where it differs from the library's."""

    flag: str
    help: str
    choices: tuple[Any, ...] | None = None
    cli_default: Any = None  # None: the library's default


def option(default: Any, flag: str, help: str, **more: Any) -> Any:
    """A config field with its `Flag`."""
    return field(default=default, metadata={"flag": Flag(flag, help, **more)})


def flags(config_type: type) -> dict[str, Flag]:
    """Field name -> its `Flag`, in field order."""
    return {f.name: f.metadata["flag"] for f in dataclasses.fields(config_type) if "flag" in f.metadata}


def flag_names(config_type: type) -> dict[str, str]:
    """Field name -> its command-line flag (what a CLI error names)."""
    return {name: flag.flag for name, flag in flags(config_type).items()}


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

_THRESHOLD_HELP = "Skip weights with this many elements or fewer."
_OVERRIDE_HELP = (
    "Per-weight change, by a glob over the weight's name (first match wins): 'PATTERN:skip', or "
    "'PATTERN:OPTION=VALUE[,OPTION=VALUE]' with the pass's option names (dtype=int8, n_bits=8, "
    "granularity=channel, ...). Repeatable. Example: --override 'embed*:skip'"
)
_METHOD_HELP = "The algorithm (data-free: {default}; those that learn from data need --calibration)."


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
        canonical = []
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
                    changed = dataclasses.replace(self, overrides=(), **self._changes(override))  # type: ignore[type-var]
                except (ValueError, TypeError) as exc:
                    raise ConfigError(f"override {override.pattern!r}: {exc}", "overrides") from None
                # the values as the config holds them (enums, tuples): one override, one spelling
                values = tuple((key, getattr(changed, key)) for key, _ in override.changes)
                override = dataclasses.replace(override, changes=values)
            canonical.append(override)
        object.__setattr__(self, "overrides", tuple(canonical))

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

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data (its kind, the layout's version, every field; enums by value,
        overrides as pattern, skip and changes) that `config_from_dict` reads back."""
        data: dict[str, Any] = {"kind": self.KIND, "version": CONFIG_VERSION}  # type: ignore[attr-defined]
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "overrides":
                data[f.name] = [
                    {
                        "pattern": o.pattern,
                        **({"skip": True} if o.skip else {}),
                        **{k: _plain(v) for k, v in o.changes},
                    }
                    for o in value
                ]
            else:
                data[f.name] = _plain(value)
        return data

    @classmethod
    def from_dict(cls: type[C], data: Any) -> C:
        """A config from `to_dict`'s data (unknown fields and versions are refused, naming them)."""
        if not isinstance(data, dict):
            raise ConfigError(
                f"a {cls.__name__} is a mapping of its options, not {type(data).__name__}", "config"
            )
        version = data.get("version", CONFIG_VERSION)
        if version != CONFIG_VERSION:
            raise ConfigError(
                f"config version {version!r} is not one this coreopt reads ({CONFIG_VERSION})", "version"
            )
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        values = {k: v for k, v in data.items() if k not in ("kind", "version")}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f"{cls.__name__} has no option {unknown[0]!r}", unknown[0])
        if "overrides" in values:
            values["overrides"] = tuple(_override_from(item, cls) for item in values["overrides"] or ())
        if isinstance(values.get("n_m_ratio"), list):
            values["n_m_ratio"] = tuple(values["n_m_ratio"])
        try:
            return cls(**values)
        except TypeError as exc:
            raise ConfigError(f"{cls.__name__}: {exc}", "config") from None

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


def _plain(value: Any) -> Any:
    """A field value as JSON/YAML data: enums by value, tuples as lists."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return getattr(value, "value", value)


def _override_from(item: Any, config_type: type) -> Override:
    if not isinstance(item, dict) or not isinstance(item.get("pattern"), str):
        raise ConfigError(f"an override is a mapping with a pattern, not {item!r}", "overrides")
    changes = {k: v for k, v in item.items() if k not in ("pattern", "skip")}
    if isinstance(changes.get("n_m_ratio"), list):
        changes["n_m_ratio"] = tuple(changes["n_m_ratio"])
    try:
        return Override.of(item["pattern"], skip=bool(item.get("skip", False)), **changes)
    except ValueError as exc:
        raise ConfigError(str(exc), "overrides") from None


def _enum(kind: type, value: Any, field_name: str) -> Any:
    if value is None or isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise ConfigError(f"unknown {kind.__name__} {value!r}; choose one of {choices}", field_name) from None


@dataclass(frozen=True, kw_only=True)
class QuantizeConfig(_Config):
    """`quantize_weights`: integer, FP8 or MX FP4 codes with a scale per tensor, channel or block.

    granularity None takes per channel, or per block for MX FP4 (which is per block by definition).
    """

    KIND: ClassVar[str] = "quantize"

    dtype: DType = option(DType.INT8, "--dtype", "Element type of the stored weights.", choices=WEIGHT_DTYPES)
    qscheme: QScheme = option(
        QScheme.SYMMETRIC, "--scheme", "sym, or asym (integers: with a zero point).", choices=tuple(QScheme)
    )
    granularity: CompressionGranularity | None = option(
        None, "--granularity", "Scale per tensor, channel or block (default: channel; block for mxfp4).",
        choices=QUANTIZE_GRANULARITIES,
    )  # fmt: skip
    block_size: int = option(32, "--block-size", "Block length along the input axis.")
    scale_dtype: DType | None = option(
        None,
        "--scale-dtype",
        "e8m0: power-of-two scales (fp8 / mxfp4 data only).",
        choices=(DType.FP8_E8M0FNU,),
    )
    weight_num_threshold: int = option(1024, "--threshold", _THRESHOLD_HELP)
    overrides: tuple[Override, ...] = option((), "--override", _OVERRIDE_HELP)
    method: str = option("rtn", "--method", _METHOD_HELP.format(default="rtn"))

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


@dataclass(frozen=True, kw_only=True)
class PalettizeConfig(_Config):
    """`palettize_weights`: exact k-means look-up tables of 2**n_bits entries per tensor, channel or
    group of channels; `num_kmeans_workers` threads share the work (0: one per CPU; results do not
    depend on it)."""

    KIND: ClassVar[str] = "palettize"

    n_bits: int = option(
        4, "--nbits", "Index width: 1, 2, 3, 4, 6 or 8 (a LUT of 2^nbits entries).", choices=N_BITS
    )
    lut_dtype: DType | None = option(
        None, "--lut-dtype", "Quantize LUT entries (one scale per LUT).", choices=LUT_DTYPES
    )
    granularity: CompressionGranularity = option(
        G.PER_TENSOR, "--granularity", "One LUT per tensor, per channel or per group of channels.",
        choices=PALETTIZE_GRANULARITIES,
    )  # fmt: skip
    group_size: int = option(32, "--group-size", "Channels per LUT with --granularity grouped.")
    cluster_dim: int = option(1, "--cluster-dim", "Vector length along the output channels (>1: vectors).")
    enable_per_channel_scale: bool = option(
        False, "--per-channel-scale", "Normalize each channel by its max |w| before clustering."
    )
    num_kmeans_workers: int = option(1, "--workers", "k-means threads (0: one per CPU).", cli_default=0)
    enable_fast_kmeans_mode: bool = option(
        False, "--fast", "Round values to --rounding-precision decimals first."
    )
    rounding_precision: int = option(4, "--rounding-precision", "Decimals kept by --fast.")
    weight_num_threshold: int = option(1024, "--threshold", _THRESHOLD_HELP)
    overrides: tuple[Override, ...] = option((), "--override", _OVERRIDE_HELP)
    method: str = option("kmeans", "--method", _METHOD_HELP.format(default="kmeans"))
    tune_epochs: int = option(
        0, "--tune-epochs",
        "Passes over the calibration data that tune the LUT entries end to end (0: none).",
    )  # fmt: skip

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
        if not isinstance(self.num_kmeans_workers, int) or self.num_kmeans_workers < 0:
            raise ConfigError("num_kmeans_workers must be 0 (one per CPU) or more", "num_kmeans_workers")
        if self.rounding_precision < 0:
            raise ConfigError("rounding_precision must be 0 or more", "rounding_precision")
        self._check_tuning()

    def _check_tuning(self) -> None:
        from ._algorithms import algorithm_for

        if (
            not isinstance(self.tune_epochs, int)
            or isinstance(self.tune_epochs, bool)
            or self.tune_epochs < 0
        ):
            raise ConfigError("tune_epochs must be 0 or more", "tune_epochs")
        if self.tune_epochs and algorithm_for(self).data_free:
            raise ConfigError(
                "tune_epochs tunes tables on calibration data: use a method that learns from data "
                "(sensitive, importance, gptq)", "tune_epochs", "method",
            )  # fmt: skip
        if self.tune_epochs and self.lut_dtype is not None:
            raise ConfigError(
                "tune_epochs tunes float LUT entries: leave lut_dtype unset", "tune_epochs", "lut_dtype"
            )

    @property
    def tag(self) -> str:
        return f"lut{self.n_bits}"


@dataclass(frozen=True, kw_only=True)
class SparsifyConfig(_Config):
    """`sparsify_weights`: magnitude (`target_sparsity`, by default 0.5), block (`block_size` output
    channels at a time) or n:m (`n_m_ratio=(n, m)`: n of every m kept) pruning, the kept values
    optionally quantized (`quantize_dtype`) or palettized (`palettize_nbits`)."""

    KIND: ClassVar[str] = "sparsify"

    target_sparsity: float | None = option(
        None, "--sparsity", "Fraction of weights zeroed, smallest |w| first (default 0.5)."
    )
    block_size: int | None = option(
        None, "--block-size", "Prune blocks of this many output channels, ranked by L2 norm."
    )
    n_m_ratio: tuple[int, int] | None = option(
        None, "--nm", "N:M structured sparsity: keep the N largest of every M along the input axis."
    )
    quantize_dtype: DType | None = option(
        None, "--quantize", "Quantize the kept values too.", choices=JOINT_DTYPES
    )
    palettize_nbits: int | None = option(
        None, "--palettize", "Palettize the kept values with a 2^N-entry k-means LUT.", choices=N_BITS
    )
    weight_num_threshold: int = option(1024, "--threshold", _THRESHOLD_HELP)
    overrides: tuple[Override, ...] = option((), "--override", _OVERRIDE_HELP)
    method: str = option("magnitude", "--method", _METHOD_HELP.format(default="magnitude"))

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

CONFIG_TYPES: dict[str, type] = {c.KIND: c for c in (QuantizeConfig, PalettizeConfig, SparsifyConfig)}


def config_from_dict(data: Any) -> Config:
    """A pass's config from its plain data (`to_dict`), by its `kind`."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in CONFIG_TYPES:
        raise ConfigError(f"a config's kind is one of {', '.join(CONFIG_TYPES)}, not {kind!r}", "kind")
    return CONFIG_TYPES[kind].from_dict(data)  # type: ignore[no-any-return]
