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
    zero points or integer ones; `tensor_scale` the per-tensor scale of two-level scaling (a 0-d
    float32 tensor, NVFP4's), which the tile scales are relative to; `meta` the packed table choice
    of each (sub)tile of a codebook (`meta_bits` each). `numel_padded` counts codes including tile
    padding. A cast with
    `measure=True` records `signal` and `noise`: the energies of the input and of the cast's
    error (`tcast.energies`), summed while casting.
    """

    dtype: DataType
    shape: tuple[int, ...]
    source_dtype: torch.dtype
    codes: torch.Tensor
    scales: torch.Tensor | None
    zeros: torch.Tensor | None
    numel_padded: int
    tensor_scale: torch.Tensor | None = None
    meta: torch.Tensor | None = None
    signal: float | None = None
    noise: float | None = None

    @property
    def nbytes(self) -> int:
        total = self.codes.numel() * self.codes.element_size()
        for extra in (self.scales, self.zeros, self.tensor_scale, self.meta):
            if extra is not None:
                total += extra.numel() * extra.element_size()
        return total

    @property
    def bits_per_value(self) -> float:
        count = 1
        for d in self.shape:
            count *= d
        return 8.0 * self.nbytes / count if count else 0.0

    @property
    def value_dtype(self) -> torch.dtype:
        """float32 or float64: the dtype that holds every value of the cast exactly (where upcasts
        compute; an upcast to it loses nothing)."""
        from ._primitives import compute_dtype

        return compute_dtype(self.dtype, self.source_dtype)

    def unpacked_codes(self) -> torch.Tensor:
        """The element codes (uint8 up to 8 bits, else int32) in the tensor's own shape: the block
        order of the cast undone, tile padding dropped. Containers that store codes in the
        weight's layout read these."""
        from ._blocks import from_blocks, plan
        from ._pack import unpack_codes

        layout = plan(self.shape, self.dtype.sspec)
        codes = unpack_codes(self.codes, self.dtype.nspec.bits, self.numel_padded)
        return from_blocks(codes.reshape(layout.num_scales, layout.per_scale), layout)

    def scale_grid(self) -> torch.Tensor | None:
        """The scales as stored (E8M0 codes, or float values), shaped like the tensor with every
        tiled dim replaced by its number of tiles: it broadcasts block-wise against the values."""
        return self._grid(self.scales)

    def zero_grid(self) -> torch.Tensor | None:
        """The zero points, on the same grid as `scale_grid`."""
        return self._grid(self.zeros)

    def _grid(self, per_block: torch.Tensor | None) -> torch.Tensor | None:
        if per_block is None:
            return None
        from ._blocks import plan

        layout = plan(self.shape, self.dtype.sspec)
        if not layout.tiles:
            return per_block.reshape((1,) * len(self.shape))
        tiled = len(layout.tiles)
        counts = [n // t for n, t in zip(layout.padded[-tiled:], layout.tiles, strict=True)]
        grid = per_block.reshape(*layout.padded[:-tiled], *counts)
        inverse = [0] * len(layout.perm)
        for i, d in enumerate(layout.perm):
            inverse[d] = i
        return grid.permute(inverse)
