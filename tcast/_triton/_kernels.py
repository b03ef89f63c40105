"""The kernels: virtual cast, actual cast (packed codes + E8M0 scale codes) and upcast for
unscaled and power-of-two scaled formats; the same three for float scales (per tile, channel
row or tensor, and two-level); the cast under per-tile scales a caller gives; and the amax pass
that per-tensor scales need first."""

from __future__ import annotations

import triton
import triton.language as tl

from ._elements import (
    bf16_pair_codes,
    bf16_pair_values,
    decode_codes,
    draw_noise,
    element_codes,
    even_magnitudes,
    float32_scales,
    float_tile_scales,
    fp8_code,
    fp8_value,
    grid_magnitude,
    grid_values,
    magnitude_values,
    negated_code,
    pow2,
    quotient_codes,
    quotient_magnitudes,
    quotient_values,
    round_values,
    tile_exponent,
    tile_stats,
    tile_top,
    top_stats,
)
from ._memory import (
    byte_pair,
    byte_signs,
    half_magnitudes,
    half_negative,
    load_codes,
    load_pairs,
    load_tiles,
    load_words,
    narrow,
    narrow_pair,
    store_codes,
    store_half_nibble_words,
    store_nibble_words,
    store_pair_codes,
    tile_offsets,
    widen,
)


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
    WORDS: tl.constexpr = False,
    MAX_BITS: tl.constexpr = 0,
):
    """WORDS: bfloat16 tiles rounded to nearest even on a float grid, read and written as words of
    two values in bf16x2 arithmetic (`_virtual_words`; MAX_BITS the largest value's bits)."""
    if WORDS:
        _virtual_words(x_ptr, out_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, BLOCKS,
                       EVEN, MBITS, EMIN, EMAX, LIMIT, FNUZ, SCALE_MODE, MAX_BITS)  # fmt: skip
    else:
        _virtual_values(x_ptr, out_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, seed, TILE, TCOLS,
                        BLOCKS, HAS_SCALE, EVEN, MBITS, EMIN, EMAX, MAXV, LIMIT, IS_INT, FNUZ, HAS_INF,
                        SCALE_MODE, ROUND, HW_FP8)  # fmt: skip


@triton.jit
def _virtual_words(
    x_ptr, out_ptr, n_blocks, blocks_per_row, block_rows, rows, cols,
    TILE: tl.constexpr, TCOLS: tl.constexpr, BLOCKS: tl.constexpr, EVEN: tl.constexpr, MBITS: tl.constexpr,
    EMIN: tl.constexpr, EMAX: tl.constexpr, LIMIT: tl.constexpr, FNUZ: tl.constexpr, SCALE_MODE: tl.constexpr,
    MAX_BITS: tl.constexpr,
):  # fmt: skip
    """A virtual cast of bfloat16 tiles under E8M0 scales, rounded to nearest even: words of two
    values in, the tile's amax from halfword maxima, values by `bf16_pair_values`, words out."""
    _, _, offsets, valid, word, top = load_words(
        x_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, BLOCKS, EVEN, True
    )
    bad, amax = top_stats(top)
    exponent = tile_exponent(amax, LIMIT, EMAX, SCALE_MODE)
    back = tl.where(bad > 0, float("nan"), pow2(exponent))
    values = bf16_pair_values(word, pow2(-exponent), back, MBITS, EMIN, MAX_BITS, FNUZ)
    tl.store(out_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + offsets, values, mask=valid)


@triton.jit
def _virtual_values(
    x_ptr, out_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, seed,
    TILE: tl.constexpr, TCOLS: tl.constexpr, BLOCKS: tl.constexpr, HAS_SCALE: tl.constexpr, EVEN: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAXV: tl.constexpr, LIMIT: tl.constexpr,
    IS_INT: tl.constexpr, FNUZ: tl.constexpr, HAS_INF: tl.constexpr, SCALE_MODE: tl.constexpr,
    ROUND: tl.constexpr, HW_FP8: tl.constexpr,
):  # fmt: skip
    """A virtual cast value by value in float32."""
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
    NIBBLE_WORDS: tl.constexpr,
    NATIVE: tl.constexpr,
    FP8_GRID: tl.constexpr,
    FP8_SHIFT: tl.constexpr,
):
    """NIBBLE_WORDS 1: 4-bit codes of 16-bit tiles rounded to nearest even, read as words of two
    values (_nibble_words; NATIVE: with the GPU's byte permute and halfword max); 2: the same in
    bf16x2 arithmetic (`_launch._bf16_halves`); 0: the tiles as float32 values."""
    if NIBBLE_WORDS != 0:
        _nibble_words(x_ptr, codes_ptr, scales_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS,
                      BLOCKS, EVEN, MBITS, EMIN, EMAX, MAX_CODE, LIMIT, IS_INT, FNUZ, NAN_CODE, SCALE_MODE,
                      NATIVE, NIBBLE_WORDS == 2)  # fmt: skip
    else:
        block, _, _, index, x = load_tiles(
            x_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, BLOCKS, EVEN, RUNS16
        )
        if HAS_SCALE:
            bad, to_grid = _e8m0_scales(scales_ptr, block, n_blocks, tile_top(x), LIMIT, EMAX, SCALE_MODE)
        else:
            bad = 0
            to_grid = 1.0
        code = element_codes(x, to_grid, bad, index, seed, HAS_SCALE, BITS, MBITS, EMIN, EMAX, MAX_CODE, IS_INT,
                             FNUZ, HAS_INF, NAN_CODE, ROUND, HW_FP8, FAST, FP8_GRID, FP8_SHIFT)  # fmt: skip
        store_codes(codes_ptr, code, block, n_blocks, code_bytes, TILE, TILE, BLOCKS, BITS, HAS_SCALE)


