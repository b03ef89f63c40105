"""The three kernels: virtual cast, actual cast (packed codes + E8M0 scale codes) and upcast."""

from __future__ import annotations

import triton
import triton.language as tl

from ._elements import (
    decode_codes,
    draw_noise,
    element_codes,
    fp8_code,
    fp8_value,
    grid_magnitude,
    grid_values,
    pow2,
    round_values,
    tile_exponent,
    tile_stats,
)
from ._memory import load_codes, load_tiles, narrow, store_codes, tile_offsets


@triton.jit
def virtual_kernel(
    x_ptr,
    out_ptr,
    n_blocks,
    blocks_per_row,
    cols,
    seed,
    TILE: tl.constexpr,
    BLOCKS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    EVEN: tl.constexpr,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    EMAX: tl.constexpr,
    MAXV: tl.constexpr,
    LIMIT: tl.constexpr,
    IS_INT: tl.constexpr,
    FNUZ: tl.constexpr,
    HAS_INF: tl.constexpr,
    SCALE_MODE: tl.constexpr,
    ROUND: tl.constexpr,
    HW_FP8: tl.constexpr,
):
    _, offsets, valid, index, x = load_tiles(x_ptr, n_blocks, blocks_per_row, cols, TILE, BLOCKS, EVEN)
    if HAS_SCALE:
        bad, amax = tile_stats(x)
        exponent = tile_exponent(amax, LIMIT, EMAX, SCALE_MODE)
        v = x * pow2(-exponent)[:, None]
    else:
        v = x
    noise = draw_noise(seed, index, ROUND)
    if HW_FP8 != 0:
        signed = fp8_value(fp8_code(v, HW_FP8), HW_FP8)
    else:
        y, e = grid_values(v, MBITS, EMIN, EMAX, IS_INT, HAS_SCALE)
        q = grid_magnitude(round_values(y, noise, ROUND), e, MBITS, MAXV, IS_INT)
        sign = v.to(tl.int32, bitcast=True) & -2147483648
        if FNUZ or IS_INT:  # no negative zero
            sign = tl.where(q > 0.0, sign, 0)
        # the sign bit set directly: Triton negates as 0 - q, which loses -0
        signed = (q.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    if not HAS_SCALE:  # (scaled: a NaN or Inf makes its whole tile NaN below)
        if HAS_INF:
            signed = tl.where(tl.abs(v) == float("inf"), v, signed)
        signed = tl.where(v != v, v, signed)
    if HAS_SCALE:
        # a NaN multiplier makes a tile with a NaN or Inf all NaN: one select per tile, not per element
        signed = signed * tl.where(bad > 0, float("nan"), pow2(exponent))[:, None]
    tl.store(out_ptr + offsets, narrow(signed, out_ptr), mask=valid)


@triton.jit
def actual_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    n_blocks,
    blocks_per_row,
    cols,
    code_bytes,
    seed,
    TILE: tl.constexpr,
    BLOCKS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    EVEN: tl.constexpr,
    BITS: tl.constexpr,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    EMAX: tl.constexpr,
    MAX_CODE: tl.constexpr,
    LIMIT: tl.constexpr,
    IS_INT: tl.constexpr,
    FNUZ: tl.constexpr,
    HAS_INF: tl.constexpr,
    NAN_CODE: tl.constexpr,
    SCALE_MODE: tl.constexpr,
    ROUND: tl.constexpr,
    HW_FP8: tl.constexpr,
    FAST: tl.constexpr,
    RUNS16: tl.constexpr,
):
    block, _, _, index, x = load_tiles(x_ptr, n_blocks, blocks_per_row, cols, TILE, BLOCKS, EVEN, RUNS16)
    if HAS_SCALE:
        bad, amax = tile_stats(x)
        exponent = tile_exponent(amax, LIMIT, EMAX, SCALE_MODE)
        to_grid = pow2(-exponent)
        tl.store(
            scales_ptr + block, tl.where(bad > 0, 255, exponent + 127).to(tl.uint8), mask=block < n_blocks
        )
    else:
        bad = 0
        to_grid = 1.0
    code = element_codes(x, to_grid, bad, index, seed, HAS_SCALE, BITS, MBITS, EMIN, EMAX, MAX_CODE, IS_INT, FNUZ,
                  HAS_INF, NAN_CODE, ROUND, HW_FP8, FAST)  # fmt: skip
    store_codes(codes_ptr, code, block, n_blocks, code_bytes, TILE, BLOCKS, BITS, HAS_SCALE)


@triton.jit
def upcast_kernel(
    codes_ptr,
    scales_ptr,
    table_ptr,
    out_ptr,
    n_blocks,
    blocks_per_row,
    cols,
    code_bytes,
    TILE: tl.constexpr,
    BLOCKS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    EVEN: tl.constexpr,
    BITS: tl.constexpr,
    DECODE: tl.constexpr,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    IS_INT: tl.constexpr,
    FNUZ: tl.constexpr,
    HAS_INF: tl.constexpr,
    VEC: tl.constexpr,
):
    block = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    offsets, valid, _ = tile_offsets(block, n_blocks, blocks_per_row, cols, TILE, EVEN)
    code = load_codes(codes_ptr, block, code_bytes, TILE, BLOCKS, BITS, VEC)
    if DECODE:
        values = decode_codes(code, BITS, MBITS, EMIN, IS_INT, FNUZ, HAS_INF)
    else:
        values = tl.load(table_ptr + code)
    if HAS_SCALE:
        scale_code = tl.load(scales_ptr + block, mask=block < n_blocks, other=127).to(tl.int32)
        # the NaN scale code multiplies its tile by NaN: one select per tile, not per element
        values = values * tl.where(scale_code == 255, float("nan"), pow2(scale_code - 127))[:, None]
    tl.store(out_ptr + offsets, narrow(values, out_ptr), mask=valid)
