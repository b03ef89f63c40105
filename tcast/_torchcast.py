"""TorchCast: every cast in plain PyTorch ops, on any device.

NaN/Inf policy (one rule for every format):
- NaN stays NaN. Formats without a NaN code of their own (signed integers) use the otherwise
  unused most negative code; a block whose amax is NaN or Inf gets a NaN scale (OCP MX).
- Finite values beyond the format's range saturate to +-max.
- +-Inf stays +-Inf in IEEE-style formats, and saturates to +-max in formats without Inf.
"""

from __future__ import annotations

import math

import torch

from ._blocks import Blocking, from_blocks, plan, to_blocks
from ._codes import code_dtype, decode, encode
from ._datatype import DataType
from ._metrics import squares
from ._modes import RoundMode, ScaleMode
from ._pack import pack_codes, unpack_codes
from ._primitives import (
    FLOATS,
    Scaling,
    combine_piece,
    compute_dtype,
    direct_codes,
    draw_noise,
    element_piece,
    given_scaling,
    in_scale_units,
    scaled_codes,
    scaling_of,
    stored_scales,
    stored_scaling,
)
from ._tensor import Tensor


def _check_input(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"tcast casts torch tensors, got {type(x).__name__}")
    if x.dtype not in FLOATS:
        raise ValueError(f"tcast casts float64, float32, float16 or bfloat16 tensors, got {x.dtype}")


_PIECE = 1 << 18  # elements per elementwise pass: large enough to amortise dispatch, small enough for L2