@triton.jit
def _e8m0_scales(
    scales_ptr, block, n_blocks, top, LIMIT: tl.constexpr, EMAX: tl.constexpr, SCALE_MODE: tl.constexpr
):  # fmt: skip
    """(bad, to_grid) of tiles whose largest magnitude has the bits `top`: their E8M0 scale codes
    stored (255 where a NaN or Inf makes the tile NaN), and the multiplier onto the grid."""
    bad, amax = top_stats(top)
    exponent = tile_exponent(amax, LIMIT, EMAX, SCALE_MODE)
    tl.store(scales_ptr + block, tl.where(bad > 0, 255, exponent + 127).to(tl.uint8), mask=block < n_blocks)
    return bad, pow2(-exponent)


@triton.jit
def _nibble_words(
    x_ptr, codes_ptr, scales_ptr, n_blocks, blocks_per_row, block_rows, rows, cols,
    TILE: tl.constexpr, TCOLS: tl.constexpr, BLOCKS: tl.constexpr, EVEN: tl.constexpr, MBITS: tl.constexpr,
    EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr, LIMIT: tl.constexpr, IS_INT: tl.constexpr,
    FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, SCALE_MODE: tl.constexpr, NATIVE: tl.constexpr,
    HALVES: tl.constexpr,
):  # fmt: skip
    """4-bit codes under E8M0 scales, rounded to nearest even, of tiles of 16-bit values held as
    32-bit words of two (a tile's rows of even length, the stream 4-byte aligned): magnitudes
    split from the words at the cost of a widening (HALVES: bfloat16 words kept as value pairs,
    `_elements.bf16_pair_codes`), the tile's amax from maxima of both halves at once, and float
    signs join the packed magnitudes a word of eight codes at a time (ints: two's complement
    codes)."""
    bf16: tl.constexpr = x_ptr.dtype.element_ty == tl.int16
    block, _, _, _, word, top = load_words(
        x_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, BLOCKS, EVEN, NATIVE
    )
    bad, to_grid = _e8m0_scales(scales_ptr, block, n_blocks, top, LIMIT, EMAX, SCALE_MODE)
    signs: tl.constexpr = 0 if IS_INT else (1 if FNUZ else 2)
    if HALVES:
        pairs = bf16_pair_codes(word, to_grid, MBITS, EMIN, MAX_CODE, IS_INT)
        store_half_nibble_words(
            codes_ptr, pairs, word, block, bad, n_blocks, TILE // 2, BLOCKS, signs, NAN_CODE
        )
    else:
        low = _even_half_codes(word, False, to_grid, bf16, MBITS, EMIN, MAX_CODE, IS_INT, NATIVE)
        high = _even_half_codes(word, True, to_grid, bf16, MBITS, EMIN, MAX_CODE, IS_INT, NATIVE)
        store_nibble_words(
            codes_ptr, low, high, word, block, bad, n_blocks, TILE // 2, BLOCKS, signs, NAN_CODE, NATIVE
        )


@triton.jit
def _even_half_codes(
    word, HIGH: tl.constexpr, to_grid, BF16: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
    MAX_CODE: tl.constexpr, IS_INT: tl.constexpr, NATIVE: tl.constexpr,
):  # fmt: skip
    """4-bit codes of the values in one half of the words, rounded to nearest even: magnitude
    codes (float elements: their signs join when packed), or two's complement codes (ints)."""
    magnitude = half_magnitudes(word, HIGH, BF16, NATIVE) * to_grid[:, None]
    code = even_magnitudes(magnitude, MBITS, EMIN, MAX_CODE, IS_INT)
    if IS_INT:
        code = negated_code(code, half_negative(word, HIGH), 4, True, False)
    return code


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
    WORDS: tl.constexpr,
):
    block = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    offsets, valid, _ = tile_offsets(
        block, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, EVEN
    )
    code = load_codes(codes_ptr, block, code_bytes, TILE, TILE, BLOCKS, BITS, VEC, WORDS)
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
def tensor_scalar(
    given_ptr, scales_ptr,
    GIVEN: tl.constexpr, TENSOR_AMAX: tl.constexpr, TWO_LEVEL: tl.constexpr, STORE: tl.constexpr,
    ELEM_MAX: tl.constexpr, S_FP32: tl.constexpr, S_MBITS: tl.constexpr, S_EMIN: tl.constexpr,
    S_EMAX: tl.constexpr, S_MAX_CODE: tl.constexpr, S_NAN_CODE: tl.constexpr, S_ONE_CODE: tl.constexpr,
    S_FNUZ: tl.constexpr, S_HAS_INF: tl.constexpr, CEIL: tl.constexpr, S_LEAN: tl.constexpr,
    TENSOR_DIVISOR: tl.constexpr,
):  # fmt: skip
    """The program's one scalar of the scales: GIVEN, the tensor's one scale (the caller's or the
    host's at given_ptr; with TENSOR_AMAX computed here from the amax pass's bits of the largest
    magnitude at given_ptr, and stored by program 0 with STORE); TWO_LEVEL, the tensor scale (at
    given_ptr; with TENSOR_AMAX from the pass's largest finite magnitude at given_ptr + 1, kept
    by program 0 at given_ptr + 2 with STORE); else 1."""
    first = tl.program_id(0) == 0
    if GIVEN and TENSOR_AMAX:  # the tensor's amax, a scalar: its scale has one place
        top = tl.load(given_ptr)
        bad = (top >= 0x7F800000).to(tl.int32)
        scalar, stored = float_tile_scales(top.to(tl.float32, bitcast=True), bad, 1.0, ELEM_MAX, S_FP32, S_MBITS,
                                           S_EMIN, S_EMAX, S_MAX_CODE, S_NAN_CODE, S_ONE_CODE, S_FNUZ, S_HAS_INF,
                                           CEIL, S_LEAN)  # fmt: skip
        if STORE:
            if S_FP32:
                tl.store(scales_ptr, stored, mask=first)
            else:
                tl.store(scales_ptr, stored.to(tl.uint8), mask=first)
    elif TWO_LEVEL and TENSOR_AMAX:
        scalar = float32_scales(tl.load(given_ptr + 1).to(tl.float32, bitcast=True), 0, TENSOR_DIVISOR, False)
        if STORE:
            tl.store(given_ptr + 2, scalar.to(tl.int32, bitcast=True), mask=first)
    elif GIVEN or TWO_LEVEL:
        scalar = tl.load(given_ptr)
    else:
        scalar = 1.0
    return scalar


