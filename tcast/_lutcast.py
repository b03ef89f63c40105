"""Casts to codebooks (tcast.Codebook elements), in float64 torch ops on any device.

A scaled codebook cast takes each block's scale by the same rules as the other formats (the
codebook's emax and max stand for the element format's), divides, then for every selection unit
(subtile, tile, or the whole tensor) rounds to each table and keeps the table with the least
squared error (the lowest table on equal errors). A block whose amax is NaN or Inf gets a NaN
scale and decodes to NaN (OCP MX's rule); an unscaled codebook has no NaN and rejects
non-finite input.
"""

from __future__ import annotations

import math

import torch

from ._blocks import from_blocks, plan, to_blocks
from ._codebook import Codebook, nearest
from ._datatype import DataType
from ._metrics import squares
from ._modes import RoundMode, ScaleMode
from ._pack import pack_codes, unpack_codes
from ._primitives import combine_piece, in_scale_units, scaling_of, stored_scales, stored_scaling
from ._tensor import Tensor


def _book(dtype: DataType) -> Codebook:
    book = dtype.nspec
    assert isinstance(book, Codebook)
    return book


def _unit(dtype: DataType, per_row: int) -> int:
    return dtype.sspec.subtile if dtype.sspec is not None and dtype.sspec.subtile else per_row


def _run(
    x: torch.Tensor, dtype: DataType, roundmode: RoundMode, scalemode: ScaleMode
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(blocks, codes, table choices, real values, stored scales) of a cast."""
    if roundmode is not RoundMode.EVEN:
        raise ValueError(f"codebook {dtype.nspec.code} rounds to the nearest entry (roundmode even) only")
    book = _book(dtype)
    layout = plan(tuple(x.shape), dtype.sspec)
    blocks = to_blocks(x, layout).double()
    scaling = scaling_of(blocks, dtype, scalemode, torch.float64)
    if scaling.scale is None and not bool(torch.isfinite(blocks).all()):
        raise ValueError(f"unscaled codebook {book.code} has no NaN or Inf: the input holds some")
    v = in_scale_units(blocks, scaling, slice(None))
    rows, per = v.shape
    unit = _unit(dtype, per)
    units = v.reshape(rows, per // unit, unit).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    best = torch.full(units.shape[:2], math.inf, dtype=torch.float64, device=x.device)
    codes = torch.zeros(units.shape, dtype=torch.int64, device=x.device)
    values = torch.zeros_like(units)
    meta = torch.zeros(units.shape[:2], dtype=torch.int64, device=x.device)
    for table in range(len(book.tables)):
        table_codes, table_values = nearest(units.reshape(-1), book, table)
        table_codes, table_values = table_codes.reshape(units.shape), table_values.reshape(units.shape)
        error = (table_values - units).square().sum(-1)
        better = error < best
        best = torch.where(better, error, best)
        codes = torch.where(better[..., None], table_codes, codes)
        values = torch.where(better[..., None], table_values, values)
        meta = torch.where(better, table, meta)
    real = combine_piece(values.reshape(rows, per), dtype, scaling, slice(None))  # NaN scale: NaN row
    scales, _ = stored_scales(scaling, dtype)
    return blocks, codes.reshape(rows, per), meta, real, scales


def virtual_cast(
    x: torch.Tensor,
    dtype: DataType,
    roundmode: RoundMode,
    scalemode: ScaleMode,
    out_dtype: torch.dtype | None,
) -> torch.Tensor:
    *_, real, _ = _run(x, dtype, roundmode, scalemode)
    return from_blocks(real.to(out_dtype or x.dtype), plan(tuple(x.shape), dtype.sspec))


def actual_cast(
    x: torch.Tensor, dtype: DataType, roundmode: RoundMode, scalemode: ScaleMode, measure: bool = False
) -> Tensor:
    book = _book(dtype)
    blocks, codes, meta, real, scales = _run(x, dtype, roundmode, scalemode)
    signal = noise = None
    if measure:
        signal = squares(blocks)
        error = squares(real - blocks)
        noise = math.inf if math.isnan(error) else error
    return Tensor(
        dtype=dtype,
        shape=tuple(x.shape),
        source_dtype=x.dtype,
        codes=pack_codes(codes, book.bits),
        scales=scales,
        zeros=None,
        numel_padded=codes.numel(),
        meta=pack_codes(meta, book.meta_bits) if book.meta_bits else None,
        signal=signal,
        noise=noise,
    )


def upcast(t: Tensor, torch_dtype: torch.dtype | None = None) -> torch.Tensor:
    dtype, book = t.dtype, _book(t.dtype)
    layout = plan(t.shape, dtype.sspec)
    rows, per = layout.num_scales, layout.per_scale
    codes = unpack_codes(t.codes, book.bits, t.numel_padded).reshape(rows, per)
    unit = _unit(dtype, per)
    meta = None
    if book.meta_bits:
        if t.meta is None:
            raise ValueError(f"codebook {book.code} needs the cast's table choices (meta) to upcast")
        count = rows * (per // unit)
        meta = unpack_codes(t.meta, book.meta_bits, count).reshape(rows, per // unit, 1)
    values = book.lookup(codes.reshape(rows, per // unit, unit), meta, torch.float64).reshape(rows, per)
    real = combine_piece(values, dtype, stored_scaling(t, torch.float64), slice(None))
    return from_blocks(real.to(torch_dtype or t.source_dtype), layout)
