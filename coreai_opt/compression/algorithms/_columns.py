"""What a GPTQ column rounds onto (`ColumnGrid`), shared by the solver in `_gptq` and its fused
Triton kernel in `_gptq_kernel`, so neither imports the other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

Rounding = Callable[[torch.Tensor, int], torch.Tensor]  # (column [rows] float32, its index) -> grid values


@dataclass(frozen=True, eq=False)
class ColumnGrid:
    """What a column rounds onto, described so that GPTQ's fused block kernel (`_gptq_kernel`)
    rounds as calling it does, and so that it can be cut by rows. kind "int": clamp(round(v /
    scale), low, high) x scale (ties to even; bounds constants or [rows, columns]); "float": v /
    scale rounded to nearest, ties to even, on the float element grid `element` = (mantissa bits,
    lowest normal exponent, largest value), saturated, times scale, rounded to float32 - tcast's
    cast under those scales, tested equal, without its per-call cost a column (MXFP4 GPTQ of a
    1.1B model on the CPU took hours through it); "lut": the nearest entry of each row's `table`
    [rows, entries] (the first of equals).
    `scale` [rows, columns] holds the scales' values in the weight's column order, as `j` counts
    (float32, exact: read as float64)."""

    kind: str
    scale: torch.Tensor | None = None
    low: torch.Tensor | float = 0.0
    high: torch.Tensor | float = 0.0
    table: torch.Tensor | None = None
    element: tuple[int, int, float] = (0, 0, 0.0)

    def _each(self, change: Callable[[torch.Tensor], torch.Tensor]) -> ColumnGrid:
        def apply(t: torch.Tensor | float | None) -> torch.Tensor | float | None:
            return change(t) if isinstance(t, torch.Tensor) else t

        return replace(self, scale=apply(self.scale), low=apply(self.low), high=apply(self.high),
                       table=apply(self.table))  # fmt: skip

    def contiguous(self) -> ColumnGrid:
        """The same grid with every tensor contiguous (the kernel reads rows of them)."""
        return self._each(lambda t: t.contiguous())

    def rows(self, start: int, stop: int) -> ColumnGrid:
        """The grid of rows start .. stop."""
        return self._each(lambda t: t[start:stop])

    def __call__(self, column: torch.Tensor, j: int) -> torch.Tensor:
        if self.kind == "lut":
            assert self.table is not None
            return torch.gather(self.table, 1, nearest_entries(column[:, None], self.table))[:, 0]
        assert self.scale is not None
        s = self.scale[:, j].double()
        if self.kind == "float":
            return (onto_float_grid(column.double() / s, *self.element) * s).float()
        low = self.low[:, j] if isinstance(self.low, torch.Tensor) else self.low
        high = self.high[:, j] if isinstance(self.high, torch.Tensor) else self.high
        return torch.clamp(torch.round(column.double() / s), low, high) * s  # type: ignore[arg-type]


def onto_float_grid(t: torch.Tensor, mbits: int, emin: int, largest: float) -> torch.Tensor:
    """t (float64) rounded to nearest, ties to even, on a float element grid of `mbits` mantissa
    bits and lowest normal exponent `emin` (subnormals below it), saturated at +-`largest`: the
    step of t's binade is a power of two read off its exponent field, so t / step is exact and one
    round decides (`_gptq_kernel._onto_float_grid` is the same arithmetic)."""
    magnitude = t.abs()
    field = (magnitude.view(torch.int64) >> 52) & 0x7FF
    exponent = torch.clamp_min(field - 1023, emin)
    step = ((exponent - mbits + 1023) << 52).view(torch.float64)
    rounded = torch.clamp_max(torch.round(magnitude / step) * step, largest)
    return torch.copysign(rounded, t)  # -0 stays -0, as tcast gives it


def nearest_entries(
    values: torch.Tensor, tables: torch.Tensor, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """The index of the entry of each row's table nearest each value [rows, n] (ties: the lower
    index), as `dtype`, a piece of rows at a time (`in_pieces`)."""
    rows, n = values.shape
    step = max(1, (1 << 22) // max(1, n * tables.shape[1]))

    def piece(a: int, b: int) -> torch.Tensor:
        return (values[a:b].double()[..., None] - tables[a:b].double()[:, None, :]).abs().argmin(-1)

    return in_pieces(piece, (rows, n), step, dtype, values.device)


def in_pieces(
    piece: Callable[[int, int], torch.Tensor],
    shape: tuple[int, ...],
    step: int,
    dtype: torch.dtype,
    device: Any,
) -> torch.Tensor:
    """`piece(a, b)` (rows a to b of the result) for every `step` rows, written into one tensor
    made first: pieces gathered in a list and joined, each made beside its large temporaries,
    fragment the heap (3.6 GB resident for a 49,152 x 576 head's indices, 0.2 GB of them)."""
    found = torch.empty(shape, dtype=dtype, device=device)
    for a in range(0, shape[0], step):
        found[a : a + step] = piece(a, min(a + step, shape[0]))
    return found