def _pieces(rows: int, cols: int) -> list[tuple[slice, slice]]:
    """Cache-sized pieces of a [rows, cols] block matrix; every piece lies within whole rows or one row."""
    if cols >= _PIECE:
        return [(slice(r, r + 1), slice(c, c + _PIECE)) for r in range(rows) for c in range(0, cols, _PIECE)]
    step = max(1, _PIECE // max(cols, 1))
    return [(slice(r, r + step), slice(None)) for r in range(0, rows, step)]


def _run(
    x: torch.Tensor,
    dtype: DataType,
    roundmode: RoundMode,
    scalemode: ScaleMode,
    generator: torch.Generator | None,
    virtual_dtype: torch.dtype | None,
    measure: bool = False,
    given: torch.Tensor | None = None,
    block_scales: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> tuple[Blocking, torch.Tensor, Scaling, tuple[float, float] | None]:
    """Cast `x` piece by piece: fake-quantized values in `virtual_dtype`, or (None) element codes,
    and with `measure` the energies (signal, noise) of the input and of the error.

    Scales come from one pass of per-row min/max; the element work, the encoding of an actual
    cast and the energies then run on cache-sized pieces, so no temporary is ever the size of
    the tensor.
    """
    _check_input(x)
    nspec = dtype.nspec
    work = compute_dtype(dtype, x.dtype, roundmode)
    layout = plan(tuple(x.shape), dtype.sspec)
    blocks = to_blocks(x, layout)  # a view where no tile is padded or permuted
    if block_scales is not None:  # chosen by the caller: no statistics
        scaling = given_scaling(dtype, layout, *block_scales, work)
    else:
        scaling = scaling_of(blocks, dtype, scalemode, work, given)  # min and max are exact in any dtype
    noise = None
    if roundmode is RoundMode.STOCHASTIC:
        noise = draw_noise(blocks.shape, torch.empty(0, dtype=work, device=x.device), generator)
    out = torch.empty(blocks.shape, dtype=virtual_dtype or code_dtype(nspec), device=x.device)
    signal = error = 0.0
    direct = virtual_dtype is None and not measure and direct_codes(nspec, roundmode, work)
    for rows, cols in _pieces(*blocks.shape):
        piece = blocks[rows, cols].to(work)  # widened a piece at a time
        if direct:  # codes straight from the scaled values
            scaled = in_scale_units(piece, scaling, rows)
            out[rows, cols] = scaled_codes(scaled if scaled is not piece else piece.clone(), nspec)
            continue
        values = element_piece(
            piece, dtype, scaling, rows, roundmode, None if noise is None else noise[rows, cols]
        )
        if virtual_dtype is None:
            out[rows, cols] = encode(values, nspec)
            if not measure:
                continue
        if values.data_ptr() == piece.data_ptr():
            values = values.clone()  # unscaled formats may hand back their input; never mutate it
        approximation = combine_piece(values, dtype, scaling, rows)
        if measure:
            signal += squares(piece)
            error += squares(approximation - piece)  # exact: see tcast.energies
        if virtual_dtype is not None:
            out[rows, cols] = approximation
    energies = (signal, math.inf if math.isnan(error) else error) if measure else None
    return layout, out, scaling, energies


def virtual_cast(
    x: torch.Tensor,
    dtype: DataType,
    roundmode: RoundMode,
    scalemode: ScaleMode,
    generator: torch.Generator | None,
    out_dtype: torch.dtype | None,
    given: torch.Tensor | None = None,
    block_scales: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> torch.Tensor:
    layout, out, _, _ = _run(
        x, dtype, roundmode, scalemode, generator, out_dtype or x.dtype, False, given, block_scales
    )
    return from_blocks(out, layout)


def actual_cast(
    x: torch.Tensor,
    dtype: DataType,
    roundmode: RoundMode,
    scalemode: ScaleMode,
    generator: torch.Generator | None,
    measure: bool = False,
    given: torch.Tensor | None = None,
    block_scales: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> Tensor:
    nspec = dtype.nspec
    if nspec.bits > 16:
        raise ValueError(f"actual casts store codes of at most 16 bits; {dtype.name} has {nspec.bits}")
    _, codes, scaling, energies = _run(
        x, dtype, roundmode, scalemode, generator, None, measure, given, block_scales
    )
    scales, zeros = stored_scales(scaling, dtype)
    return Tensor(
        dtype=dtype,
        shape=tuple(x.shape),
        source_dtype=x.dtype,
        codes=pack_codes(codes, nspec.bits),
        scales=scales,
        zeros=zeros,
        tensor_scale=scaling.tensor,
        numel_padded=codes.numel(),
        signal=None if energies is None else energies[0],
        noise=None if energies is None else energies[1],
    )


def upcast(t: Tensor, torch_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Values of an actual cast: equal bit for bit to the virtual cast of the same input.

    Codes are unpacked, decoded and scaled piece by piece into the output, so the temporaries
    stay cache-sized (codes whose rows do not start on a byte are unpacked at once)."""
    dtype = t.dtype
    nspec, sspec = dtype.nspec, dtype.sspec
    work = compute_dtype(dtype, t.source_dtype)
    layout = plan(t.shape, sspec)
    rows, per = layout.num_scales, layout.per_scale
    scaling = stored_scaling(t, work)
    out = torch.empty((rows, per), dtype=torch_dtype or t.source_dtype, device=t.codes.device)
    data = t.codes.reshape(-1)
    bits = nspec.bits
    whole = None if (per * bits) % 8 == 0 else unpack_codes(data, bits, t.numel_padded).reshape(rows, per)
    for piece_rows, piece_cols in _pieces(rows, per):
        if whole is not None:
            codes = whole[piece_rows, piece_cols]
        else:
            first_row = piece_rows.start
            width = per if piece_cols.start is None else min(per, piece_cols.stop) - piece_cols.start
            height = min(rows, piece_rows.stop) - first_row
            first = first_row * per + (piece_cols.start or 0)  # a multiple of 8 codes: whole bytes
            count = height * width
            chunk = data[first * bits // 8 : (first + count) * bits // 8 + 1]
            codes = unpack_codes(chunk, bits, count).reshape(height, width)
        values = decode(codes, nspec, work)
        out[piece_rows, piece_cols] = combine_piece(values, dtype, scaling, piece_rows)
    return from_blocks(out, layout)