@triton.jit
def float_divisors(
    top, scalar, block, n_blocks, scales_ptr,
    GIVEN: tl.constexpr, TWO_LEVEL: tl.constexpr, STORE: tl.constexpr,
    BLOCKS: tl.constexpr, ELEM_MAX: tl.constexpr, S_FP32: tl.constexpr, S_MBITS: tl.constexpr,
    S_EMIN: tl.constexpr, S_EMAX: tl.constexpr, S_MAX_CODE: tl.constexpr, S_NAN_CODE: tl.constexpr,
    S_ONE_CODE: tl.constexpr, S_FNUZ: tl.constexpr, S_HAS_INF: tl.constexpr, CEIL: tl.constexpr,
    S_LEAN: tl.constexpr, DIVISORS: tl.constexpr,
):  # fmt: skip
    """(divisor, bad) per tile of largest magnitude bits `top`: the scale the values divide by
    (two levels: the tile scale times the tensor scale `scalar`, in float32) and whether the
    tile holds a NaN or Inf. GIVEN: the tensor's one scale `scalar`; else each tile's own,
    stored (STORE)."""
    if GIVEN:
        divisor = tl.zeros([BLOCKS], dtype=tl.float32) + scalar
        bad = (divisor != divisor).to(tl.int32)
    else:
        bad, amax = top_stats(top)
        value, stored = float_tile_scales(amax, bad, scalar, ELEM_MAX, S_FP32, S_MBITS, S_EMIN, S_EMAX, S_MAX_CODE,
                                          S_NAN_CODE, S_ONE_CODE, S_FNUZ, S_HAS_INF, CEIL, S_LEAN,
                                          DIVISORS)  # fmt: skip
        if STORE:
            if S_FP32:
                tl.store(scales_ptr + block, stored, mask=block < n_blocks)
            else:
                tl.store(scales_ptr + block, stored.to(tl.uint8), mask=block < n_blocks)
        divisor = value * scalar if TWO_LEVEL else value
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
    S_LEAN: tl.constexpr, TENSOR_DIVISOR: tl.constexpr, DIVISORS: tl.constexpr, SCALAR_LO: tl.constexpr,
    SCALAR_HI: tl.constexpr, WORDS16: tl.constexpr, NATIVE: tl.constexpr,
):  # fmt: skip
    """WORDS16: float elements (not fnuz) of tiles of 16-bit values into 16-bit values, both as
    32-bit words of two (_float_virtual_words). SCALAR_LO, SCALAR_HI as float_actual_kernel's."""
    scalar = tensor_scalar(given_ptr, given_ptr, GIVEN, TENSOR_AMAX, TWO_LEVEL, False, ELEM_MAX, S_FP32, S_MBITS,
                           S_EMIN, S_EMAX, S_MAX_CODE, S_NAN_CODE, S_ONE_CODE, S_FNUZ, S_HAS_INF, CEIL, S_LEAN,
                           TENSOR_DIVISOR)  # fmt: skip
    if SCALAR_HI > 0:  # noqa: SIM108  (constexpr branches)
        fast = (scalar >= SCALAR_LO) & (scalar <= SCALAR_HI)
    else:
        fast = True  # a constant: only the DIVISORS arm is built
    if fast:
        _float_virtual_tiles(x_ptr, out_ptr, scalar, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS,
                             BLOCKS, EVEN, GIVEN, TWO_LEVEL, BITS, MBITS, EMIN, EMAX, MAX_CODE, IS_INT, FNUZ,
                             HAS_INF, NAN_CODE, ROUND, ELEM_MAX, S_FP32, S_MBITS, S_EMIN, S_EMAX, S_MAX_CODE,
                             S_NAN_CODE, S_ONE_CODE, S_FNUZ, S_HAS_INF, CEIL, LEAN, S_LEAN, DIVISORS, WORDS16,
                             NATIVE)  # fmt: skip
    else:
        _float_virtual_tiles(x_ptr, out_ptr, scalar, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS,
                             BLOCKS, EVEN, GIVEN, TWO_LEVEL, BITS, MBITS, EMIN, EMAX, MAX_CODE, IS_INT, FNUZ,
                             HAS_INF, NAN_CODE, ROUND, ELEM_MAX, S_FP32, S_MBITS, S_EMIN, S_EMAX, S_MAX_CODE,
                             S_NAN_CODE, S_ONE_CODE, S_FNUZ, S_HAS_INF, CEIL, LEAN, S_LEAN, 0, WORDS16,
                             NATIVE)  # fmt: skip


