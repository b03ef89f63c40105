"""GPTQ's inner block on the CPU in one numba kernel: the torch loop over a block's columns spends
most of its time in Python (a dozen small tensor calls a column, hundreds of thousands of columns
in a model), while its arithmetic is tiny. The kernel walks the block's columns, each along every
row (the block transposed, so that runs over contiguous memory): round the column's values onto
the grid, scale the errors by U[i, i], subtract their spread U[i, i:] from the columns after it
(rows are independent in GPTQ). The arithmetic is the
torch loop's, operation for operation in float64 without fused multiply-adds, so both give the
same bits (tested); `_gptq_kernel` is the same kernel in Triton for GPUs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ._numba import Kernels

if TYPE_CHECKING:
    from ._columns import ColumnGrid

_kernel = Kernels(
    globals(), __file__, "GPTQ's CPU kernel compiles afresh (a few seconds) and is not stored"
).kernel
_KINDS = {"int": 0, "float": 1, "lut": 2}


@_kernel
def onto_float_grid(t: float, mbits: int, emin: int, largest: float, scratch: Any) -> float:
    """t rounded to nearest, ties to even, on a float element grid (`_columns.onto_float_grid`, the
    same arithmetic): the step of t's binade, a power of two read off its exponent field, divides
    t exactly, so one rint decides. `scratch`: one float64, whose bits are read and written."""
    magnitude = abs(t)
    scratch[0] = magnitude
    bits = scratch.view(np.int64)
    exponent = max(((bits[0] >> 52) & 0x7FF) - 1023, emin)
    bits[0] = (exponent - mbits + 1023) << 52
    rounded = np.rint(magnitude / scratch[0]) * scratch[0]
    if rounded > largest:
        rounded = largest
    return math.copysign(rounded, t)


@_kernel
def grid_value(v: float, r: int, j: int, kind: int, scale: Any, low: Any, high: Any, bounds: bool,
               low_c: float, high_c: float, mbits: int, emin: int, largest: float, table: Any,
               scratch: Any) -> float:  # fmt: skip
    """The grid value that row r's value v of weight column j rounds to (`ColumnGrid.__call__`)."""
    if kind == 2:  # the nearest entry of the row's table, the first of equals
        best = table[r, 0]
        gap = abs(v - best)
        for e in range(1, table.shape[1]):
            distance = abs(v - table[r, e])
            if distance < gap:
                gap = distance
                best = table[r, e]
        return best
    s = np.float64(scale[r, j])
    if kind == 1:
        return np.float64(np.float32(onto_float_grid(v / s, mbits, emin, largest, scratch) * s))
    lo = np.float64(low[r, j]) if bounds else low_c
    hi = np.float64(high[r, j]) if bounds else high_c
    q = np.rint(v / s)
    if q < lo:  # torch.clamp: the maximum, then the minimum (a NaN stays)
        q = lo
    if q > hi:
        q = hi
    return q * s


@_kernel
def solve_columns(block: Any, held: Any, errors: Any, upper: Any, order: Any, start: int, kind: int,
                  scale: Any, low: Any, high: Any, bounds: bool, low_c: float, high_c: float, mbits: int,
                  emin: int, largest: float, table: Any) -> None:  # fmt: skip
    """The block's columns (`block` [width, rows]: w's columns start .. start + width, transposed,
    float64), column after column: each value as float32 into held [width, rows], its scaled
    error into errors [width, rows], its spread subtracted from the columns after it - along
    rows, so the inner loops run over contiguous memory."""
    width, rows = block.shape
    scratch = np.empty(1, np.float64)
    for i in range(width):
        at = start + i
        j = order[at]
        pivot = upper[at, at]
        for r in range(rows):
            column = np.float32(block[i, r])
            held[i, r] = column
            v = np.float64(column)
            q = grid_value(
                v, r, j, kind, scale, low, high, bounds, low_c, high_c, mbits, emin, largest, table, scratch
            )
            errors[i, r] = (v - q) / pivot
        for c in range(i + 1, width):
            spread = upper[at, start + c]
            for r in range(rows):
                block[c, r] -= errors[i, r] * spread


def solve_block(
    w: torch.Tensor,
    start: int,
    stop: int,
    upper: torch.Tensor,
    order: torch.Tensor,
    grid: ColumnGrid,
    held: torch.Tensor,
    errors: torch.Tensor,
) -> torch.Tensor:
    """Columns start .. stop of GPTQ's pass (see `_gptq.solve`): their float32 values into `held`
    and their scaled errors into `errors` [rows, block] (returned, the first stop - start columns).
    CPU tensors; `w` and `upper` contiguous and in solve order, `order` maps it back to the
    weight's columns; the grid's tensors may be broadcast views."""
    rows, width = w.shape[0], stop - start
    empty = np.zeros((1, 1))
    bounds = isinstance(grid.low, torch.Tensor)
    low, high = (_wide(grid.low), _wide(grid.high)) if bounds else (empty, empty)  # type: ignore[arg-type]
    low_c, high_c = (0.0, 0.0) if bounds else (float(grid.low), float(grid.high))  # type: ignore[arg-type]
    scale = _wide(grid.scale) if grid.scale is not None else empty
    table = grid.table.numpy() if grid.table is not None else empty
    mbits, emin, largest = grid.element
    block = w[:, start:stop].T.contiguous()
    held_t = torch.empty((width, rows), dtype=torch.float32)
    errors_t = torch.empty((width, rows), dtype=torch.float64)
    arrays = (block.numpy(), held_t.numpy(), errors_t.numpy(), upper.numpy(), order.numpy(), start)
    # not on threads: torch's OpenMP threads, spinning after the block's matmul, take the second core
    solve_columns(*arrays, _KINDS[grid.kind], scale, low, high, bounds, low_c, high_c, mbits, emin,
                  float(largest), table)  # fmt: skip
    held[:, start:stop] = held_t.T
    errors[:, :width] = errors_t.T
    return errors[:, : stop - start]


def _wide(t: torch.Tensor) -> np.ndarray:
    """A grid's scales or bounds as numba reads them: 16-bit floats widened to float32 (exactly; a
    float grid's scales are in the weight's dtype), a broadcast view left one."""
    return (t.float() if t.dtype in (torch.float16, torch.bfloat16) else t).numpy()
