"""Element math inside the kernels: rounding, grids, codes, tile exponents, fp8, decoding.

Every function mirrors TorchCast's arithmetic (powers of two built from their bits, scaling
multiplies as single float32 roundings, rounding on exact integer/fraction splits), so both
engines give the same bits.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def pow2(k):
    """2**k as float32 for integer k in [-149, 127], built from its bits (subnormals included)."""
    normal = ((k + 127) << 23).to(tl.float32, bitcast=True)
    sub = (1 << tl.minimum(tl.maximum(k + 149, 0), 22)).to(tl.float32, bitcast=True)
    return tl.where(k >= -126, normal, sub)


@triton.jit
def pow2_normal(k):
    """2**k for integer k in [-126, 127]: one shift (the element paths never leave that range)."""
    return ((k + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def floor_log2(a):
    """floor(log2(a)) of positive finite float32 values (subnormals included)."""
    bits = a.to(tl.int32, bitcast=True)
    field = bits >> 23
    mantissa = bits & 0x7FFFFF
    sub = ((mantissa.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127) - 149
    return tl.where(field > 0, field - 127, sub)


@triton.jit
def round_values(y, noise, ROUND: tl.constexpr):
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
def grid_values(
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
        y = a * pow2_normal(MBITS - e)
    if not BOUNDED:
        y = tl.minimum(y, 2.0 ** (MBITS + 2))
    return y, e


@triton.jit
def round_to_int(y, noise, ROUND: tl.constexpr):
    """round_values as an int32. Ties to even reads the integer from the bits of y + 2**23 (one integer
    subtraction; a float-to-int conversion runs at a quarter of the ALU rate)."""
    if ROUND == 0:
        return (y + 8388608.0).to(tl.int32, bitcast=True) - 0x4B000000
    return round_values(y, noise, ROUND).to(tl.int32)


@triton.jit
def grid_magnitude(r, e, MBITS: tl.constexpr, MAXV: tl.constexpr, IS_INT: tl.constexpr):
    """The saturated magnitude of a grid point."""
    if IS_INT:
        return tl.minimum(r, MAXV * (2.0**MBITS)) * (2.0**-MBITS)
    return tl.minimum(r * pow2_normal(e - MBITS), MAXV)


@triton.jit
def tile_exponent(amax, LIMIT: tl.constexpr, EMAX: tl.constexpr, SCALE_MODE: tl.constexpr):
    """The E8M0 exponent of tiles with this finite amax (TorchCast's scale modes; EVEN, 3, steps
    up at its limit, the others above it)."""
    safe = tl.where(amax > 0.0, amax, 2.0**-126)
    exponent = floor_log2(safe) - EMAX
    if SCALE_MODE != 0:
        half = exponent >> 1  # floor division, as TorchCast's ldexp in two steps
        threshold = (LIMIT * pow2(half)) * pow2(exponent - half)
        if SCALE_MODE == 3:
            exponent = exponent + (safe >= threshold).to(tl.int32)
        else:
            exponent = exponent + (safe > threshold).to(tl.int32)
    return tl.minimum(tl.maximum(exponent, -127), 127)


@triton.jit
def tile_top(x):
    """Per tile of [BLOCKS, n] float32 values, the bits of the largest magnitude: positive floats
    order as integers, and NaN/Inf patterns are the largest."""
    # doubled magnitudes (the sign shifted out) order as unsigned integers: a shift runs on the FMA
    # pipe, where a mask would take the ALU pipe that bounds bf16 streams
    return (tl.max(x.to(tl.uint32, bitcast=True) << 1, axis=1) >> 1).to(tl.int32)


@triton.jit
def top_stats(top):
    """(has a NaN or Inf, amax) of tiles from their largest magnitude's bits (the amax of a tile
    with a NaN or Inf is never used: its scale is NaN)."""
    return (top >= 0x7F800000).to(tl.int32), top.to(tl.float32, bitcast=True)


@triton.jit
def tile_stats(x):
    """Per-tile (has a NaN or Inf, amax) of [BLOCKS, n] float32 values."""
    return top_stats(tile_top(x))


@triton.jit
def draw_noise(seed, index, ROUND: tl.constexpr):
    """Stochastic rounding's uniform draws, keyed by seed and padded position (none otherwise)."""
    if ROUND == 3:  # noqa: SIM108  (a constexpr branch: the noise exists only when used)
        noise = tl.rand(seed, index.to(tl.int32))
    else:
        noise = 0.0
    return noise