@triton.jit
def _float_virtual_tiles(
    x_ptr, out_ptr, scalar, n_blocks, blocks_per_row, block_rows, rows, cols,
    TILE: tl.constexpr, TCOLS: tl.constexpr, BLOCKS: tl.constexpr, EVEN: tl.constexpr,
    GIVEN: tl.constexpr, TWO_LEVEL: tl.constexpr, BITS: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    IS_INT: tl.constexpr, FNUZ: tl.constexpr, HAS_INF: tl.constexpr, NAN_CODE: tl.constexpr,
    ROUND: tl.constexpr, ELEM_MAX: tl.constexpr, S_FP32: tl.constexpr, S_MBITS: tl.constexpr, S_EMIN: tl.constexpr,
    S_EMAX: tl.constexpr, S_MAX_CODE: tl.constexpr, S_NAN_CODE: tl.constexpr, S_ONE_CODE: tl.constexpr,
    S_FNUZ: tl.constexpr, S_HAS_INF: tl.constexpr, CEIL: tl.constexpr, LEAN: tl.constexpr,
    S_LEAN: tl.constexpr, DIVISORS: tl.constexpr, WORDS16: tl.constexpr, NATIVE: tl.constexpr,
):  # fmt: skip
    """The virtual cast of the program's tiles under the tensor's scalar."""
    if WORDS16:
        _float_virtual_words(x_ptr, out_ptr, scalar, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS,
                             BLOCKS, EVEN, TWO_LEVEL, MBITS, EMIN, EMAX, MAX_CODE, ROUND, ELEM_MAX, S_FP32, S_MBITS,
                             S_EMIN, S_EMAX, S_MAX_CODE, S_NAN_CODE, S_ONE_CODE, S_FNUZ, S_HAS_INF, CEIL, LEAN,
                             S_LEAN, DIVISORS, NATIVE)  # fmt: skip
    else:
        _float_virtual_values(x_ptr, out_ptr, scalar, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS,
                              BLOCKS, EVEN, GIVEN, TWO_LEVEL, BITS, MBITS, EMIN, EMAX, MAX_CODE, IS_INT, FNUZ,
                              HAS_INF, NAN_CODE, ROUND, ELEM_MAX, S_FP32, S_MBITS, S_EMIN, S_EMAX, S_MAX_CODE,
                              S_NAN_CODE, S_ONE_CODE, S_FNUZ, S_HAS_INF, CEIL, LEAN, S_LEAN, DIVISORS)  # fmt: skip


@triton.jit
def _float_virtual_values(
    x_ptr, out_ptr, scalar, n_blocks, blocks_per_row, block_rows, rows, cols,
    TILE: tl.constexpr, TCOLS: tl.constexpr, BLOCKS: tl.constexpr, EVEN: tl.constexpr,
    GIVEN: tl.constexpr, TWO_LEVEL: tl.constexpr, BITS: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    IS_INT: tl.constexpr, FNUZ: tl.constexpr, HAS_INF: tl.constexpr, NAN_CODE: tl.constexpr,
    ROUND: tl.constexpr, ELEM_MAX: tl.constexpr, S_FP32: tl.constexpr, S_MBITS: tl.constexpr, S_EMIN: tl.constexpr,
    S_EMAX: tl.constexpr, S_MAX_CODE: tl.constexpr, S_NAN_CODE: tl.constexpr, S_ONE_CODE: tl.constexpr,
    S_FNUZ: tl.constexpr, S_HAS_INF: tl.constexpr, CEIL: tl.constexpr, LEAN: tl.constexpr,
    S_LEAN: tl.constexpr, DIVISORS: tl.constexpr,
):  # fmt: skip
    """The virtual cast of tiles loaded as float32 values."""
    block, offsets, valid, _, x = load_tiles(
        x_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, BLOCKS, EVEN
    )
    top = 0 if GIVEN else tile_top(x)
    divisor, bad = float_divisors(top, scalar, block, n_blocks, out_ptr, GIVEN, TWO_LEVEL, False, BLOCKS, ELEM_MAX,
                                  S_FP32, S_MBITS, S_EMIN, S_EMAX, S_MAX_CODE, S_NAN_CODE, S_ONE_CODE, S_FNUZ,
                                  S_HAS_INF, CEIL, S_LEAN, DIVISORS)  # fmt: skip
    if IS_INT:
        code = quotient_codes(
            x, divisor, bad, BITS, MBITS, EMIN, EMAX, MAX_CODE, IS_INT, FNUZ, NAN_CODE, ROUND, LEAN, DIVISORS
        )
        if GIVEN:  # a caller's scale per tensor is finite: NaN elements stay NaN one by one
            code = tl.where(x != x, NAN_CODE, code)
        values = scaled_values(code, divisor, BITS, MBITS, EMIN, IS_INT, FNUZ, HAS_INF)
    else:  # the values of the codes, without building them (a bad tile's divisor is NaN)
        values = quotient_values(x, divisor, MBITS, EMIN, EMAX, MAX_CODE, ROUND, LEAN, DIVISORS)
        if GIVEN:  # NaN elements as their NaN code decodes: NaN, or -0 where the format has none
            NAN_IS_MINUS_ZERO: tl.constexpr = NAN_CODE == (1 << (BITS - 1)) and not FNUZ
            values = tl.where(x != x, -0.0 if NAN_IS_MINUS_ZERO else float("nan"), values)
        values = values * divisor[:, None]
        if FNUZ:  # no negative zero: -0 + 0 is +0 to nearest, any other value unchanged
            values = values + 0.0
    tl.store(out_ptr + offsets, narrow(values, out_ptr), mask=valid)


