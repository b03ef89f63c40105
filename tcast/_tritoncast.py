"""TritonCast: fused Triton kernels for tile-scaled (MX-style) and unscaled casts of <= 8-bit formats.

One pass per tensor: each program loads a run of whole tiles along the last dim, finds every
tile's amax, picks its E8M0 exponent (the scale modes of TorchCast), rounds the elements in any
round mode and writes either the fake-quantized values (virtual) or packed codes plus uint8 scale
codes (actual). The upcast kernel reads codes and scales and writes values, decoding codes by
bit arithmetic. Every operation mirrors TorchCast's arithmetic: powers of two are built from
their bits, scaling multiplies are single float32 roundings, rounding works on exact
integer/fraction splits (or, for 16-bit inputs, on a float32 addition that rounds on the
binade's grid), and contraction into FMAs is disabled, so both engines give the same bits; e4m3fn/e5m2 round-to-even of scaled tiles
uses the GPU's saturating conversion instead, which rounds the same way (checked on every finite
bf16 value). Codes are packed in registers and stored whole bytes or 32-bit words at a time.
Stochastic rounding draws Philox numbers in the kernel (keyed by a seed): reproducible, but not
TorchCast's stream.

Imported only when a Triton cast is asked for (it imports triton).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._datatype import DataType
from ._modes import RoundMode, ScaleMode
from ._number import InfNaN, NumberSpec
from ._pack import packed_nbytes
from ._tensor import Tensor

_ROUND = {RoundMode.EVEN: 0, RoundMode.NEAREST: 1, RoundMode.ZERO: 2, RoundMode.STOCHASTIC: 3}
_SCALE = {ScaleMode.MAX: 0, ScaleMode.MIDMAX: 1, ScaleMode.CEIL: 2}
_PROGRAM_BYTES = 8192  # of the float stream (input of a cast, output of an upcast) per program
_UNSCALED_TILE = 256  # unscaled casts walk the flat tensor in runs of this many elements


@triton.jit
def _pow2(k):
    """2**k as float32 for integer k in [-149, 127], built from its bits (subnormals included)."""
    normal = ((k + 127) << 23).to(tl.float32, bitcast=True)
    sub = (1 << tl.minimum(tl.maximum(k + 149, 0), 22)).to(tl.float32, bitcast=True)
    return tl.where(k >= -126, normal, sub)


@triton.jit
def _pow2_normal(k):
    """2**k for integer k in [-126, 127]: one shift (the element paths never leave that range)."""
    return ((k + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _floor_log2(a):
    """floor(log2(a)) of positive finite float32 values (subnormals included)."""
    bits = a.to(tl.int32, bitcast=True)
    field = bits >> 23
    mantissa = bits & 0x7FFFFF
    sub = ((mantissa.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127) - 149
    return tl.where(field > 0, field - 127, sub)


@triton.jit
def _round(y, noise, ROUND: tl.constexpr):
    """Non-negative float32 y < 2**23 to an integer-valued float32 in the given mode."""
    if ROUND == 0:
        # float32 addition of 2**23 rounds y to an integer, ties to even; subtracting it is exact
        # (no fast-math reassociation and no FMA contraction in these kernels)
        return (y + 8388608.0) - 8388608.0
    whole = y.to(tl.int32).to(tl.float32)  # truncation: y >= 0
    if ROUND == 2:
        return whole
    fraction = y - whole  # exact
    if ROUND == 1:  # noqa: SIM108  (constexpr branches)
        up = fraction >= 0.5
    else:
        up = noise < fraction
    return whole + up.to(tl.float32)


@triton.jit
def _grid(
    v,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    EMAX: tl.constexpr,
    IS_INT: tl.constexpr,
    BOUNDED: tl.constexpr,
):
    """(y, e): |v| = y * 2**(e - MBITS), so rounding y to an integer puts v on the element grid
    (before saturation).

    BOUNDED: tile-scaled values, below 2**(EMAX + 1) by the choice of scale, and a NaN or Inf
    among them is overwritten with its whole tile - so no clamping and no NaN cleaning here.
    """
    a = tl.abs(v)
    if not BOUNDED:
        a = tl.where(a == a, a, 0.0)  # NaN is restored by the caller
    if IS_INT:
        e = tl.zeros_like(a.to(tl.int32))
        y = a * (2.0**MBITS)
    else:
        field = a.to(tl.int32, bitcast=True) >> 23
        e = tl.maximum(field - 127, EMIN)
        if not BOUNDED:
            e = tl.minimum(e, EMAX + 1)
        y = a * _pow2_normal(MBITS - e)
    if not BOUNDED:
        y = tl.minimum(y, 2.0 ** (MBITS + 2))
    return y, e


@triton.jit
def _round_to_int(y, noise, ROUND: tl.constexpr):
    """_round as an int32. Ties to even reads the integer from the bits of y + 2**23 (one integer
    subtraction; a float-to-int conversion runs at a quarter of the ALU rate)."""
    if ROUND == 0:
        return (y + 8388608.0).to(tl.int32, bitcast=True) - 0x4B000000
    return _round(y, noise, ROUND).to(tl.int32)


@triton.jit
def _magnitude(r, e, MBITS: tl.constexpr, MAXV: tl.constexpr, IS_INT: tl.constexpr):
    """The saturated magnitude of a grid point."""
    if IS_INT:
        return tl.minimum(r, MAXV * (2.0**MBITS)) * (2.0**-MBITS)
    return tl.minimum(r * _pow2_normal(e - MBITS), MAXV)


@triton.jit
def _tile_exponent(amax, LIMIT: tl.constexpr, EMAX: tl.constexpr, SCALE_MODE: tl.constexpr):
    """The E8M0 exponent of tiles with this finite amax (TorchCast's scale modes)."""
    safe = tl.where(amax > 0.0, amax, 2.0**-126)
    exponent = _floor_log2(safe) - EMAX
    if SCALE_MODE != 0:
        half = exponent >> 1  # floor division, as TorchCast's ldexp in two steps
        threshold = (LIMIT * _pow2(half)) * _pow2(exponent - half)
        exponent = exponent + (safe > threshold).to(tl.int32)
    return tl.minimum(tl.maximum(exponent, -127), 127)


@triton.jit
def _tile_stats(x):
    """Per-tile (has a NaN or Inf, amax) of [BLOCKS, n] float32 values, from the magnitude bits:
    positive floats order as integers, and NaN/Inf patterns are the largest (the amax of such a
    tile is never used: its scale is NaN)."""
    # doubled magnitudes (the sign shifted out) order as unsigned integers: a shift runs on the FMA
    # pipe, where a mask would take the ALU pipe that bounds bf16 streams
    top = (tl.max(x.to(tl.uint32, bitcast=True) << 1, axis=1) >> 1).to(tl.int32)
    return (top >= 0x7F800000).to(tl.int32), top.to(tl.float32, bitcast=True)


@triton.jit
def _widen(raw):
    """Loaded values as float32; bfloat16 arrives as its int16 bits and widens by a shift (exact,
    where the interpreter's bf16 conversion mangles subnormals)."""
    if raw.dtype == tl.int16:
        return (raw.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return raw.to(tl.float32)


@triton.jit
def _narrow(values, out_ptr):
    """float32 values in the output's dtype. An int16 output holds bfloat16 bits, rounded to
    nearest even by integer arithmetic (launched so under the interpreter, whose bf16 conversion
    does not round to nearest even; a GPU's conversion instruction does)."""
    if out_ptr.dtype.element_ty == tl.int16:
        bits = values.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return tl.where(values != values, 0x7FC0, rounded).to(tl.int16)
    return values.to(out_ptr.dtype.element_ty)


@triton.jit
def _offsets(block, n_blocks, blocks_per_row, cols, TILE: tl.constexpr, EVEN: tl.constexpr):
    """Element offsets, mask and padded positions of every element of these tiles."""
    return _offsets_at(block, tl.arange(0, TILE), n_blocks, blocks_per_row, cols, TILE, EVEN)


@triton.jit
def _offsets_at(block, j, n_blocks, blocks_per_row, cols, TILE: tl.constexpr, EVEN: tl.constexpr):
    """Element offsets, mask and padded positions of the elements at positions j of these tiles."""
    if EVEN:  # tiles cover the rows exactly: the data is one contiguous run
        offsets = block[:, None] * TILE + j[None, :]
        valid = (block < n_blocks)[:, None] & (j < TILE)[None, :]
    else:
        row = block // blocks_per_row
        col = (block % blocks_per_row)[:, None] * TILE + j[None, :]
        offsets = row[:, None] * cols + col
        valid = (block < n_blocks)[:, None] & (col < cols)
    return offsets, valid, block[:, None] * TILE + j[None, :]


@triton.jit
def _runs_of_16(a, b, BLOCKS: tl.constexpr, TILE: tl.constexpr):
    """[BLOCKS, TILE] from two [BLOCKS, TILE / 2] halves holding elements 16m + 0..7 (a) and
    16m + 8..15 (b): joined in registers, so each thread holds 16 consecutive elements."""
    joined = tl.reshape(tl.join(a, b), (BLOCKS, TILE // 16, 8, 2))
    return tl.reshape(tl.permute(joined, (0, 1, 3, 2)), (BLOCKS, TILE))


@triton.jit
def _load_tiles(
    x_ptr, n_blocks, blocks_per_row, cols,
    TILE: tl.constexpr, BLOCKS: tl.constexpr, EVEN: tl.constexpr, RUNS16: tl.constexpr = False,
):  # fmt: skip
    """This program's tiles: (tile indices, element offsets, mask, padded positions, float32 values).
    RUNS16 (16-bit inputs, TILE >= 16): every thread holds 16 consecutive elements rather than
    the 8 of one 16-byte load - as two loads joined in registers - so 6-bit codes pack into
    three words with no exchange through shared memory, 4-bit ones into two with a smaller one
    (offsets and mask are then those of the first halves: only for callers that store no values)."""
    block = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    if RUNS16:
        i = tl.arange(0, TILE // 2)
        j = (i // 8) * 16 + i % 8
        offsets_a, valid_a, index_a = _offsets_at(block, j, n_blocks, blocks_per_row, cols, TILE, EVEN)
        offsets_b, valid_b, index_b = _offsets_at(block, j + 8, n_blocks, blocks_per_row, cols, TILE, EVEN)
        x_a = _widen(tl.load(x_ptr + offsets_a, mask=valid_a, other=0))
        x_b = _widen(tl.load(x_ptr + offsets_b, mask=valid_b, other=0))
        offsets, valid = offsets_a, valid_a  # the first halves only: the actual kernel ignores them
        index = _runs_of_16(index_a, index_b, BLOCKS, TILE)
        x = _runs_of_16(x_a, x_b, BLOCKS, TILE)
    else:
        offsets, valid, index = _offsets(block, n_blocks, blocks_per_row, cols, TILE, EVEN)
        x = _widen(tl.load(x_ptr + offsets, mask=valid, other=0))
    return block, offsets, valid, index, x


@triton.jit
def _noise(seed, index, ROUND: tl.constexpr):
    """Stochastic rounding's uniform draws, keyed by seed and padded position (none otherwise)."""
    if ROUND == 3:  # noqa: SIM108  (a constexpr branch: the noise exists only when used)
        noise = tl.rand(seed, index.to(tl.int32))
    else:
        noise = 0.0
    return noise


@triton.jit
def _virtual_kernel(
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
    _, offsets, valid, index, x = _load_tiles(x_ptr, n_blocks, blocks_per_row, cols, TILE, BLOCKS, EVEN)
    if HAS_SCALE:
        bad, amax = _tile_stats(x)
        exponent = _tile_exponent(amax, LIMIT, EMAX, SCALE_MODE)
        v = x * _pow2(-exponent)[:, None]
    else:
        v = x
    noise = _noise(seed, index, ROUND)
    if HW_FP8 != 0:
        signed = _fp8_value(_fp8_code(v, HW_FP8), HW_FP8)
    else:
        y, e = _grid(v, MBITS, EMIN, EMAX, IS_INT, HAS_SCALE)
        q = _magnitude(_round(y, noise, ROUND), e, MBITS, MAXV, IS_INT)
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
        signed = signed * tl.where(bad > 0, float("nan"), _pow2(exponent))[:, None]
    tl.store(out_ptr + offsets, _narrow(signed, out_ptr), mask=valid)


@triton.jit
def _codes(
    x,
    to_grid,
    bad,
    index,
    seed,
    HAS_SCALE: tl.constexpr,
    BITS: tl.constexpr,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    EMAX: tl.constexpr,
    MAX_CODE: tl.constexpr,
    IS_INT: tl.constexpr,
    FNUZ: tl.constexpr,
    HAS_INF: tl.constexpr,
    NAN_CODE: tl.constexpr,
    ROUND: tl.constexpr,
    HW_FP8: tl.constexpr,
    FAST: tl.constexpr,
):
    """Codes by integer arithmetic on the grid point, no decoding of floats - or, for OCP fp8
    elements rounded to nearest even (HW_FP8), by the GPU's saturating conversion instruction."""
    v = x * to_grid[:, None] if HAS_SCALE else x
    if HW_FP8 != 0:
        code = _fp8_code(v, HW_FP8).to(tl.int32)
        return tl.where((bad > 0)[:, None], NAN_CODE, code)
    if FAST:
        code = _fnuz_codes_even(x, v, to_grid, BITS, MBITS, EMIN, MAX_CODE)
        return tl.where((bad > 0)[:, None], NAN_CODE, code)
    noise = _noise(seed, index, ROUND)
    y, e = _grid(v, MBITS, EMIN, EMAX, IS_INT, HAS_SCALE)
    k = _round_to_int(y, noise, ROUND)
    if IS_INT:
        k = tl.minimum(k, MAX_CODE)
        code = tl.where(v < 0.0, -k, k) & ((1 << BITS) - 1)
    else:
        # a grid point r * 2**(e - m) with e >= emin has the code (e - emin) * 2**m + r (subnormals,
        # normals and a carry into the next binade alike); codes order as values, so saturation
        # is a min with the code of the largest value
        magnitude = tl.minimum(((e - EMIN) << MBITS) + k, MAX_CODE)
        sign = (v.to(tl.int32, bitcast=True) >> (32 - BITS)) & (1 << (BITS - 1))  # the sign bit, in place
        if FNUZ:
            sign = tl.where(magnitude > 0, sign, 0)
        code = magnitude | sign
        if HAS_INF and not HAS_SCALE:
            inf_code = (((1 << (BITS - 1 - MBITS)) - 1) << MBITS) | sign
            code = tl.where(tl.abs(v) == float("inf"), inf_code, code)
    if HAS_SCALE:  # noqa: SIM108  (constexpr branches) a NaN or Inf anywhere in a tile: the whole tile is NaN
        code = tl.where((bad > 0)[:, None], NAN_CODE, code)
    else:
        code = tl.where(v != v, NAN_CODE, code)
    return code


@triton.jit
def _fnuz_codes_even(
    x, v, to_grid,
    BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, MAX_CODE: tl.constexpr,
):  # fmt: skip
    """Codes of tile-scaled values in an fnuz float format, rounded to nearest even, in few ALU
    operations (the ALU pipe bounds a bf16 stream): adding 2**(e + 23 - m) rounds |v| on its
    binade's grid (e clamped at emin, so subnormals too) and leaves the count of grid steps in
    the low bits; the sign joins only nonzero magnitudes (fnuz has no -0) through an unsigned
    min with magnitude << (bits - 1), which is below the shifted sign field only when zero.
    `v` is x * to_grid: its sign is read from it, since read from x the compiler goes back to a
    16-bit input and spends an operation extracting it; |x| * to_grid folds the abs into the
    multiply. A NaN or Inf tile is left to the caller."""
    a = tl.abs(x) * to_grid[:, None]
    field = tl.maximum(a.to(tl.int32, bitcast=True) >> 23, EMIN + 127)
    magic = (field + (23 - MBITS)) << 23
    steps = (a + magic.to(tl.float32, bitcast=True)).to(tl.int32, bitcast=True) - magic
    code = tl.minimum(((field - (EMIN + 127)) << MBITS) + steps, MAX_CODE)
    sign_field = (v.to(tl.uint32, bitcast=True) >> (32 - BITS)).to(tl.int32)
    return code | (tl.minimum(sign_field, code << (BITS - 1)) & (1 << (BITS - 1)))


@triton.jit
def _fp8_code(v, HW_FP8: tl.constexpr):
    """float32 -> e4m3fn (1) or e5m2 (2) bits, round to nearest even, saturating to the largest
    finite value (cvt.rn.satfinite on sm_89 and later): TorchCast's rounding of in-range scaled
    values."""
    if HW_FP8 == 1:
        code = v.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    else:
        code = v.to(tl.float8e5, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    return code


@triton.jit
def _fp8_value(code, HW_FP8: tl.constexpr):
    if HW_FP8 == 1:
        value = code.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        value = code.to(tl.float8e5, bitcast=True).to(tl.float32)
    return value


@triton.jit
def _split4(t):
    """The four parts of a [.., 2, 2] tensor, in flat order of its last two dims."""
    low, high = tl.split(t)
    e0, e2 = tl.split(low)
    e1, e3 = tl.split(high)
    return e0, e1, e2, e3


@triton.jit
def _store_codes(
    codes_ptr, code, block, n_blocks, code_bytes,
    TILE: tl.constexpr, BLOCKS: tl.constexpr, BITS: tl.constexpr, WORDS: tl.constexpr,
):  # fmt: skip
    """Pack [BLOCKS, TILE] codes little-endian, low bits first: neighbours are split apart in
    registers and OR-ed, so the loads and stores stay contiguous. WORDS: whole tiles (of at least
    8 codes, 16 for 6 bits) end on 32-bit boundaries, so they are stored a word at a time."""
    if BITS == 8:
        offsets = block[:, None] * TILE + tl.arange(0, TILE)[None, :]
        tl.store(codes_ptr + offsets, code.to(tl.uint8), mask=offsets < code_bytes)
    elif BITS == 4 and WORDS:  # eight codes to a 32-bit word
        low, high = tl.split(tl.reshape(code, (BLOCKS, TILE // 8, 2, 2, 2)))  # codes 2i and 2i + 1
        c0, c2, c4, c6 = _split4(low)
        c1, c3, c5, c7 = _split4(high)
        word = c0 | (c1 << 4) | (c2 << 8) | (c3 << 12) | (c4 << 16) | (c5 << 20) | (c6 << 24) | (c7 << 28)
        words = codes_ptr.to(tl.pointer_type(tl.int32))
        offsets = block[:, None] * (TILE // 8) + tl.arange(0, TILE // 8)[None, :]
        tl.store(words + offsets, word, mask=(block < n_blocks)[:, None])
    elif BITS == 4:
        even, odd = tl.split(tl.reshape(code, (BLOCKS, TILE // 2, 2)))
        offsets = block[:, None] * (TILE // 2) + tl.arange(0, TILE // 2)[None, :]
        tl.store(codes_ptr + offsets, (even | (odd << 4)).to(tl.uint8), mask=offsets < code_bytes)
    elif TILE >= 16 and WORDS:  # 6 bits, sixteen codes in three little-endian 32-bit words
        parts = _split4(tl.reshape(code, (BLOCKS, TILE // 16, 2, 2, 2, 2)))  # codes 4m + j, j = 0..3
        c0, c4, c8, c12 = _split4(parts[0])
        c1, c5, c9, c13 = _split4(parts[1])
        c2, c6, c10, c14 = _split4(parts[2])
        c3, c7, c11, c15 = _split4(parts[3])
        w0 = c0 | (c1 << 6) | (c2 << 12) | (c3 << 18) | (c4 << 24) | (c5 << 30)
        w1 = (c5 >> 2) | (c6 << 4) | (c7 << 10) | (c8 << 16) | (c9 << 22) | (c10 << 28)
        w2 = (c10 >> 4) | (c11 << 2) | (c12 << 8) | (c13 << 14) | (c14 << 20) | (c15 << 26)
        # flat: a [BLOCKS * TILE / 16] layout is the one the stores are given (no exchange)
        n: tl.constexpr = BLOCKS * TILE // 16
        words = codes_ptr.to(tl.pointer_type(tl.int32))
        group = tl.reshape(block[:, None] * (TILE // 16) + tl.arange(0, TILE // 16)[None, :], (n,))
        inside = group < n_blocks * (TILE // 16)
        tl.store(words + group * 3, tl.reshape(w0, (n,)), mask=inside)
        tl.store(words + group * 3 + 1, tl.reshape(w1, (n,)), mask=inside)
        tl.store(words + group * 3 + 2, tl.reshape(w2, (n,)), mask=inside)
    else:  # 6 bits: four codes in three bytes
        first, second = tl.split(tl.reshape(code, (BLOCKS, TILE // 4, 2, 2)))
        c0, c2 = tl.split(first)
        c1, c3 = tl.split(second)
        base = block[:, None] * (TILE // 4 * 3) + tl.arange(0, TILE // 4)[None, :] * 3
        tl.store(codes_ptr + base, ((c0 | (c1 << 6)) & 0xFF).to(tl.uint8), mask=base < code_bytes)
        tl.store(
            codes_ptr + base + 1, (((c1 >> 2) | (c2 << 4)) & 0xFF).to(tl.uint8), mask=base + 1 < code_bytes
        )
        tl.store(codes_ptr + base + 2, ((c2 >> 4) | (c3 << 2)).to(tl.uint8), mask=base + 2 < code_bytes)


@triton.jit
def _actual_kernel(
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
    block, _, _, index, x = _load_tiles(x_ptr, n_blocks, blocks_per_row, cols, TILE, BLOCKS, EVEN, RUNS16)
    if HAS_SCALE:
        bad, amax = _tile_stats(x)
        exponent = _tile_exponent(amax, LIMIT, EMAX, SCALE_MODE)
        to_grid = _pow2(-exponent)
        tl.store(
            scales_ptr + block, tl.where(bad > 0, 255, exponent + 127).to(tl.uint8), mask=block < n_blocks
        )
    else:
        bad = 0
        to_grid = 1.0
    code = _codes(x, to_grid, bad, index, seed, HAS_SCALE, BITS, MBITS, EMIN, EMAX, MAX_CODE, IS_INT, FNUZ,
                  HAS_INF, NAN_CODE, ROUND, HW_FP8, FAST)  # fmt: skip
    _store_codes(codes_ptr, code, block, n_blocks, code_bytes, TILE, BLOCKS, BITS, HAS_SCALE)


@triton.jit
def _load_codes(
    codes_ptr,
    block,
    code_bytes,
    TILE: tl.constexpr,
    BLOCKS: tl.constexpr,
    BITS: tl.constexpr,
    VEC: tl.constexpr,
):
    """[BLOCKS, TILE] int32 codes. 8- and 4-bit codes are loaded VEC per thread (as many as one
    16-byte store of the output holds), so loads and stores share a layout and need no exchange
    through shared memory."""
    if BITS == 8:
        j = tl.arange(0, TILE)
        offsets = block[:, None] * TILE + ((j // VEC) * VEC + j % VEC)[None, :]
        return tl.load(codes_ptr + offsets, mask=offsets < code_bytes, other=0).to(tl.int32)
    elif BITS == 4:
        j = tl.arange(0, TILE // 2)
        offsets = block[:, None] * (TILE // 2) + ((j // (VEC // 2)) * (VEC // 2) + j % (VEC // 2))[None, :]
        byte = tl.load(codes_ptr + offsets, mask=offsets < code_bytes, other=0).to(tl.int32)
        return tl.reshape(tl.join(byte & 15, byte >> 4), (BLOCKS, TILE))
    else:
        base = block[:, None] * (TILE // 4 * 3) + tl.arange(0, TILE // 4)[None, :] * 3
        b0 = tl.load(codes_ptr + base, mask=base < code_bytes, other=0).to(tl.int32)
        b1 = tl.load(codes_ptr + base + 1, mask=base + 1 < code_bytes, other=0).to(tl.int32)
        b2 = tl.load(codes_ptr + base + 2, mask=base + 2 < code_bytes, other=0).to(tl.int32)
        c0 = b0 & 63
        c1 = (b0 >> 6) | ((b1 & 15) << 2)
        c2 = (b1 >> 4) | ((b2 & 3) << 4)
        c3 = b2 >> 2
        return tl.reshape(tl.join(tl.join(c0, c2), tl.join(c1, c3)), (BLOCKS, TILE))


@triton.jit
def _decode(
    code, BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, IS_INT: tl.constexpr,
    FNUZ: tl.constexpr, HAS_INF: tl.constexpr,
):  # fmt: skip
    """float32 values of int32 codes by bit arithmetic (no table gather). Floats: the magnitude
    field shifted into float32's place reads as 2**(1 - emin - 127) times the value - a float32
    subnormal exactly where the code is one - so one multiply restores it; the sign bit is moved
    to bit 31. Ints: two's complement codes through the 2**23 float trick, times 2**-mbits."""
    SIGN: tl.constexpr = 1 << (BITS - 1)
    if BITS == 8 and MBITS == 2 and EMIN == -14 and HAS_INF:  # e5m2 is the top byte of a float16
        return (code << 8).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    if IS_INT:
        biased = ((code ^ SIGN) | 0x4B000000).to(tl.float32, bitcast=True)  # 2**23 + SIGN + signed code
        values = (biased - (8388608.0 + SIGN)) * (2.0**-MBITS)
        return tl.where(code == SIGN, float("nan"), values)
    magnitude = code & (SIGN - 1)
    bits = (magnitude << (23 - MBITS)) | ((code << (32 - BITS)) & -2147483648)
    values = bits.to(tl.float32, bitcast=True) * (2.0 ** (126 + EMIN))
    if FNUZ:
        values = tl.where(code == SIGN, float("nan"), values)
    elif HAS_INF:
        top: tl.constexpr = ((1 << (BITS - 1 - MBITS)) - 1) << MBITS  # the code of +inf
        infinity = tl.where((code & SIGN) != 0, float("-inf"), float("inf"))
        values = tl.where(magnitude >= top, tl.where(magnitude == top, infinity, float("nan")), values)
    else:  # fn: the all-ones magnitude is NaN
        values = tl.where(magnitude == SIGN - 1, float("nan"), values)
    return values


@triton.jit
def _upcast_kernel(
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
    offsets, valid, _ = _offsets(block, n_blocks, blocks_per_row, cols, TILE, EVEN)
    code = _load_codes(codes_ptr, block, code_bytes, TILE, BLOCKS, BITS, VEC)
    if DECODE:  # noqa: SIM108  (constexpr branches)
        values = _decode(code, BITS, MBITS, EMIN, IS_INT, FNUZ, HAS_INF)
    else:
        values = tl.load(table_ptr + code)
    if HAS_SCALE:
        scale_code = tl.load(scales_ptr + block, mask=block < n_blocks, other=127).to(tl.int32)
        # the NaN scale code multiplies its tile by NaN: one select per tile, not per element
        values = values * tl.where(scale_code == 255, float("nan"), _pow2(scale_code - 127))[:, None]
    tl.store(out_ptr + offsets, _narrow(values, out_ptr), mask=valid)


# ----- launching ---------------------------------------------------------------------------------


def _geometry(shape: tuple[int, ...], dtype: DataType) -> tuple[int, int, int, int]:
    """(tile, blocks per row, cols, blocks): tiles along the last dim, or the flat tensor in runs."""
    numel = 1
    for d in shape:
        numel *= d
    if dtype.sspec is None:
        tile = _UNSCALED_TILE
        blocks = -(-numel // tile)
        return tile, blocks, numel, blocks
    tile = dtype.sspec.tiles[0].size
    cols = shape[-1] if shape else 1
    per_row = -(-cols // tile)
    rows = numel // cols if cols else 0
    return tile, per_row, cols, rows * per_row


def _max_code(nspec: NumberSpec) -> int:
    """Integer formats: the largest multiple of the step; floats: the code of the largest value."""
    if nspec.is_int:
        return round(nspec.max * 2**nspec.mbits)
    from ._torchcast import encode

    return int(encode(torch.tensor([nspec.max], dtype=torch.float32), nspec)[0])


@functools.lru_cache(maxsize=128)
def _format_params(nspec: NumberSpec) -> dict[str, object]:
    """The constants every kernel takes of an element format (the upcast's decoding needs no more)."""
    return {
        "MBITS": nspec.mbits,
        "EMIN": nspec.emin,
        "IS_INT": nspec.is_int,
        "FNUZ": nspec.infnan is InfNaN.FNUZ,
        "HAS_INF": nspec.has_inf,
    }


@functools.lru_cache(maxsize=128)
def _element_params(nspec: NumberSpec, virtual: bool) -> dict[str, object]:
    """Kernel constants of an element format for a cast (cached: encoding the max value costs
    torch ops)."""
    from ._torchcast import _nan_code

    params = _format_params(nspec) | {"EMAX": nspec.emax}
    if virtual:  # saturation on values; the actual kernel saturates codes
        params["MAXV"] = float(nspec.max)
    else:
        params |= {"BITS": nspec.bits, "MAX_CODE": _max_code(nspec), "NAN_CODE": _nan_code(nspec)}
    return params


def _as_bits(t: torch.Tensor, loading: bool = False) -> torch.Tensor:
    """bfloat16 tensors travel as int16 bits: always when loaded (the kernels widen them by a
    shift), and when stored only under the interpreter (see _narrow)."""
    from ._engine import interpreting

    if t.dtype is torch.bfloat16 and (loading or interpreting()):
        return t.view(torch.int16)
    return t


def _hardware_fp8(nspec: NumberSpec, roundmode: RoundMode, has_scale: bool, device: torch.device) -> int:
    """1 (e4m3fn) or 2 (e5m2) where the GPU's fp8 conversion gives TorchCast's codes: round to
    nearest even of tile-scaled values (in range, so saturation is all that overflow needs; a
    NaN or Inf anywhere makes the tile NaN) on sm_89 or later; else 0 (integer arithmetic).
    Never under the interpreter, whose fp8 conversion is not the hardware's."""
    from ._engine import interpreting

    if not has_scale or roundmode is not RoundMode.EVEN or device.type != "cuda" or interpreting():
        return 0
    if _capability(device.index if device.index is not None else torch.cuda.current_device()) < (8, 9):
        return 0
    return {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}.get(nspec.torch_dtype, 0)


@functools.lru_cache(maxsize=16)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@dataclass(frozen=True)
class LaunchConfig:
    """Elements one program handles and its warps (tuned on an H100: see docs/benchmarks.md).
    elements None: 8 KiB of the float stream, 4,096 16-bit or 2,048 float32 values (with 4,096
    float32 values ptxas hoists the loads into 116 registers and fp32 -> fp6/fp4 lost 14%)."""

    elements: int | None = None
    num_warps: int = 4

    def blocks(self, tile: int, element_size: int) -> int:
        elements = self.elements or _PROGRAM_BYTES // element_size
        return max(1, elements // tile)


def cast(
    x: torch.Tensor,
    dtype: DataType,
    roundmode: RoundMode,
    scalemode: ScaleMode,
    seed: int,
    virtual: bool,
    out_dtype: torch.dtype | None = None,
    config: LaunchConfig = LaunchConfig(),
) -> torch.Tensor | Tensor:
    """The Triton cast (the caller has checked `supports`)."""
    nspec = dtype.nspec
    x = x.contiguous()
    shape = tuple(x.shape)
    tile, per_row, cols, blocks = _geometry(shape, dtype)
    has_scale = dtype.sspec is not None
    numel_padded = blocks * tile if has_scale else x.numel()
    code_bytes = packed_nbytes(numel_padded, nspec.bits)
    out_size = out_dtype.itemsize if virtual and out_dtype is not None else x.element_size()
    per_program = config.blocks(tile, max(x.element_size(), out_size))
    grid = (triton.cdiv(blocks, per_program),)
    common = {
        "TILE": tile, "BLOCKS": per_program, "HAS_SCALE": has_scale, "EVEN": has_scale and cols % tile == 0,
        "ROUND": _ROUND[roundmode], "num_warps": config.num_warps, "enable_fp_fusion": False,
    } | _element_params(nspec, virtual)  # fmt: skip
    if has_scale:
        limit = nspec.midmax if scalemode is ScaleMode.MIDMAX else nspec.max
        common |= {"LIMIT": float(limit), "SCALE_MODE": _SCALE[scalemode]}
    else:
        common |= {"LIMIT": 0.0, "SCALE_MODE": 0}
    common["HW_FP8"] = _hardware_fp8(nspec, roundmode, has_scale, x.device)
    source = _as_bits(x, loading=True)
    if virtual:
        out = torch.empty(shape, dtype=out_dtype or x.dtype, device=x.device)
        if blocks:
            _virtual_kernel[grid](source, _as_bits(out), blocks, per_row, cols, seed, **common)
        return out
    codes = torch.empty(code_bytes, dtype=torch.uint8, device=x.device)
    scales = torch.empty(blocks if has_scale else 0, dtype=torch.uint8, device=x.device)
    fast = (
        has_scale and x.element_size() == 2 and roundmode is RoundMode.EVEN
        and nspec.infnan is InfNaN.FNUZ and not nspec.is_int
    )  # fmt: skip
    # 4- and 6-bit codes of 16-bit inputs pack into words from 16-element runs per thread
    runs16 = nspec.bits in (4, 6) and x.element_size() == 2 and has_scale and tile >= 16
    if blocks:
        _actual_kernel[grid](
            source, codes, scales, blocks, per_row, cols, code_bytes, seed, FAST=fast, RUNS16=runs16, **common
        )
    return Tensor(
        dtype=dtype,
        shape=shape,
        source_dtype=x.dtype,
        codes=codes,
        scales=scales if has_scale else None,
        zeros=None,
        numel_padded=numel_padded,
    )


def upcast(
    t: Tensor, torch_dtype: torch.dtype | None = None, config: LaunchConfig = LaunchConfig()
) -> torch.Tensor:
    from ._torchcast import _decode_table_cpu

    nspec = t.dtype.nspec
    device = t.codes.device
    tile, per_row, cols, blocks = _geometry(t.shape, t.dtype)
    has_scale = t.scales is not None
    # codes decode by arithmetic where 2**(126 + emin) is a float32; else gather from a value table
    decode = nspec.is_int or nspec.emin <= 1
    table = t.codes if decode else _decode_table_cpu(nspec.code).to(device=device, dtype=torch.float32)
    out = torch.empty(t.shape, dtype=torch_dtype or t.source_dtype, device=device)
    per_program = config.blocks(tile, out.element_size())
    if blocks:
        _upcast_kernel[(triton.cdiv(blocks, per_program),)](
            t.codes, t.scales if has_scale else t.codes, table, _as_bits(out), blocks, per_row, cols,
            t.codes.numel(), TILE=tile, BLOCKS=per_program, HAS_SCALE=has_scale,
            EVEN=has_scale and cols % tile == 0, BITS=nspec.bits, DECODE=decode,
            VEC=min(tile, 16 // out.element_size()), num_warps=config.num_warps, enable_fp_fusion=False,
            **_format_params(nspec),
        )  # fmt: skip
    return out