@triton.jit
def grid_code(k, e, MBITS: tl.constexpr, EMIN: tl.constexpr, MAX_CODE: tl.constexpr, IS_INT: tl.constexpr):
    """The saturated magnitude code of k grid steps at binade e. A float grid point r * 2**(e - m)
    with e >= emin has the code (e - emin) * 2**m + r (subnormals, normals and a carry into the
    next binade alike); codes order as values, so saturation is a min with the largest one."""
    if IS_INT:  # noqa: SIM108  (constexpr branches)
        code = tl.minimum(k, MAX_CODE)
    else:
        code = tl.minimum(((e - EMIN) << MBITS) + k, MAX_CODE)
    return code


@triton.jit
def sign_bit(v, BITS: tl.constexpr):
    """The sign of float32 v as the top bit of a BITS-wide code."""
    return (v.to(tl.int32, bitcast=True) >> (32 - BITS)) & (1 << (BITS - 1))


@triton.jit
def signed_code(magnitude, v, BITS: tl.constexpr, IS_INT: tl.constexpr, FNUZ: tl.constexpr):
    """The code of a magnitude code with v's sign: two's complement for ints, a sign bit for
    floats (none on zero for fnuz formats, which have no -0)."""
    if IS_INT or FNUZ:
        negative = (v.to(tl.uint32, bitcast=True) >> 31).to(tl.int32)
        code = negated_code(magnitude, negative, BITS, IS_INT, FNUZ)
    else:
        code = magnitude | sign_bit(v, BITS)
    return code


@triton.jit
def negated_code(magnitude, negative, BITS: tl.constexpr, IS_INT: tl.constexpr, FNUZ: tl.constexpr):
    """signed_code from a 0/1 `negative` rather than a value."""
    SIGN: tl.constexpr = 1 << (BITS - 1)
    if IS_INT:
        return tl.where(negative != 0, -magnitude, magnitude) & ((1 << BITS) - 1)
    if FNUZ:
        # magnitude + SIGN - 1 reaches the sign bit exactly when the magnitude is nonzero: one
        # multiply-add (FMA pipe) and one logic operation, no compare and select
        return magnitude | ((magnitude + negative * (SIGN - 1)) & SIGN)
    return magnitude | (negative << (BITS - 1))


@triton.jit
def element_codes(
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
    FP8_GRID: tl.constexpr,
    FP8_SHIFT: tl.constexpr,
):
    """Codes by integer arithmetic on the grid point, no decoding of floats - or, for OCP fp8
    elements rounded to nearest even (HW_FP8), by the GPU's saturating conversion instruction, and
    for 6-bit fnuz floats so rounded (FP8_GRID) by that conversion on the fp8 grid theirs is a part
    of, moved there by FP8_SHIFT."""
    v = x * to_grid[:, None] if HAS_SCALE else x
    if HW_FP8 != 0:
        code = fp8_code(v, HW_FP8).to(tl.int32)
        return tl.where((bad > 0)[:, None], NAN_CODE, code)
    if FP8_GRID != 0:  # the shift is exact but where the value rounds to zero either way
        code = fnuz6_codes_by_fp8(v * FP8_SHIFT, FP8_GRID)
        return tl.where((bad > 0)[:, None], NAN_CODE, code)
    if FAST:
        code = fnuz_codes_even(x, v, to_grid, BITS, MBITS, EMIN, MAX_CODE)
        return tl.where((bad > 0)[:, None], NAN_CODE, code)
    noise = draw_noise(seed, index, ROUND)
    y, e = grid_values(v, MBITS, EMIN, EMAX, IS_INT, HAS_SCALE)
    k = round_to_int(y, noise, ROUND)
    code = signed_code(grid_code(k, e, MBITS, EMIN, MAX_CODE, IS_INT), v, BITS, IS_INT, FNUZ)
    if HAS_INF and not HAS_SCALE and not IS_INT:
        inf_code = (((1 << (BITS - 1 - MBITS)) - 1) << MBITS) | sign_bit(v, BITS)
        code = tl.where(tl.abs(v) == float("inf"), inf_code, code)
    if HAS_SCALE:  # noqa: SIM108  (constexpr branches) a NaN or Inf anywhere in a tile: the whole tile is NaN
        code = tl.where((bad > 0)[:, None], NAN_CODE, code)
    else:
        code = tl.where(v != v, NAN_CODE, code)
    return code