@triton.jit
def _float_virtual_words(
    x_ptr, out_ptr, scalar, n_blocks, blocks_per_row, block_rows, rows, cols,
    TILE: tl.constexpr, TCOLS: tl.constexpr, BLOCKS: tl.constexpr, EVEN: tl.constexpr, TWO_LEVEL: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr, ROUND: tl.constexpr,
    ELEM_MAX: tl.constexpr, S_FP32: tl.constexpr, S_MBITS: tl.constexpr, S_EMIN: tl.constexpr,
    S_EMAX: tl.constexpr, S_MAX_CODE: tl.constexpr, S_NAN_CODE: tl.constexpr, S_ONE_CODE: tl.constexpr,
    S_FNUZ: tl.constexpr, S_HAS_INF: tl.constexpr, CEIL: tl.constexpr, LEAN: tl.constexpr, S_LEAN: tl.constexpr,
    DIVISORS: tl.constexpr, NATIVE: tl.constexpr,
):  # fmt: skip
    """The virtual cast of 16-bit tiles into 16-bit values as words of two values in and out (as
    _float_byte_words reads them): each half's magnitude rounded and narrowed, both signs put
    back on the narrowed pair by one mask (a bad tile's NaN divisor makes its values NaN)."""
    bf16: tl.constexpr = x_ptr.dtype.element_ty == tl.int16
    block, _, offsets, valid, word, top = load_words(
        x_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, BLOCKS, EVEN, NATIVE
    )
    divisor, _ = float_divisors(top, scalar, block, n_blocks, out_ptr, False, TWO_LEVEL, False, BLOCKS, ELEM_MAX,
                                S_FP32, S_MBITS, S_EMIN, S_EMAX, S_MAX_CODE, S_NAN_CODE, S_ONE_CODE, S_FNUZ,
                                S_HAS_INF, CEIL, S_LEAN, DIVISORS)  # fmt: skip
    low = _half_values(word, False, divisor, bf16, MBITS, EMIN, EMAX, MAX_CODE, ROUND, LEAN, DIVISORS, NATIVE)
    high = _half_values(word, True, divisor, bf16, MBITS, EMIN, EMAX, MAX_CODE, ROUND, LEAN, DIVISORS, NATIVE)
    pair = narrow_pair(low, high, out_ptr, NATIVE) | (word & -0x7FFF8000)  # 0x80008000: the signs
    tl.store(out_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + offsets, pair, mask=valid)


@triton.jit
def _half_values(
    word, HIGH: tl.constexpr, divisor, BF16: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
    EMAX: tl.constexpr, MAX_CODE: tl.constexpr, ROUND: tl.constexpr, LEAN: tl.constexpr, DIVISORS: tl.constexpr,
    NATIVE: tl.constexpr,
):  # fmt: skip
    """float32 cast magnitudes of the 16-bit values in one half of the words, times their tiles'
    divisors (as quotient_values decodes them)."""
    code = _half_code(word, HIGH, divisor, BF16, MBITS, EMIN, EMAX, MAX_CODE, ROUND, LEAN, DIVISORS, NATIVE)
    return magnitude_values(code, MBITS, EMIN) * divisor[:, None]


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
    S_LEAN: tl.constexpr, TENSOR_DIVISOR: tl.constexpr, DIVISORS: tl.constexpr, SCALAR_LO: tl.constexpr,
    SCALAR_HI: tl.constexpr, RUNS16: tl.constexpr, PAIRS: tl.constexpr, BYTE_WORDS: tl.constexpr,
    NATIVE: tl.constexpr,
):  # fmt: skip
    """PAIRS: 4-bit codes of 16-value tiles of a contiguous 16-bit stream, read as words of two
    values (_float_pairs); BYTE_WORDS: 8-bit float codes of 16-bit tiles read as words
    (_float_byte_words); else the tiles as float32 values. NATIVE: the GPU's own instructions
    (byte permute, halfword max, approximate reciprocal) where they save some. SCALAR_HI > 0:
    the tensor's scalar is read here, and the divisors are DIVISORS only while it lies in
    [SCALAR_LO, SCALAR_HI] (`_launch._divisors`); both arms are whole casts of the program's
    tiles, so one costs no registers of the other."""
    scalar = tensor_scalar(given_ptr, scales_ptr, GIVEN, TENSOR_AMAX, TWO_LEVEL, TENSOR_AMAX, ELEM_MAX, S_FP32,
                           S_MBITS, S_EMIN, S_EMAX, S_MAX_CODE, S_NAN_CODE, S_ONE_CODE, S_FNUZ, S_HAS_INF, CEIL,
                           S_LEAN, TENSOR_DIVISOR)  # fmt: skip
    if SCALAR_HI > 0:  # noqa: SIM108  (constexpr branches)
        fast = (scalar >= SCALAR_LO) & (scalar <= SCALAR_HI)
    else:
        fast = True  # a constant: only the DIVISORS arm is built
    if fast:
        _float_actual_tiles(x_ptr, codes_ptr, scales_ptr, scalar, n_blocks, blocks_per_row, block_rows, rows, cols,
                            code_bytes, code_stride, TILE, TCOLS, BLOCKS, EVEN, WORDS, GIVEN, TWO_LEVEL, BITS, MBITS,
                            EMIN, EMAX, MAX_CODE, IS_INT, FNUZ, NAN_CODE, ROUND, ELEM_MAX, S_FP32, S_MBITS, S_EMIN,
                            S_EMAX, S_MAX_CODE, S_NAN_CODE, S_ONE_CODE, S_FNUZ, S_HAS_INF, CEIL, LEAN, S_LEAN,
                            DIVISORS, RUNS16, PAIRS, BYTE_WORDS, NATIVE)  # fmt: skip
    else:
        _float_actual_tiles(x_ptr, codes_ptr, scales_ptr, scalar, n_blocks, blocks_per_row, block_rows, rows, cols,
                            code_bytes, code_stride, TILE, TCOLS, BLOCKS, EVEN, WORDS, GIVEN, TWO_LEVEL, BITS, MBITS,
                            EMIN, EMAX, MAX_CODE, IS_INT, FNUZ, NAN_CODE, ROUND, ELEM_MAX, S_FP32, S_MBITS, S_EMIN,
                            S_EMAX, S_MAX_CODE, S_NAN_CODE, S_ONE_CODE, S_FNUZ, S_HAS_INF, CEIL, LEAN, S_LEAN, 0,
                            RUNS16, PAIRS, BYTE_WORDS, NATIVE)  # fmt: skip


