"""GPTQ's inner block in one Triton kernel: on a GPU the torch loop over a block's columns is
bound by kernel launches (a dozen small kernels a column, hundreds of thousands of columns in a
1B model), while its arithmetic is tiny. Rows of the weight are independent in GPTQ (each row's
errors spread along that row only), so a program holds a tile of rows x the block's columns in
registers and walks the columns itself: read the column, round it onto the grid, scale the
error by U[i, i], subtract its spread U[i, i:] from the columns after it. The arithmetic is the
torch loop's, operation for operation in float64 with no fused multiply-adds, so the two give
the same values (tested bit for bit under the interpreter; on a GPU, bench/gptq_device.py compares
its codes with the CPU loop's).

Imported only where the solve runs it (a CUDA device with Triton installed, or a test).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

if TYPE_CHECKING:
    from ._columns import ColumnGrid

_ROWS = 16  # rows a program holds: 16 x 128 float64 in registers, with the errors beside them
_KINDS = {"int": 0, "float": 1, "lut": 2}


@triton.jit
def _rint(x):
    """Round to the nearest integer, ties to even (torch.round): adding and taking away 2**52
    leaves float64's integer grid; larger magnitudes are integers already."""
    magnitude = tl.abs(x)
    rounded = (magnitude + 4503599627370496.0) - 4503599627370496.0  # 2**52: exact in any float
    rounded = tl.where(magnitude < 4503599627370496.0, rounded, magnitude)
    return _signed(rounded, x)


@triton.jit
def _signed(magnitude, x):
    """magnitude (float64, sign bit clear) with x's sign bit: copysign, so -0 stays -0 as
    torch.round and tcast keep it. Not -magnitude: Triton negates as 0 - x, which gives +0."""
    sign = (x.to(tl.int64, bitcast=True) >> 63) << 63
    return (magnitude.to(tl.int64, bitcast=True) | sign).to(tl.float64, bitcast=True)


@triton.jit
def _onto_float_grid(t, MBITS: tl.constexpr, EMIN: tl.constexpr, LARGEST: tl.constexpr):
    """t rounded to nearest, ties to even, on a float element grid of MBITS mantissa bits and
    lowest normal exponent EMIN (subnormals below it), saturated at +-LARGEST: the step of t's
    binade is a power of two, so t / step is exact and one rint decides."""
    magnitude = tl.abs(t)
    field = (magnitude.to(tl.int64, bitcast=True) >> 52) & 0x7FF
    exponent = tl.maximum(field - 1023, EMIN)
    step = ((exponent - MBITS + 1023) << 52).to(tl.float64, bitcast=True)
    rounded = tl.minimum(_rint(magnitude / step) * step, LARGEST)
    return _signed(rounded, t)


@triton.jit
def _solve_block(
    w_ptr, held_ptr, errors_ptr, upper_ptr, order_ptr, scale_ptr, low_ptr, high_ptr, table_ptr,
    rows, columns, start, width, low, high,
    KIND: tl.constexpr, BOUNDS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
    LARGEST: tl.constexpr, ENTRIES: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Columns start .. start + width of w [rows, columns] (float64, solve order) for ROWS rows:
    each column's value as float32 into held [rows, columns], its scaled error into errors
    [rows, BLOCK]. order: each solve column's index in the weight (where its scale or bounds
    lie); scale, low, high [rows, columns] and table [rows, ENTRIES] as ColumnGrid holds them."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = r < rows
    c = tl.arange(0, BLOCK)
    inside = live[:, None] & (c < width)[None, :]
    tile = tl.load(w_ptr + r[:, None] * columns + start + c[None, :], mask=inside, other=0.0)
    errors = tl.zeros([ROWS, BLOCK], dtype=tl.float64)
    for i in range(0, width):
        at = start + i
        here = c[None, :] == i
        # the column's bits summed with zeros: its value exactly, -0 and NaN included (a float sum
        # from a +0 start turns -0 into +0)
        bits = tl.sum(tl.where(here, tile.to(tl.int64, bitcast=True), 0), axis=1)
        column = bits.to(tl.float64, bitcast=True).to(tl.float32)
        tl.store(held_ptr + r * columns + at, column, mask=live)
        v = column.to(tl.float64)
        j = tl.load(order_ptr + at)
        if KIND == 2:  # the nearest entry of the row's table, the first of equals
            best = tl.load(table_ptr + r * ENTRIES, mask=live, other=0.0)
            gap = tl.abs(v - best)
            for e in tl.static_range(1, ENTRIES):
                entry = tl.load(table_ptr + r * ENTRIES + e, mask=live, other=0.0)
                distance = tl.abs(v - entry)
                closer = distance < gap
                gap = tl.where(closer, distance, gap)
                best = tl.where(closer, entry, best)
            q = best
        else:
            s = tl.load(scale_ptr + r * columns + j, mask=live, other=1.0).to(tl.float64)
            if KIND == 0:
                if BOUNDS:
                    lo = tl.load(low_ptr + r * columns + j, mask=live, other=0.0).to(tl.float64)
                    hi = tl.load(high_ptr + r * columns + j, mask=live, other=0.0).to(tl.float64)
                else:
                    lo, hi = low, high
                q = tl.minimum(tl.maximum(_rint(v / s), lo), hi) * s  # NaN v: its error NaN all the same
            else:
                q = (_onto_float_grid(v / s, MBITS, EMIN, LARGEST) * s).to(tl.float32).to(tl.float64)
        pivot = tl.load(upper_ptr + at * columns + at)
        error = (v - q) / pivot
        spread = tl.load(upper_ptr + at * columns + start + c, mask=(c >= i) & (c < width), other=0.0)
        tile = tile - error[:, None] * spread[None, :]
        errors = tl.where(here, error[:, None], errors)
    tl.store(errors_ptr + r[:, None] * BLOCK + c[None, :], errors, mask=inside)


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
    """Columns start .. stop of GPTQ's pass (see `_gptq.solve`) in one launch: their float32
    values into `held` and their scaled errors into `errors` [rows, block] (returned, the first
    stop - start columns). `w` and `upper` are contiguous and in solve order, `order` maps it
    back to the weight's columns."""
    rows, columns = w.shape
    bounds = isinstance(grid.low, torch.Tensor)
    dummy = w  # pointers a kind does not read
    low_ptr, high_ptr = (grid.low, grid.high) if bounds else (dummy, dummy)
    low, high = (0.0, 0.0) if bounds else (float(grid.low), float(grid.high))
    mbits, emin, largest = grid.element
    table = grid.table if grid.table is not None else dummy
    _solve_block[(triton.cdiv(rows, _ROWS),)](
        w, held, errors, upper, order, grid.scale if grid.scale is not None else dummy, low_ptr,
        high_ptr, table, rows, columns, start, stop - start, low, high,
        KIND=_KINDS[grid.kind], BOUNDS=bounds, MBITS=mbits, EMIN=emin, LARGEST=largest,
        ENTRIES=table.shape[1] if grid.table is not None else 1, ROWS=_ROWS, BLOCK=errors.shape[1],
        enable_fp_fusion=False,
    )  # fmt: skip
    return errors[:, : stop - start]