@triton.jit
def fnuz_codes_even(
    x, v, to_grid,
    BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, MAX_CODE: tl.constexpr,
):  # fmt: skip
    """Codes of tile-scaled values in an fnuz float format, rounded to nearest even, in few ALU
    operations (the ALU pipe bounds a bf16 stream): even_magnitudes, and the sign joins only
    nonzero magnitudes (fnuz has no -0) through an unsigned min with magnitude << (bits - 1),
    which is below the shifted sign field only when zero. `v` is x * to_grid: its sign is read
    from it, since read from x the compiler goes back to a 16-bit input and spends an operation
    extracting it; |x| * to_grid folds the abs into the multiply. A NaN or Inf tile is left to
    the caller."""
    code = even_magnitudes(tl.abs(x) * to_grid[:, None], MBITS, EMIN, MAX_CODE, False)
    sign_field = (v.to(tl.uint32, bitcast=True) >> (32 - BITS)).to(tl.int32)
    return code | (tl.minimum(sign_field, code << (BITS - 1)) & (1 << (BITS - 1)))


# Two values' 6-bit fnuz codes (magnitude at most 31, the sign 0x20 on nonzero magnitudes only)
# from their fp8 codes: cvt gives both bytes; a permute puts each in a 16-bit half, where one
# 16x2 min saturates both; magnitude + 31 reaches bit 5 exactly when the magnitude is nonzero, so
# it gates the sign (0x80 >> 2); each half is then one code.
_FNUZ6_FROM_FP8 = (
    "{{ .reg .b16 h; .reg .b32 w, c, m, t, k; cvt.rn.satfinite.{}x2.f32 h, $3, $2; cvt.u32.u16 w, h; "
    "prmt.b32 c, w, 0, 0x4140; and.b32 m, c, 0x007F007F; mov.b32 k, 0x001F001F; min.u16x2 m, m, k; "
    "add.u32 t, m, 0x001F001F; shr.b32 c, c, 2; and.b32 c, c, t; and.b32 c, c, 0x00200020; "
    "or.b32 m, m, c; and.b32 $0, m, 0xFFFF; shr.u32 $1, m, 16; }}"
)
_FNUZ6_FROM_E4M3: tl.constexpr = tl.constexpr(_FNUZ6_FROM_FP8.format("e4m3"))
_FNUZ6_FROM_E5M2: tl.constexpr = tl.constexpr(_FNUZ6_FROM_FP8.format("e5m2"))


@triton.jit
def fnuz6_codes_by_fp8(a, FP8_GRID: tl.constexpr):
    """6-bit fnuz float codes, rounded to nearest even, of values `a` already moved onto the grid
    of e4m3 (FP8_GRID 1: e2m3's mantissa width) or e5m2 (2: e3m2's). Below the 6-bit maximum the
    narrow grid is a part of the fp8 one, subnormals included, and the magnitude codes are the
    same (the binade above the smallest times 2**m, plus the steps); so the GPU's saturating
    conversion of two values an instruction (with the halfword min: sm_90 and later) gives both
    codes in a few logic operations (`_FNUZ6_FROM_FP8`) where the integer path spends about ten a
    value: the ALU pipe bounds these casts."""
    if FP8_GRID == 1:
        code = tl.inline_asm_elementwise(
            _FNUZ6_FROM_E4M3, "=r,=r,r,r", [a], dtype=tl.int32, is_pure=True, pack=2
        )
    else:
        code = tl.inline_asm_elementwise(
            _FNUZ6_FROM_E5M2, "=r,=r,r,r", [a], dtype=tl.int32, is_pure=True, pack=2
        )
    return code


# 4-bit codes of two bfloat16 values a word, in bfloat16x2 arithmetic (sm_90): |x| times the tile's
# power of two (exact), then even_magnitudes' magic-number rounding on each 16-bit half - the
# exponent field clamped at emin by one halfword max, the magic's bits the field plus the step's
# offset, one packed add rounding both halves to nearest even, its bits less the magic's the steps.
# No half carries into the other: every sum stays below 2**16 and every difference at least 0.
# $2: the scale's bfloat16 bits in both halves; $3: the emin field; $4: the magic's offset; $5:
# the largest code; $6: the field's shift onto the code's exponent bits (floats).
_BF16X2_FLOAT_CODES: tl.constexpr = tl.constexpr(
    "{ .reg .b32 m, f, g, s; and.b32 m, $1, 0x7FFF7FFF; mul.rn.bf16x2 m, m, $2; and.b32 f, m, 0x7F807F80; "
    "max.u16x2 f, f, $3; add.u32 g, f, $4; add.rn.bf16x2 s, m, g; sub.u32 s, s, g; sub.u32 f, f, $3; "
    "shr.u32 f, f, $6; add.u32 f, f, s; min.u16x2 $0, f, $5; }"
)
# ints: the magic 2**(7 - mbits) ($3, its bits in both halves) rounds onto multiples of 2**-mbits;
# $4: the largest code; a negative value's code is 16 - magnitude, masked to its nibble.
_BF16X2_INT_CODES: tl.constexpr = tl.constexpr(
    "{ .reg .b32 m, s, n; and.b32 m, $1, 0x7FFF7FFF; mul.rn.bf16x2 m, m, $2; add.rn.bf16x2 m, m, $3; "
    "sub.u32 m, m, $3; min.u16x2 m, m, $4; shr.u32 s, $1, 15; and.b32 s, s, 0x00010001; "
    "mul.lo.u32 n, s, 15; xor.b32 m, m, n; add.u32 m, m, s; and.b32 $0, m, 0x000F000F; }"
)