@triton.jit
def _float_actual_tiles(
    x_ptr, codes_ptr, scales_ptr, scalar, n_blocks, blocks_per_row, block_rows, rows, cols, code_bytes, code_stride,
    TILE: tl.constexpr, TCOLS: tl.constexpr, BLOCKS: tl.constexpr, EVEN: tl.constexpr, WORDS: tl.constexpr,
    GIVEN: tl.constexpr, TWO_LEVEL: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
    EMAX: tl.constexpr, MAX_CODE: tl.constexpr, IS_INT: tl.constexpr, FNUZ: tl.constexpr, NAN_CODE: tl.constexpr,
    ROUND: tl.constexpr, ELEM_MAX: tl.constexpr, S_FP32: tl.constexpr, S_MBITS: tl.constexpr, S_EMIN: tl.constexpr,
    S_EMAX: tl.constexpr, S_MAX_CODE: tl.constexpr, S_NAN_CODE: tl.constexpr, S_ONE_CODE: tl.constexpr,
    S_FNUZ: tl.constexpr, S_HAS_INF: tl.constexpr, CEIL: tl.constexpr, LEAN: tl.constexpr, S_LEAN: tl.constexpr,
    DIVISORS: tl.constexpr, RUNS16: tl.constexpr, PAIRS: tl.constexpr, BYTE_WORDS: tl.constexpr,
    NATIVE: tl.constexpr,
):  # fmt: skip
    """The actual cast of the program's tiles under the tensor's scalar."""
    if PAIRS:
        _float_pairs(x_ptr, codes_ptr, scales_ptr, scalar, n_blocks, TWO_LEVEL, BLOCKS, BITS, MBITS, EMIN, EMAX,
                     MAX_CODE, IS_INT, FNUZ, NAN_CODE, ROUND, ELEM_MAX, S_FP32, S_MBITS, S_EMIN, S_EMAX, S_MAX_CODE,
                     S_NAN_CODE, S_ONE_CODE, S_FNUZ, S_HAS_INF, CEIL, LEAN, S_LEAN, DIVISORS, NATIVE)  # fmt: skip
    elif BYTE_WORDS:
        _float_byte_words(x_ptr, codes_ptr, scales_ptr, scalar, n_blocks, blocks_per_row, block_rows, rows, cols,
                          code_bytes, code_stride, TILE, TCOLS, BLOCKS, EVEN, TWO_LEVEL, MBITS, EMIN, EMAX, MAX_CODE,
                          FNUZ, NAN_CODE, ROUND, ELEM_MAX, S_FP32, S_MBITS, S_EMIN, S_EMAX, S_MAX_CODE, S_NAN_CODE,
                          S_ONE_CODE, S_FNUZ, S_HAS_INF, CEIL, LEAN, S_LEAN, DIVISORS, NATIVE)  # fmt: skip
    else:
        block, _, _, _, x = load_tiles(
            x_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, BLOCKS, EVEN, RUNS16
        )
        top = 0 if GIVEN else tile_top(x)
        divisor, bad = float_divisors(top, scalar, block, n_blocks, scales_ptr, GIVEN, TWO_LEVEL, not GIVEN, BLOCKS,
                                      ELEM_MAX, S_FP32, S_MBITS, S_EMIN, S_EMAX, S_MAX_CODE, S_NAN_CODE, S_ONE_CODE,
                                      S_FNUZ, S_HAS_INF, CEIL, S_LEAN, DIVISORS)  # fmt: skip
        code = quotient_codes(
            x, divisor, bad, BITS, MBITS, EMIN, EMAX, MAX_CODE, IS_INT, FNUZ, NAN_CODE, ROUND, LEAN, DIVISORS
        )
        if GIVEN:  # a caller's scale per tensor is finite: NaN elements stay NaN one by one
            code = tl.where(x != x, NAN_CODE, code)
        store_codes(codes_ptr, code, block, n_blocks, code_bytes, code_stride, TILE, BLOCKS, BITS, WORDS)


