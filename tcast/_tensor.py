"""tcast.Tensor: the result of an actual cast (packed codes, scales, zero points)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ._datatype import DataType


@dataclass(frozen=True)
class Tensor:
    """Packed element codes (little-endian, low bits first) in the block order of the scales.

    `scales` holds uint8 E8M0 codes for exponent scales, else float values; `zeros` holds float
    zero points or integer ones. `numel_padded` counts codes including tile padding.
    """

    dtype: DataType
    shape: tuple[int, ...]
    source_dtype: torch.dtype
    codes: torch.Tensor
    scales: torch.Tensor | None
    zeros: torch.Tensor | None
    numel_padded: int

    @property
    def nbytes(self) -> int:
        total = self.codes.numel() * self.codes.element_size()
        for extra in (self.scales, self.zeros):
            if extra is not None:
                total += extra.numel() * extra.element_size()
        return total

    @property
    def bits_per_value(self) -> float:
        count = 1
        for d in self.shape:
            count *= d
        return 8.0 * self.nbytes / count if count else 0.0