@triton.jit
def bf16_pair_codes(
    word, to_grid, MBITS: tl.constexpr, EMIN: tl.constexpr, MAX_CODE: tl.constexpr, IS_INT: tl.constexpr
):  # fmt: skip
    """4-bit codes rounded to nearest even of [BLOCKS, n] int32 words of two bfloat16 values, in
    the halves of int32 words (the low value's code in bits 0-3, the high one's in 16-19): float
    elements' magnitudes (their signs join when packed), ints' two's complement codes. `to_grid`:
    each tile's power of two. The float32 path (`even_magnitudes` on widened values) spends about
    ten ALU operations a value; this about five, two values an instruction (sm_90: bf16x2
    arithmetic, halfword min/max). Exact where bfloat16 holds every product the codes tell apart
    (`_launch._bf16_halves`)."""
    half_bits = to_grid.to(tl.int32, bitcast=True) >> 16
    scale = tl.broadcast_to((half_bits | (half_bits << 16))[:, None], word.shape)
    both: tl.constexpr = 0x10001
    largest = tl.full(word.shape, MAX_CODE * both, tl.int32)
    if IS_INT:
        magic = tl.full(word.shape, ((127 + 7 - MBITS) << 7) * both, tl.int32)
        code = tl.inline_asm_elementwise(
            _BF16X2_INT_CODES, "=r,r,r,r,r", [word, scale, magic, largest], dtype=tl.int32,
            is_pure=True, pack=1,
        )  # fmt: skip
    else:
        emin_field = tl.full(word.shape, ((EMIN + 127) << 7) * both, tl.int32)
        offset = tl.full(word.shape, ((7 - MBITS) << 7) * both, tl.int32)
        shift = tl.full(word.shape, 7 - MBITS, tl.int32)
        code = tl.inline_asm_elementwise(
            _BF16X2_FLOAT_CODES, "=r,r,r,r,r,r,r", [word, scale, emin_field, offset, largest, shift],
            dtype=tl.int32, is_pure=True, pack=1,
        )  # fmt: skip
    return code


# A virtual cast's values of two bfloat16 values a word (sm_90): the same scaling and magic-number
# rounding as _BF16X2_FLOAT_CODES, then the magic subtracted back (exact: the sum lies within twice
# the magic), a halfword min with the largest value, the sign joined (fnuz: only to nonzero values,
# which are exactly those whose half plus 0x7FFF reaches bit 15), and one multiply by the tile's
# power of two, NaN for a tile holding a NaN or Inf. $2: the scale onto the grid in both halves;
# $3: the emin field; $4: the magic's offset; $5: the largest value; $6: the scale back; $7: the
# sign mask (0x80008000) or 0 where signs join whatever the value.
_BF16X2_FLOAT_VALUES: tl.constexpr = tl.constexpr(
    "{ .reg .b32 m, f, g, s, t; and.b32 m, $1, 0x7FFF7FFF; mul.rn.bf16x2 m, m, $2; and.b32 f, m, 0x7F807F80; "
    "max.u16x2 f, f, $3; add.u32 g, f, $4; add.rn.bf16x2 s, m, g; sub.rn.bf16x2 s, s, g; min.bf16x2 s, s, $5; "
    "add.u32 t, s, 0x7FFF7FFF; or.b32 t, t, $7; and.b32 t, t, $1; and.b32 t, t, 0x80008000; or.b32 s, s, t; "
    "mul.rn.bf16x2 $0, s, $6; }"
)