@triton.jit
def _float_pairs(
    x_ptr, codes_ptr, scales_ptr, scalar, n_blocks,
    TWO_LEVEL: tl.constexpr, BLOCKS: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
    EMAX: tl.constexpr, MAX_CODE: tl.constexpr, IS_INT: tl.constexpr, FNUZ: tl.constexpr, NAN_CODE: tl.constexpr,
    ROUND: tl.constexpr, ELEM_MAX: tl.constexpr, S_FP32: tl.constexpr, S_MBITS: tl.constexpr, S_EMIN: tl.constexpr,
    S_EMAX: tl.constexpr, S_MAX_CODE: tl.constexpr, S_NAN_CODE: tl.constexpr, S_ONE_CODE: tl.constexpr,
    S_FNUZ: tl.constexpr, S_HAS_INF: tl.constexpr, CEIL: tl.constexpr, LEAN: tl.constexpr, S_LEAN: tl.constexpr,
    DIVISORS: tl.constexpr, NATIVE: tl.constexpr,
):  # fmt: skip
    """The actual cast of 16-value tiles of 16-bit values into 4-bit codes from 32-bit words of two
    values: magnitudes and signs come apart from the words at the cost of a plain widening (the
    kernel is bound by instruction issue), the tile's amax is its largest magnitude's bits, and
    float signs join the packed magnitudes a word at a time."""
    bf16: tl.constexpr = x_ptr.dtype.element_ty == tl.int16
    block, first, second = load_pairs(x_ptr, n_blocks, BLOCKS)
    m0 = half_magnitudes(first, False, bf16)  # elements 0, 2, 4, 6 of the tile
    m1 = half_magnitudes(first, True, bf16)  # 1, 3, 5, 7
    m2 = half_magnitudes(second, False, bf16)  # 8, 10, 12, 14
    m3 = half_magnitudes(second, True, bf16)  # 9, 11, 13, 15
    top = tl.max(
        tl.maximum(
            tl.maximum(m0.to(tl.int32, bitcast=True), m1.to(tl.int32, bitcast=True)),
            tl.maximum(m2.to(tl.int32, bitcast=True), m3.to(tl.int32, bitcast=True)),
        ),
        axis=1,
    )
    divisor, bad = float_divisors(top, scalar, block, n_blocks, scales_ptr, False, TWO_LEVEL, True, BLOCKS, ELEM_MAX,
                                  S_FP32, S_MBITS, S_EMIN, S_EMAX, S_MAX_CODE, S_NAN_CODE, S_ONE_CODE, S_FNUZ,
                                  S_HAS_INF, CEIL, S_LEAN, DIVISORS)  # fmt: skip
    c0 = _half_codes(
        m0, first, False, divisor, BITS, MBITS, EMIN, EMAX, MAX_CODE, IS_INT, ROUND, LEAN, DIVISORS
    )
    c1 = _half_codes(
        m1, first, True, divisor, BITS, MBITS, EMIN, EMAX, MAX_CODE, IS_INT, ROUND, LEAN, DIVISORS
    )
    c2 = _half_codes(
        m2, second, False, divisor, BITS, MBITS, EMIN, EMAX, MAX_CODE, IS_INT, ROUND, LEAN, DIVISORS
    )
    c3 = _half_codes(
        m3, second, True, divisor, BITS, MBITS, EMIN, EMAX, MAX_CODE, IS_INT, ROUND, LEAN, DIVISORS
    )
    signs: tl.constexpr = 0 if IS_INT else (1 if FNUZ else 2)
    store_pair_codes(
        codes_ptr, c0, c1, c2, c3, first, second, block, bad, n_blocks, BLOCKS, signs, NAN_CODE, NATIVE
    )


@triton.jit
def _half_codes(
    magnitude, word, HIGH: tl.constexpr, divisor,
    BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    IS_INT: tl.constexpr, ROUND: tl.constexpr, LEAN: tl.constexpr, DIVISORS: tl.constexpr,
):  # fmt: skip
    """Codes of the magnitudes of one half of the words over their tiles' float divisors:
    magnitude codes (float elements: their signs join when packed), or two's complement codes
    (ints)."""
    code, _ = quotient_magnitudes(
        magnitude, divisor, MBITS, EMIN, EMAX, MAX_CODE, IS_INT, ROUND, LEAN, DIVISORS, False
    )
    if IS_INT:
        code = negated_code(code, half_negative(word, HIGH), BITS, True, False)
    return code


