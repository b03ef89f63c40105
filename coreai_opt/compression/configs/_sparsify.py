"""`SparsifyConfig`: magnitude, block or n:m pruning, the kept values optionally quantized or palettized."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from coreai_opt.errors import ConfigError

from ._base import _METHOD_HELP, _OVERRIDE_HELP, _THRESHOLD_HELP, Override, WeightConfig, _enum, option
from ._options import JOINT_DTYPES, N_BITS, DType


@dataclass(frozen=True, kw_only=True)
class SparsifyConfig(WeightConfig):
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