@triton.jit
def bf16_pair_values(
    word, to_grid, back, MBITS: tl.constexpr, EMIN: tl.constexpr, MAX_BITS: tl.constexpr, FNUZ: tl.constexpr
):  # fmt: skip
    """A virtual cast's bfloat16 results of [BLOCKS, n] int32 words of two bfloat16 values, rounded
    to nearest even on a float grid under E8M0 tile scales (`to_grid` onto the grid, `back` to the
    tile's scale: NaN for a bad tile), as words of two; MAX_BITS: the largest value's bfloat16
    bits. The float32 path widens, rounds and
    narrows each value in about fifteen operations, most on the integer pipe that bounds a bf16
    stream; this takes fourteen PTX instructions a value pair. The same bits where
    `bf16_pair_codes` is exact (`_launch._bf16_halves`: a scaled value bfloat16 rounds more
    coarsely than float32 lies below half the grid's finest step and rounds to 0 both ways); on
    the way back a grid point times a power of two is exact in float32 but below 2**-143, where
    both paths give a signed zero, so rounding it to bfloat16 once or after float32 is the same."""
    both: tl.constexpr = 0x10001
    there = to_grid.to(tl.int32, bitcast=True) >> 16
    home = back.to(tl.int32, bitcast=True) >> 16
    scale = tl.broadcast_to((there | (there << 16))[:, None], word.shape)
    unscale = tl.broadcast_to((home | (home << 16))[:, None], word.shape)
    emin_field = tl.full(word.shape, ((EMIN + 127) << 7) * both, tl.int32)
    offset = tl.full(word.shape, ((7 - MBITS) << 7) * both, tl.int32)
    largest = tl.full(word.shape, MAX_BITS * both, tl.int32)
    signs = tl.full(word.shape, 0 if FNUZ else -2147450880, tl.int32)  # 0x80008000 as int32
    return tl.inline_asm_elementwise(
        _BF16X2_FLOAT_VALUES, "=r,r,r,r,r,r,r,r", [word, scale, emin_field, offset, largest, unscale, signs],
        dtype=tl.int32, is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def even_magnitudes(a, MBITS: tl.constexpr, EMIN: tl.constexpr, MAX_CODE: tl.constexpr, IS_INT: tl.constexpr):
    """Saturated magnitude codes of non-negative tile-scaled values `a` (below 2**(emax + 1))
    rounded to nearest even: grid_values, round_to_int and grid_code in fewer operations. Floats:
    adding 2**(e + 23 - m) rounds a on its binade's grid (e clamped at emin, so subnormals too)
    and leaves the count of grid steps in the low bits; ints: 2**23 after the step scaling."""
    if IS_INT:
        code = tl.minimum(round_to_int(a * (2.0**MBITS), 0.0, 0), MAX_CODE)
    else:
        field = tl.maximum(a.to(tl.int32, bitcast=True) >> 23, EMIN + 127)
        magic = (field + (23 - MBITS)) << 23
        steps = (a + magic.to(tl.float32, bitcast=True)).to(tl.int32, bitcast=True) - magic
        code = tl.minimum(((field - (EMIN + 127)) << MBITS) + steps, MAX_CODE)
    return code


@triton.jit
def fp8_code(v, HW_FP8: tl.constexpr):
    """float32 -> e4m3fn (1) or e5m2 (2) bits, round to nearest even, saturating to the largest
    finite value (cvt.rn.satfinite on sm_89 and later): TorchCast's rounding of in-range scaled
    values."""
    if HW_FP8 == 1:
        code = v.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    else:
        code = v.to(tl.float8e5, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    return code


@triton.jit
def fp8_value(code, HW_FP8: tl.constexpr):
    if HW_FP8 == 1:
        value = code.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        value = code.to(tl.float8e5, bitcast=True).to(tl.float32)
    return value


@triton.jit
def decode_codes(
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


# ----- float (non power-of-two) scales --------------------------------------------------------
#
# x / s is not exact, so a float32 quotient can land on the wrong side of a rounding boundary.
# TorchCast rounds the exact quotient (its float64 or float32 division provably decides as the
# exact one would: see its compute dtype), and so do these kernels, without a division per
# element: an approximate quotient q (x times a reciprocal per tile) picks the boundary b of its
# grid interval - the midpoint for nearest modes, the nearest grid point for directed ones - and
# one FMA decides the side exactly: fma(b, s, -x) is b*s - x rounded once, so its sign is the
# exact comparison of x / s with b. Values too small for that sign to survive (b*s - x below
# 2**-149) are first scaled by 2**64 with their divisor. q only has to lie within half a grid
# step of the exact quotient, which a float32 reciprocal is far inside of. Nearest modes on
# small float grids take a leaner form of the same decision (nearest_magnitudes), about half the
# instructions: these kernels are bound by instruction issue on 16-bit inputs.


@triton.jit
def prescale(divisor):
    """(f, divisor * f): f = 2**64 for divisors below 2**-64, else 1 (exact both ways)."""
    f = tl.where(divisor < 2.0**-64, 2.0**64, 1.0)
    return f, divisor * f


@triton.jit
def bounded_prescale(divisor, DIVISORS: tl.constexpr):
    """prescale where a divisor can be small (DIVISORS 0, `_launch._divisors`), else (1, divisor):
    the multiply by f costs an instruction a value."""
    if DIVISORS == 0:
        f, df = prescale(divisor)
    else:
        f, df = 1.0, divisor
    return f, df


@triton.jit
def reciprocal(d, DIVISORS: tl.constexpr):
    """~1 / d: the hardware's approximate reciprocal where d is known to be a normal float32 on a
    GPU (DIVISORS 2), else a division with its range fixes. Either lies far within the tolerance
    of the exact decisions here."""
    if DIVISORS == 2:  # noqa: SIM108  (constexpr branches)
        recip = libdevice.fast_dividef(1.0, d)
    else:
        recip = 1.0 / d
    return recip


@triton.jit
def exact_steps(
    af, df, recip, M: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
    IS_INT: tl.constexpr, ROUND: tl.constexpr,
):  # fmt: skip
    """(k, e): the exact quotient af / (M * df) of non-negative finite af rounded onto a grid in
    ROUND (0 even, 1 nearest, 2 zero, 4 up) as k steps of 2**(e - MBITS) (floats: e the binade,
    clamped to [EMIN, EMAX]; ints: e = 0). `recip` ~ 1 / (M * df); M is a small constant whose
    products with grid points are exact (1 for element casts, the element max for scales)."""
    q = af * recip
    if IS_INT:
        e = tl.zeros_like(q.to(tl.int32, bitcast=True))
        y = q * (2.0**MBITS)
    else:
        field = q.to(tl.int32, bitcast=True) >> 23
        e = tl.minimum(tl.maximum(field - 127, EMIN), EMAX)
        y = q * pow2_normal(MBITS - e)
    y = tl.minimum(y, 2.0 ** (MBITS + 3))  # saturating anyway; keeps the integer conversions in range
    half_step = pow2_normal(e - MBITS - 1)
    if ROUND == 0 or ROUND == 1:
        k0 = y.to(tl.int32)  # truncation: y >= 0
        boundary = (2 * k0 + 1).to(tl.float32) * half_step  # the midpoint above k0, exact
        side = tl.fma(boundary * M, df, -af)  # > 0: the quotient lies below the midpoint
        if ROUND == 0:  # noqa: SIM108  (constexpr branches)
            tie_up = (k0 & 1) == 1
        else:
            tie_up = True
        k = k0 + ((side < 0.0) | ((side == 0.0) & tie_up)).to(tl.int32)
    else:
        b = (y + 8388608.0).to(tl.int32, bitcast=True) - 0x4B000000  # the nearest grid point
        side = tl.fma((2 * b).to(tl.float32) * half_step * M, df, -af)
        if ROUND == 2:  # noqa: SIM108
            k = b - (side > 0.0).to(tl.int32)
        else:
            k = b + (side < 0.0).to(tl.int32)
    return k, e


@triton.jit
def nearest_magnitudes(
    a, df, recip, M: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, MAX_CODE: tl.constexpr,
    ROUND: tl.constexpr, SIGNED: tl.constexpr = True,
):  # fmt: skip
    """Saturated magnitude codes of the exact quotients |a| / (M * df) rounded to nearest (ROUND
    0: ties to even, 1: away) on a float grid (launch.lean_nearest says which): what exact_steps
    and grid_code give, in about half the instructions (these kernels are bound by instruction
    issue and the integer/logic pipe on 16-bit inputs). recip ~ 1 / (M * df); M is a constant
    whose products with grid points are exact (1 for elements, the element max for scales).

    The binade e comes from q = |a| * recip (its exponent field, at least the lowest binade's).
    With s = 2**(e - MBITS) the binade's step and B = 2**23 * s, one float32 addition
    t = q + (B - s/2) rounds q - s/2 to a multiple k of s - t = B + k*s, so k is t's bits less
    B's - and leaves the exact quotient within (k - 1/2, k + 3/2) steps: the midpoint k + 1/2
    decides, its negation (B - s/2) - t exact, by one FMA. The sign test is on
    the FMA's bits, where a tie (+0: an exact zero sum is +0 to nearest, never -0) steps up only
    from an odd k under ties to even. q < s/4 gives t = B - s/2: k = -1 with midpoint 0, which
    steps up to 0. Quotients above the grid need no clamp: with B finite their codes exceed
    MAX_CODE by construction; where B's exponent leaves float32 (e > 104 + MBITS under
    launch.lean_nearest) the constant is the largest float (t overflows to Inf, the code stays
    above MAX_CODE), a NaN (t's bits 0x7FFFFFFF: likewise) or a negative tiny float (t = q, and
    the code is negative), all saturated by the unsigned minimum; a NaN's code is replaced by
    the caller. Negated operands and absolute values are free operand modifiers of the float
    instructions; q is non-negative, so its field is one high product of its bits."""
    a = tl.abs(a) if SIGNED else a  # (not SIGNED: magnitudes the compiler cannot see are ones)
    q = a * recip
    # the exponent field: a high product runs on the FMA pipe, a shift not
    field = tl.umulhi(q.to(tl.uint32, bitcast=True), 512).to(tl.int32)
    field = tl.maximum(field, EMIN + 127)
    magic = (((field + (23 - MBITS)) << 23) - 1).to(tl.float32, bitcast=True)  # B - s/2
    t = q + magic
    bits = t.to(tl.int32, bitcast=True)  # B's bits + k
    side = tl.fma((magic - t) * M, df, a).to(tl.int32, bitcast=True)  # > 0: above the midpoint
    if ROUND == 0:  # constexpr
        side = side - (~bits & 1)  # a tie (+0) steps up from an odd k (B's bits are even)
    # ((field - EMIN - 127) << MBITS) + k + up, B's bits being (field + 23 - MBITS) << 23; up is
    # 1 + (side >> 31): no compare and select
    code = field * ((1 << MBITS) - (1 << 23)) + bits + (side >> 31)
    code = code + (1 - ((EMIN + 127) << MBITS) - ((23 - MBITS) << 23))
    return tl.minimum(code.to(tl.uint32, bitcast=True), MAX_CODE).to(tl.int32, bitcast=True)


@triton.jit
def quotient_magnitudes(
    x, divisor, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    IS_INT: tl.constexpr, ROUND: tl.constexpr, LEAN: tl.constexpr, DIVISORS: tl.constexpr,
    SIGNED: tl.constexpr = True,
):  # fmt: skip
    """(magnitude, a): saturated magnitude codes of [BLOCKS, n] values x over their tiles' float
    scales `divisor` [BLOCKS] (exact quotients, see above; LEAN: by nearest_magnitudes), and x
    prescaled, whose sign is x's (callers take signs from it, so x need not stay live).
    DIVISORS (`_launch._divisors` says which): 0, any - small ones are prescaled, at a multiply a
    value; 1, every one at least 2**-64; 2, also at most 2**126, on a GPU: the reciprocal is the
    hardware's approximate one, without the range fixes of a full division. SIGNED False: x are
    magnitudes already."""
    f, df = bounded_prescale(divisor, DIVISORS)
    a = x * f[:, None] if DIVISORS == 0 else x
    recip = reciprocal(df, DIVISORS)
    if LEAN:
        magnitude = nearest_magnitudes(
            a, df[:, None], recip[:, None], 1.0, MBITS, EMIN, MAX_CODE, ROUND, SIGNED
        )
    else:
        k, e = exact_steps(
            tl.abs(a) if SIGNED else a, df[:, None], recip[:, None], 1.0, MBITS, EMIN, EMAX, IS_INT, ROUND
        )
        magnitude = grid_code(k, e, MBITS, EMIN, MAX_CODE, IS_INT)
    return magnitude, a


@triton.jit
def quotient_codes(
    x, divisor, bad,
    BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    IS_INT: tl.constexpr, FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, ROUND: tl.constexpr, LEAN: tl.constexpr,
    DIVISORS: tl.constexpr,
):  # fmt: skip
    """Element codes of [BLOCKS, n] values over their tiles' float scales `divisor` [BLOCKS]; a
    tile marked `bad` is all NaN codes."""
    magnitude, a = quotient_magnitudes(x, divisor, MBITS, EMIN, EMAX, MAX_CODE, IS_INT, ROUND, LEAN, DIVISORS)
    code = signed_code(magnitude, a, BITS, IS_INT, FNUZ)
    return tl.where((bad > 0)[:, None], NAN_CODE, code)


@triton.jit
def magnitude_values(magnitude, MBITS: tl.constexpr, EMIN: tl.constexpr):
    """float32 values of float magnitude codes: the code shifted into float32's fields reads as
    2**(1 - emin - 127) times the value (a float32 subnormal where the code is one), so one
    multiply restores it (decode_codes' arithmetic, without the sign)."""
    return (magnitude << (23 - MBITS)).to(tl.float32, bitcast=True) * (2.0 ** (126 + EMIN))


@triton.jit
def quotient_values(
    x, divisor, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    ROUND: tl.constexpr, LEAN: tl.constexpr, DIVISORS: tl.constexpr,
):  # fmt: skip
    """The signed float-grid values (in scale units) that quotient_codes' codes decode to, for
    the finite codes it makes of finite tiles: magnitude_values with x's sign set. No NaN
    selects: a bad tile's divisor is NaN and makes its values NaN; a fnuz format's -0 is left to
    the caller (adding +0 after the divisor's product clears it, where a select would take the
    integer pipe)."""
    magnitude, a = quotient_magnitudes(x, divisor, MBITS, EMIN, EMAX, MAX_CODE, False, ROUND, LEAN, DIVISORS)
    values = magnitude_values(magnitude, MBITS, EMIN)
    sign = a.to(tl.int32, bitcast=True) & -2147483648
    return (values.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def float32_scales(amax, bad, DIVISOR: tl.constexpr, CEIL: tl.constexpr):
    """float32 scales amax / DIVISOR: IEEE division rounds the exact quotient to nearest (CEIL:
    one step up where that falls short), at least the smallest subnormal; 1 where amax is 0, NaN
    where `bad`. Also NVFP4's tensor scale (DIVISOR = element max x tile scale max: rounding the
    float64 quotient to float32, as TorchCast does, rounds the exact one)."""
    q = tl.math.div_rn(amax, DIVISOR)
    bits = q.to(tl.int32, bitcast=True)  # (constants as bits: Triton types 2**-149 as float64)
    if CEIL:  # one step up where q * max falls short of amax, below float32's largest value
        bits = bits + ((tl.fma(q, DIVISOR, -amax) < 0.0) & (bits < 0x7F7FFFFF)).to(tl.int32)
    q = tl.maximum(bits, 1).to(tl.float32, bitcast=True)
    return tl.where(bad > 0, float("nan"), tl.where(amax > 0.0, q, 1.0))


@triton.jit
def float_tile_scales(
    amax, bad, tensor_scale,
    ELEM_MAX: tl.constexpr, S_FP32: tl.constexpr, S_MBITS: tl.constexpr, S_EMIN: tl.constexpr,
    S_EMAX: tl.constexpr, S_MAX_CODE: tl.constexpr, S_NAN_CODE: tl.constexpr, S_ONE_CODE: tl.constexpr,
    S_FNUZ: tl.constexpr, S_HAS_INF: tl.constexpr, CEIL: tl.constexpr, S_LEAN: tl.constexpr,
    DIVISORS: tl.constexpr = 0,
):  # fmt: skip
    """(value, stored) of each tile's float scale: amax / ELEM_MAX (over `tensor_scale` under two
    levels) rounded to nearest (CEIL: up) into the scale format, clamped to its smallest and
    largest values; 1 for a tile of zeros, NaN for a `bad` one. `stored` is the float32 value
    (S_FP32) or the 8-bit code; S_LEAN: rounded by nearest_magnitudes. DIVISORS as the element
    divisors' (quotient_magnitudes): at least 1, the tensor scale needs no prescaling; 2, its
    reciprocal is the hardware's."""
    if S_FP32:  # one level
        value = float32_scales(amax, bad, ELEM_MAX, CEIL)
        stored = value
    else:
        f, df = bounded_prescale(tensor_scale, DIVISORS)
        recip = reciprocal(df * ELEM_MAX, DIVISORS)
        if S_LEAN:
            code = nearest_magnitudes(amax * f, df, recip, ELEM_MAX, S_MBITS, S_EMIN, S_MAX_CODE, 0)
        else:
            k, e = exact_steps(
                amax * f, df, recip, ELEM_MAX, S_MBITS, S_EMIN, S_EMAX, False, 4 if CEIL else 0
            )
            code = grid_code(k, e, S_MBITS, S_EMIN, S_MAX_CODE, False)
        code = tl.maximum(code, 1)  # at least the smallest
        code = tl.where(bad > 0, S_NAN_CODE, tl.where(amax > 0.0, code, S_ONE_CODE))
        value = decode_codes(code, 8, S_MBITS, S_EMIN, False, S_FNUZ, S_HAS_INF)
        stored = code
    return value, stored