@triton.jit
def _float_byte_words(
    x_ptr, codes_ptr, scales_ptr, scalar, n_blocks, blocks_per_row, block_rows, rows, cols, code_bytes,
    code_stride,
    TILE: tl.constexpr, TCOLS: tl.constexpr, BLOCKS: tl.constexpr, EVEN: tl.constexpr, TWO_LEVEL: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr, FNUZ: tl.constexpr,
    NAN_CODE: tl.constexpr, ROUND: tl.constexpr, ELEM_MAX: tl.constexpr, S_FP32: tl.constexpr,
    S_MBITS: tl.constexpr, S_EMIN: tl.constexpr, S_EMAX: tl.constexpr, S_MAX_CODE: tl.constexpr,
    S_NAN_CODE: tl.constexpr, S_ONE_CODE: tl.constexpr, S_FNUZ: tl.constexpr, S_HAS_INF: tl.constexpr,
    CEIL: tl.constexpr, LEAN: tl.constexpr, S_LEAN: tl.constexpr, DIVISORS: tl.constexpr, NATIVE: tl.constexpr,
):  # fmt: skip
    """8-bit float codes of tiles of 16-bit values held as 32-bit words of two (a tile's rows of
    even length, the stream 4-byte aligned): the words are the elements of a tile half as wide;
    magnitudes split from them at the cost of a widening, the tile's amax from maxima of both
    halves at once, and each word's two codes one 16-bit store with their signs joined by one
    byte permute. Every value is prescaled where divisors may be small: a uniform branch around
    it costs registers for both arms (docs/benchmarks.md)."""
    bf16: tl.constexpr = x_ptr.dtype.element_ty == tl.int16
    block, j, _, _, word, top = load_words(
        x_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, BLOCKS, EVEN, NATIVE
    )
    divisor, bad = float_divisors(top, scalar, block, n_blocks, scales_ptr, False, TWO_LEVEL, True, BLOCKS, ELEM_MAX,
                                  S_FP32, S_MBITS, S_EMIN, S_EMAX, S_MAX_CODE, S_NAN_CODE, S_ONE_CODE, S_FNUZ,
                                  S_HAS_INF, CEIL, S_LEAN, DIVISORS)  # fmt: skip
    pair = _byte_word_codes(
        word, divisor, bad, bf16, MBITS, EMIN, EMAX, MAX_CODE, FNUZ, NAN_CODE, ROUND, LEAN, DIVISORS, NATIVE
    )
    at = block[:, None] * (code_stride // 2) + j[None, :]
    inside = (at < code_bytes // 2) & (j < code_stride // 2)[None, :]
    tl.store(codes_ptr.to(tl.pointer_type(tl.int16), bitcast=True) + at, pair.to(tl.int16), mask=inside)


@triton.jit
def _byte_word_codes(
    word, divisor, bad, BF16: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
    MAX_CODE: tl.constexpr, FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, ROUND: tl.constexpr, LEAN: tl.constexpr,
    DIVISORS: tl.constexpr, NATIVE: tl.constexpr,
):  # fmt: skip
    """The two 8-bit float codes of each word's values, low value first, as an int32 below 2**16;
    a bad tile's all NAN_CODE."""
    low = _half_code(word, False, divisor, BF16, MBITS, EMIN, EMAX, MAX_CODE, ROUND, LEAN, DIVISORS, NATIVE)
    high = _half_code(word, True, divisor, BF16, MBITS, EMIN, EMAX, MAX_CODE, ROUND, LEAN, DIVISORS, NATIVE)
    pair = byte_pair(low, high, NATIVE)
    signs = byte_signs(word, NATIVE)
    if FNUZ:  # a magnitude byte plus 0x7F reaches bit 7 exactly where it is nonzero
        signs = signs & (pair + 0x7F7F)
    pair = pair | (signs & 0x8080)
    return tl.where((bad > 0)[:, None], NAN_CODE * 0x101, pair)


@triton.jit
def _half_code(
    word, HIGH: tl.constexpr, divisor, BF16: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
    EMAX: tl.constexpr, MAX_CODE: tl.constexpr, ROUND: tl.constexpr, LEAN: tl.constexpr, DIVISORS: tl.constexpr,
    NATIVE: tl.constexpr,
):  # fmt: skip
    """Magnitude codes of the 16-bit float values in one half of the words."""
    magnitude = half_magnitudes(word, HIGH, BF16, NATIVE)
    return _half_codes(
        magnitude, word, HIGH, divisor, 8, MBITS, EMIN, EMAX, MAX_CODE, False, ROUND, LEAN, DIVISORS
    )


@triton.jit
def float_upcast_kernel(
    codes_ptr, scales_ptr, given_ptr, out_ptr, n_blocks, blocks_per_row, block_rows, rows, cols,
    code_bytes, code_stride,
    TILE: tl.constexpr, TCOLS: tl.constexpr, BLOCKS: tl.constexpr, EVEN: tl.constexpr,
    GIVEN: tl.constexpr, TWO_LEVEL: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr,
    EMIN: tl.constexpr, IS_INT: tl.constexpr, FNUZ: tl.constexpr, HAS_INF: tl.constexpr, VEC: tl.constexpr,
    WORDS: tl.constexpr, S_FP32: tl.constexpr, S_MBITS: tl.constexpr, S_EMIN: tl.constexpr, S_FNUZ: tl.constexpr,
    S_HAS_INF: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    offsets, valid, _ = tile_offsets(
        block, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, EVEN
    )
    code = load_codes(codes_ptr, block, code_bytes, code_stride, TILE, BLOCKS, BITS, VEC, WORDS)
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


@triton.jit
def given_tiles_kernel(
    x_ptr, out_ptr, divisors_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, code_bytes, code_stride,
    TILE: tl.constexpr, TCOLS: tl.constexpr, BLOCKS: tl.constexpr, EVEN: tl.constexpr, VIRTUAL: tl.constexpr,
    BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    IS_INT: tl.constexpr, FNUZ: tl.constexpr, HAS_INF: tl.constexpr, NAN_CODE: tl.constexpr, ROUND: tl.constexpr,
    LEAN: tl.constexpr, DIVISORS: tl.constexpr,
):  # fmt: skip
    """A cast under per-tile scales a caller chose, as float32 divisors (an E8M0 scale is its power
    of two): no statistics, each element rounded over its tile's divisor (a NaN divisor makes its
    tile NaN; NaN elements stay NaN one by one, as under a given scale per tensor). VIRTUAL: the
    codes' values into out_ptr; else the codes packed there."""
    block, offsets, valid, _, x = load_tiles(
        x_ptr, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, BLOCKS, EVEN
    )
    divisor = tl.load(divisors_ptr + block, mask=block < n_blocks, other=1.0)
    bad = (divisor != divisor).to(tl.int32)
    code = quotient_codes(
        x, divisor, bad, BITS, MBITS, EMIN, EMAX, MAX_CODE, IS_INT, FNUZ, NAN_CODE, ROUND, LEAN, DIVISORS
    )
    code = tl.where(x != x, NAN_CODE, code)
    if VIRTUAL:
        values = scaled_values(code, divisor, BITS, MBITS, EMIN, IS_INT, FNUZ, HAS_INF)
        tl.store(out_ptr + offsets, narrow(values, out_ptr), mask=valid)
    else:
        store_codes(out_ptr, code, block, n_blocks, code_bytes, code_stride, TILE, BLOCKS, BITS, True)
