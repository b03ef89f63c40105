"""The kernels: virtual cast, actual cast (packed codes + E8M0 scale codes) and upcast for
unscaled and power-of-two scaled formats; the same three for float scales (per tile, channel
row or tensor, and two-level); and the amax pass that per-tensor scales need first."""

from __future__ import annotations

import triton
import triton.language as tl

from ._elements import (
    decode_codes,
    draw_noise,
    element_codes,
    float32_scales,
    float_tile_scales,
    fp8_code,
    fp8_value,
    grid_magnitude,
    grid_values,
    pow2,
    quotient_codes,
    quotient_values,
    round_values,
    tile_exponent,
    tile_stats,
)
from ._memory import load_codes, load_tiles, narrow, store_codes, tile_offsets, widen


@triton.jit
def virtual_kernel(
    x_ptr,
    out_ptr,
    n_blocks,
    blocks_per_row,
    block_rows,
    rows,
    cols,
    seed,
    TILE: tl.constexpr,
    TCOLS: tl.constexpr,
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
    _, offsets, valid, index, x = load_tiles(
        x_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, BLOCKS, EVEN
    )
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
    block_rows,
    rows,
    cols,
    code_bytes,
    seed,
    TILE: tl.constexpr,
    TCOLS: tl.constexpr,
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
    block, _, _, index, x = load_tiles(
        x_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, BLOCKS, EVEN, RUNS16
    )
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
    store_codes(codes_ptr, code, block, n_blocks, code_bytes, TILE, TILE, BLOCKS, BITS, HAS_SCALE)


@triton.jit
def upcast_kernel(
    codes_ptr,
    scales_ptr,
    table_ptr,
    out_ptr,
    n_blocks,
    blocks_per_row,
    block_rows,
    rows,
    cols,
    code_bytes,
    TILE: tl.constexpr,
    TCOLS: tl.constexpr,
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
    offsets, valid, _ = tile_offsets(
        block, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, EVEN
    )
    code = load_codes(codes_ptr, block, code_bytes, TILE, TILE, BLOCKS, BITS, VEC)
    if DECODE:
        values = decode_codes(code, BITS, MBITS, EMIN, IS_INT, FNUZ, HAS_INF)
    else:
        values = tl.load(table_ptr + code)
    if HAS_SCALE:
        scale_code = tl.load(scales_ptr + block, mask=block < n_blocks, other=127).to(tl.int32)
        # the NaN scale code multiplies its tile by NaN: one select per tile, not per element
        values = values * tl.where(scale_code == 255, float("nan"), pow2(scale_code - 127))[:, None]
    tl.store(out_ptr + offsets, narrow(values, out_ptr), mask=valid)


# ----- float scales ---------------------------------------------------------------------------


@triton.jit
def float_divisors(
    x, block, n_blocks, given_ptr, scales_ptr,
    GIVEN: tl.constexpr, TENSOR_AMAX: tl.constexpr, TWO_LEVEL: tl.constexpr, STORE: tl.constexpr,
    BLOCKS: tl.constexpr, ELEM_MAX: tl.constexpr, S_FP32: tl.constexpr, S_MBITS: tl.constexpr,
    S_EMIN: tl.constexpr, S_EMAX: tl.constexpr, S_MAX_CODE: tl.constexpr, S_NAN_CODE: tl.constexpr,
    S_ONE_CODE: tl.constexpr, S_FNUZ: tl.constexpr, S_HAS_INF: tl.constexpr, CEIL: tl.constexpr,
    S_LEAN: tl.constexpr, TENSOR_DIVISOR: tl.constexpr,
):  # fmt: skip
    """(divisor, bad) per tile: the scale the values divide by (two levels: the tile scale times
    the tensor scale, in float32) and whether the tile holds a NaN or Inf. GIVEN: one scale for
    the tensor, the caller's or the host's, at given_ptr; with TENSOR_AMAX computed here from the
    amax pass's bits of the largest magnitude at given_ptr, as a tile of the whole tensor
    (program 0 stores it: STORE). Else each tile's own, stored (STORE), over a two-level tensor
    scale at given_ptr - with TENSOR_AMAX computed from the pass's largest finite magnitude
    (given_ptr + 1) and kept by program 0 at given_ptr + 2 (STORE)."""
    if GIVEN and not TENSOR_AMAX:
        divisor = tl.zeros([BLOCKS], dtype=tl.float32) + tl.load(given_ptr)
        bad = (divisor != divisor).to(tl.int32)
    else:
        if GIVEN:  # the tensor's amax, every tile's; its scale has one place
            top = tl.zeros([BLOCKS], dtype=tl.int32) + tl.load(given_ptr)
            bad, amax = (top >= 0x7F800000).to(tl.int32), top.to(tl.float32, bitcast=True)
            store = block == 0
        else:
            bad, amax = tile_stats(x)
            store = block < n_blocks
        if TWO_LEVEL and TENSOR_AMAX:  # from the largest finite magnitude; program 0 keeps it
            finite = tl.load(given_ptr + 1).to(tl.float32, bitcast=True)
            tensor_scale = float32_scales(finite, 0, TENSOR_DIVISOR, False)
            if STORE:
                tl.store(given_ptr + 2, tensor_scale.to(tl.int32, bitcast=True), mask=tl.program_id(0) == 0)
        elif TWO_LEVEL:
            tensor_scale = tl.load(given_ptr)
        else:
            tensor_scale = 1.0
        value, stored = float_tile_scales(amax, bad, tensor_scale, ELEM_MAX, S_FP32, S_MBITS, S_EMIN, S_EMAX,
                                          S_MAX_CODE, S_NAN_CODE, S_ONE_CODE, S_FNUZ, S_HAS_INF, CEIL, S_LEAN)  # fmt: skip
        if STORE:
            if S_FP32:
                tl.store(scales_ptr + block, stored, mask=store)
            else:
                tl.store(scales_ptr + block, stored.to(tl.uint8), mask=store)
        divisor = value * tensor_scale if TWO_LEVEL else value
    return divisor, bad


@triton.jit
def scaled_values(code, divisor, BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                  IS_INT: tl.constexpr, FNUZ: tl.constexpr, HAS_INF: tl.constexpr):  # fmt: skip
    """Values of element codes times their tiles' divisors ([BLOCKS]), one float32 rounding: what
    TorchCast's product gives once narrowed (torch narrows float64 to 16 bits through float32)."""
    return decode_codes(code, BITS, MBITS, EMIN, IS_INT, FNUZ, HAS_INF) * divisor[:, None]


@triton.jit
def float_virtual_kernel(
    x_ptr, out_ptr, given_ptr, n_blocks, blocks_per_row, block_rows, rows, cols,
    TILE: tl.constexpr, TCOLS: tl.constexpr, BLOCKS: tl.constexpr, EVEN: tl.constexpr,
    GIVEN: tl.constexpr, TENSOR_AMAX: tl.constexpr, TWO_LEVEL: tl.constexpr, BITS: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    IS_INT: tl.constexpr, FNUZ: tl.constexpr, HAS_INF: tl.constexpr, NAN_CODE: tl.constexpr,
    ROUND: tl.constexpr, ELEM_MAX: tl.constexpr, S_FP32: tl.constexpr, S_MBITS: tl.constexpr, S_EMIN: tl.constexpr,
    S_EMAX: tl.constexpr, S_MAX_CODE: tl.constexpr, S_NAN_CODE: tl.constexpr, S_ONE_CODE: tl.constexpr,
    S_FNUZ: tl.constexpr, S_HAS_INF: tl.constexpr, CEIL: tl.constexpr, LEAN: tl.constexpr,
    S_LEAN: tl.constexpr, TENSOR_DIVISOR: tl.constexpr,
):  # fmt: skip
    block, offsets, valid, _, x = load_tiles(
        x_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, BLOCKS, EVEN
    )
    divisor, bad = float_divisors(x, block, n_blocks, given_ptr, given_ptr, GIVEN, TENSOR_AMAX, TWO_LEVEL, False,
                                  BLOCKS, ELEM_MAX, S_FP32, S_MBITS, S_EMIN, S_EMAX, S_MAX_CODE, S_NAN_CODE,
                                  S_ONE_CODE, S_FNUZ, S_HAS_INF, CEIL, S_LEAN, TENSOR_DIVISOR)  # fmt: skip
    if IS_INT:
        code = quotient_codes(
            x, divisor, bad, BITS, MBITS, EMIN, EMAX, MAX_CODE, IS_INT, FNUZ, NAN_CODE, ROUND, LEAN
        )
        if GIVEN:  # a caller's scale per tensor is finite: NaN elements stay NaN one by one
            code = tl.where(x != x, NAN_CODE, code)
        values = scaled_values(code, divisor, BITS, MBITS, EMIN, IS_INT, FNUZ, HAS_INF)
    else:  # the values of the codes, without building them (a bad tile's divisor is NaN)
        values = quotient_values(x, divisor, MBITS, EMIN, EMAX, MAX_CODE, ROUND, LEAN)
        if GIVEN:  # NaN elements as their NaN code decodes: NaN, or -0 where the format has none
            NAN_IS_MINUS_ZERO: tl.constexpr = NAN_CODE == (1 << (BITS - 1)) and not FNUZ
            values = tl.where(x != x, -0.0 if NAN_IS_MINUS_ZERO else float("nan"), values)
        values = values * divisor[:, None]
        if FNUZ:  # no negative zero: -0 + 0 is +0 to nearest, any other value unchanged
            values = values + 0.0
    tl.store(out_ptr + offsets, narrow(values, out_ptr), mask=valid)


@triton.jit
def float_actual_kernel(
    x_ptr, codes_ptr, scales_ptr, given_ptr, n_blocks, blocks_per_row, block_rows, rows, cols,
    code_bytes, code_stride,
    TILE: tl.constexpr, TCOLS: tl.constexpr, BLOCKS: tl.constexpr, EVEN: tl.constexpr,
    WORDS: tl.constexpr, GIVEN: tl.constexpr, TENSOR_AMAX: tl.constexpr, TWO_LEVEL: tl.constexpr,
    BITS: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    IS_INT: tl.constexpr, FNUZ: tl.constexpr, HAS_INF: tl.constexpr, NAN_CODE: tl.constexpr,
    ROUND: tl.constexpr, ELEM_MAX: tl.constexpr, S_FP32: tl.constexpr, S_MBITS: tl.constexpr, S_EMIN: tl.constexpr,
    S_EMAX: tl.constexpr, S_MAX_CODE: tl.constexpr, S_NAN_CODE: tl.constexpr, S_ONE_CODE: tl.constexpr,
    S_FNUZ: tl.constexpr, S_HAS_INF: tl.constexpr, CEIL: tl.constexpr, LEAN: tl.constexpr,
    S_LEAN: tl.constexpr, TENSOR_DIVISOR: tl.constexpr, RUNS16: tl.constexpr,
):  # fmt: skip
    block, _, _, _, x = load_tiles(
        x_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, BLOCKS, EVEN, RUNS16
    )
    divisor, bad = float_divisors(x, block, n_blocks, given_ptr, scales_ptr, GIVEN, TENSOR_AMAX, TWO_LEVEL,
                                  TENSOR_AMAX or not GIVEN, BLOCKS,
                                  ELEM_MAX, S_FP32, S_MBITS, S_EMIN, S_EMAX, S_MAX_CODE, S_NAN_CODE,
                                  S_ONE_CODE, S_FNUZ, S_HAS_INF, CEIL, S_LEAN, TENSOR_DIVISOR)  # fmt: skip
    code = quotient_codes(
        x, divisor, bad, BITS, MBITS, EMIN, EMAX, MAX_CODE, IS_INT, FNUZ, NAN_CODE, ROUND, LEAN
    )
    if GIVEN:  # a caller's scale per tensor is finite: NaN elements stay NaN one by one
        code = tl.where(x != x, NAN_CODE, code)
    store_codes(codes_ptr, code, block, n_blocks, code_bytes, code_stride, TILE, BLOCKS, BITS, WORDS)


@triton.jit
def float_upcast_kernel(
    codes_ptr, scales_ptr, given_ptr, out_ptr, n_blocks, blocks_per_row, block_rows, rows, cols,
    code_bytes, code_stride,
    TILE: tl.constexpr, TCOLS: tl.constexpr, BLOCKS: tl.constexpr, EVEN: tl.constexpr,
    GIVEN: tl.constexpr, TWO_LEVEL: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr,
    EMIN: tl.constexpr, IS_INT: tl.constexpr, FNUZ: tl.constexpr, HAS_INF: tl.constexpr, VEC: tl.constexpr,
    S_FP32: tl.constexpr, S_MBITS: tl.constexpr, S_EMIN: tl.constexpr, S_FNUZ: tl.constexpr,
    S_HAS_INF: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    offsets, valid, _ = tile_offsets(
        block, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, EVEN
    )
    code = load_codes(codes_ptr, block, code_bytes, code_stride, TILE, BLOCKS, BITS, VEC)
    if GIVEN:
        divisor = tl.zeros([BLOCKS], dtype=tl.float32) + tl.load(given_ptr)
    else:
        if S_FP32:
            divisor = tl.load(scales_ptr + block, mask=block < n_blocks, other=1.0)
        else:
            stored = tl.load(scales_ptr + block, mask=block < n_blocks, other=0).to(tl.int32)
            divisor = decode_codes(stored, 8, S_MBITS, S_EMIN, False, S_FNUZ, S_HAS_INF)
        if TWO_LEVEL:
            divisor = divisor * tl.load(given_ptr)
    values = scaled_values(code, divisor, BITS, MBITS, EMIN, IS_INT, FNUZ, HAS_INF)
    tl.store(out_ptr + offsets, narrow(values, out_ptr), mask=valid)


@triton.jit
def amax_kernel(x_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    """Into out_ptr[0] the largest magnitude's bits (a NaN or Inf pattern when there is one), into
    out_ptr[1] the largest finite magnitude's: positive floats order as integers."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = widen(tl.load(x_ptr + offsets, mask=offsets < numel, other=0))
    bits = ((x.to(tl.uint32, bitcast=True) << 1) >> 1).to(tl.int32)
    tl.atomic_max(out_ptr, tl.max(bits, axis=0))
    tl.atomic_max(out_ptr + 1, tl.max(tl.where(bits < 0x7F800000, bits, 0), axis=0))
