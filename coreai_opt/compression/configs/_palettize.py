"""`PalettizeConfig`: exact k-means look-up tables per tensor, channel or group of channels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from coreai_opt.errors import ConfigError

from ._base import _METHOD_HELP, _OVERRIDE_HELP, _THRESHOLD_HELP, Override, WeightConfig, _enum, option
from ._options import LUT_DTYPES, N_BITS, PALETTIZE_GRANULARITIES, CompressionGranularity, DType, G


@dataclass(frozen=True, kw_only=True)
class PalettizeConfig(WeightConfig):
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
        "Passes over the calibration data that tune the LUT entries and scales end to end (0: none).",
    )  # fmt: skip
    tune_blocks: int = option(
        0, "--tune-blocks",
        "Passes over the calibration data that tune the LUT entries, scales and codes a block at a "
        "time, before --tune-epochs (0: none).",
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
        for name in ("tune_epochs", "tune_blocks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be 0 or more", name)

    def check_algorithm(self, algorithm: Any) -> None:
        for name in ("tune_epochs", "tune_blocks"):
            if getattr(self, name) and algorithm.data_free:
                raise ConfigError(
                    f"{name} tunes tables on calibration data: use a method that learns from data "
                    "(sensitive, importance, gptq)", name, "method",
                )  # fmt: skip

    @property
    def tag(self) -> str:
        return f"lut{self.n_bits}"
