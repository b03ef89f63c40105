"""`QuantizeConfig`: integer, FP8 and MX FP4 codes with a scale per tensor, channel or block."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from coreai_opt.errors import ConfigError

from ._base import _METHOD_HELP, _OVERRIDE_HELP, _THRESHOLD_HELP, Override, WeightConfig, _enum, option
from ._options import QUANTIZE_GRANULARITIES, WEIGHT_DTYPES, CompressionGranularity, DType, G, QScheme


@dataclass(frozen=True, kw_only=True)
class QuantizeConfig(WeightConfig):
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
