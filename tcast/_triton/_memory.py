"""Moving data: tile offsets and loads (bf16 widened from its bits), stores, and codes packed
into bytes and 32-bit words in registers (4-bit: eight a word; 6-bit: sixteen in three words).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def widen(raw):
    """Loaded values as float32; bfloat16 arrives as its int16 bits and widens by a shift (exact,
    where the interpreter's bf16 conversion mangles subnormals)."""
    if raw.dtype == tl.int16:
        return (raw.to(tl.uint16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return raw.to(tl.float32)


@triton.jit
def narrow(values, out_ptr):
    """float32 values in the output's dtype. An int16 output holds bfloat16 bits, rounded to
    nearest even by integer arithmetic (launched so under the interpreter, whose bf16 conversion
    does not round to nearest even; a GPU's conversion instruction does)."""
    if out_ptr.dtype.element_ty == tl.int16:
        bits = values.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return tl.where(values != values, 0x7FC0, rounded).to(tl.int16)
    return values.to(out_ptr.dtype.element_ty)


@triton.jit
def narrow_pair(low, high, out_ptr, NATIVE: tl.constexpr):
    """Two float32 values narrowed into the output's 16-bit dtype, low | high << 16 as an int32
    (NATIVE: one conversion instruction for both)."""
    if NATIVE:
        op: tl.constexpr = (
            "cvt.rn.bf16x2.f32" if out_ptr.dtype.element_ty == tl.bfloat16 else "cvt.rn.f16x2.f32"
        )
        pair = tl.inline_asm_elementwise(op + " $0, $2, $1;", "=r,f,f", [low, high], dtype=tl.int32, is_pure=True,
                                         pack=1)  # fmt: skip
    else:
        low16 = narrow(low, out_ptr).to(tl.uint16, bitcast=True).to(tl.int32)
        pair = low16 | (narrow(high, out_ptr).to(tl.uint16, bitcast=True).to(tl.int32) << 16)
    return pair


@triton.jit
def tile_offsets(
    block, n_blocks, blocks_per_row, block_rows, rows, cols,
    TILE: tl.constexpr, TCOLS: tl.constexpr, EVEN: tl.constexpr,
):  # fmt: skip
    """Element offsets, mask and padded positions of every element of these tiles."""
    j = tl.arange(0, TILE)
    return tile_offsets_at(block, j, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, EVEN)


@triton.jit
def tile_offsets_at(
    block, j, n_blocks, blocks_per_row, block_rows, rows, cols,
    TILE: tl.constexpr, TCOLS: tl.constexpr, EVEN: tl.constexpr,
):  # fmt: skip
    """Element offsets, mask and padded positions of the elements at positions j of these tiles.

    A tile is TILE // TCOLS rows of TCOLS values along the last two dims: one row (1-D tiles,
    rows = 1, each tensor row holding `blocks_per_row` tiles) or a 2-D tile of a [.., rows, cols]
    tensor, numbered row-major over its `block_rows` x `blocks_per_row` tiles per matrix - the
    block order of TorchCast's layout, so codes and scales land where it puts them."""
    if EVEN:  # 1-D tiles cover the rows exactly: the data is one contiguous run
        offsets = block[:, None] * TILE + j[None, :]
        valid = (block < n_blocks)[:, None] & (j < TILE)[None, :]
    elif TCOLS == TILE:
        row = block // blocks_per_row
        col = (block % blocks_per_row)[:, None] * TILE + j[None, :]
        offsets = row[:, None] * cols + col
        valid = (block < n_blocks)[:, None] & (col < cols)
    else:
        per_matrix = blocks_per_row * block_rows
        matrix = block // per_matrix
        within = block % per_matrix
        row = (within // blocks_per_row)[:, None] * (TILE // TCOLS) + (j // TCOLS)[None, :]
        col = (within % blocks_per_row)[:, None] * TCOLS + (j % TCOLS)[None, :]
        offsets = (matrix[:, None] * rows + row) * cols + col
        valid = (block < n_blocks)[:, None] & (row < rows) & (col < cols)
    return offsets, valid, block[:, None] * TILE + j[None, :]


@triton.jit
def runs_of_16(a, b, BLOCKS: tl.constexpr, TILE: tl.constexpr):
    """[BLOCKS, TILE] from two [BLOCKS, TILE / 2] halves holding elements 16m + 0..7 (a) and
    16m + 8..15 (b): joined in registers, so each thread holds 16 consecutive elements."""
    joined = tl.reshape(tl.join(a, b), (BLOCKS, TILE // 16, 8, 2))
    return tl.reshape(tl.permute(joined, (0, 1, 3, 2)), (BLOCKS, TILE))


@triton.jit
def load_tiles(
    x_ptr, n_blocks, blocks_per_row, block_rows, rows, cols,
    TILE: tl.constexpr, TCOLS: tl.constexpr, BLOCKS: tl.constexpr, EVEN: tl.constexpr,
    RUNS16: tl.constexpr = False,
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
        offsets_a, valid_a, index_a = tile_offsets_at(
            block, j, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, EVEN
        )
        offsets_b, valid_b, index_b = tile_offsets_at(
            block, j + 8, n_blocks, blocks_per_row, block_rows, rows, cols, TILE, TCOLS, EVEN
        )
        x_a = widen(tl.load(x_ptr + offsets_a, mask=valid_a, other=0))
        x_b = widen(tl.load(x_ptr + offsets_b, mask=valid_b, other=0))
        offsets, valid = offsets_a, valid_a  # the first halves only: the actual kernel ignores them
        index = runs_of_16(index_a, index_b, BLOCKS, TILE)
        x = runs_of_16(x_a, x_b, BLOCKS, TILE)
    else:
        offsets, valid, index = tile_offsets(block, n_blocks, blocks_per_row, block_rows, rows, cols, TILE,
                                             TCOLS, EVEN)  # fmt: skip
        x = widen(tl.load(x_ptr + offsets, mask=valid, other=0))
    return block, offsets, valid, index, x


@triton.jit
def load_words(
    x_ptr, n_blocks, blocks_per_row, block_rows, rows, cols,
    TILE: tl.constexpr, TCOLS: tl.constexpr, BLOCKS: tl.constexpr, EVEN: tl.constexpr, NATIVE: tl.constexpr,
):  # fmt: skip
    """This program's tiles of 16-bit values as int32 words of two (rows of even length, the
    stream 4-byte aligned): the elements of tiles half as wide. (tile indices, word positions in
    a tile, word offsets, mask, words, each tile's word_top)."""
    block = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    j = tl.arange(0, TILE // 2)
    offsets, valid, _ = tile_offsets_at(block, j, n_blocks, blocks_per_row, block_rows, rows, cols // 2, TILE // 2,
                                        TCOLS // 2, EVEN)  # fmt: skip
    word = tl.load(x_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + offsets, mask=valid, other=0)
    return block, j, offsets, valid, word, word_top(word, x_ptr.dtype.element_ty == tl.int16, NATIVE)


@triton.jit
def load_pairs(x_ptr, n_blocks, BLOCKS: tl.constexpr):
    """16-value tiles of a contiguous 16-bit stream as 32-bit words, two values a word: words 0..3
    and 4..7 of each tile (16-byte loads, a whole tile to a thread). The launch checks the
    stream's alignment."""
    block = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    words = x_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    offsets = block[:, None] * 8 + tl.arange(0, 4)[None, :]
    inside = (block < n_blocks)[:, None]
    return (
        block,
        tl.load(words + offsets, mask=inside, other=0),
        tl.load(words + offsets + 4, mask=inside, other=0),
    )


@triton.jit
def half_magnitudes(word, HIGH: tl.constexpr, BF16: tl.constexpr, NATIVE: tl.constexpr = False):
    """|v| as float32 of the 16-bit values v in the low or high halves of int32 words: at the
    cost of a plain widening. (The compiler turns a float abs of widened bits into a mask of
    them; NATIVE: a low bfloat16 half's abs goes through PTX as is, where ptxas folds it into
    the instructions that read it.)"""
    if BF16 and NATIVE and not HIGH:
        widened = (word << 16).to(tl.float32, bitcast=True)
        return tl.inline_asm_elementwise("abs.f32 $0, $1;", "=f,f", [widened], dtype=tl.float32, is_pure=True,
                                         pack=1)  # fmt: skip
    if HIGH:
        bits = word & 0x7FFF0000 if BF16 else (word >> 16) & 0x7FFF
    else:
        bits = (word & 0x7FFF) << 16 if BF16 else word & 0x7FFF
    if BF16:
        magnitude = bits.to(tl.float32, bitcast=True)
    else:
        magnitude = bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return magnitude


@triton.jit
def byte_pair(low, high, NATIVE: tl.constexpr):
    """low | high << 8 of byte-sized codes (one byte permute on a GPU)."""
    if NATIVE:  # noqa: SIM108  (constexpr branches)
        pair = libdevice.byte_perm(low, high, 0x0040)
    else:
        pair = low | (high << 8)
    return pair


@triton.jit
def byte_signs(word, NATIVE: tl.constexpr):
    """Bits 7 and 15 the signs of the low and high 16-bit values of int32 words (their bytes 1
    and 3, by one byte permute on a GPU), other bits undefined."""
    if NATIVE:  # noqa: SIM108  (constexpr branches)
        signs = libdevice.byte_perm(word, word, 0x3231)
    else:
        signs = ((word >> 8) & 0x80) | ((word >> 16) & 0x8000)
    return signs


@triton.jit
def half_negative(word, HIGH: tl.constexpr):
    """1 where the 16-bit value in the low or high half of int32 words is negative, else 0."""
    if HIGH:  # noqa: SIM108  (constexpr branches)
        negative = (word.to(tl.uint32, bitcast=True) >> 31).to(tl.int32)
    else:
        negative = (word >> 15) & 1
    return negative


@triton.jit
def store_pair_codes(
    codes_ptr, c0, c1, c2, c3, first, second, block, bad, n_blocks,
    BLOCKS: tl.constexpr, SIGNS: tl.constexpr, NAN_CODE: tl.constexpr, NATIVE: tl.constexpr,
):  # fmt: skip
    """4-bit codes of 16-value tiles split as half_magnitudes splits them (elements 2i, 2i + 1 of
    the first eight: c0, c1; of the last eight: c2, c3), packed as `store_nibble_words` packs
    them, two words a tile."""
    low = _nibble_word(c0, c1, first, BLOCKS, 1, SIGNS, NATIVE)
    high = _nibble_word(c2, c3, second, BLOCKS, 1, SIGNS, NATIVE)
    _store_nibble_words(
        codes_ptr, tl.reshape(tl.join(low, high), (BLOCKS, 2)), block, bad, n_blocks, 2, NAN_CODE
    )


@triton.jit
def store_nibble_words(
    codes_ptr, low, high, loaded, block, bad, n_blocks,
    WORDS: tl.constexpr, BLOCKS: tl.constexpr, SIGNS: tl.constexpr, NAN_CODE: tl.constexpr, NATIVE: tl.constexpr,
):  # fmt: skip
    """4-bit codes of tiles loaded as [BLOCKS, WORDS] int32 words of two 16-bit values (`low`,
    `high`: the codes of each word's halves) packed little-endian, WORDS // 4 words a tile; tiles
    marked `bad` all NAN_CODE. SIGNS 0: the codes are signed. Else they are magnitudes (0..7) and
    the signs come from the `loaded` words a word of codes at a time (`_sign_nibbles`): SIGNS 2
    sets a negative value's sign bit (a float with -0), 1 only under a nonzero magnitude (fnuz):
    the packed magnitudes plus 7 in every nibble carry into the nibble's top bit exactly there,
    with no carry between nibbles."""
    packed = _nibble_word(low, high, loaded, BLOCKS, WORDS // 4, SIGNS, NATIVE)
    _store_nibble_words(codes_ptr, packed, block, bad, n_blocks, WORDS // 4, NAN_CODE)


@triton.jit
def store_half_nibble_words(
    codes_ptr, pairs, loaded, block, bad, n_blocks,
    WORDS: tl.constexpr, BLOCKS: tl.constexpr, SIGNS: tl.constexpr, NAN_CODE: tl.constexpr,
):  # fmt: skip
    """`store_nibble_words` of codes held two a word, in the halves of [BLOCKS, WORDS] int32
    words (bits 0-3 and 16-19, as `_elements.bf16_pair_codes` gives them): each word's two codes
    become one byte (a shift and an or) and four bytes a word (three byte permutes; sm_90)."""
    shape: tl.constexpr = (BLOCKS, WORDS // 4, 2, 2)
    p0, p1, p2, p3 = split4(tl.reshape(pairs | (pairs >> 12), shape))
    packed = libdevice.byte_perm(
        libdevice.byte_perm(p0, p1, 0x0040), libdevice.byte_perm(p2, p3, 0x0040), 0x5410
    )
    packed = _joined_signs(packed, tl.reshape(loaded, shape), SIGNS, True)
    _store_nibble_words(codes_ptr, packed, block, bad, n_blocks, WORDS // 4, NAN_CODE)


@triton.jit
def _store_nibble_words(
    codes_ptr, packed, block, bad, n_blocks, PER_TILE: tl.constexpr, NAN_CODE: tl.constexpr
):
    """[BLOCKS, PER_TILE] words of packed codes stored a tile after another; `bad` tiles' all
    NAN_CODE."""
    words = codes_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    offsets = block[:, None] * PER_TILE + tl.arange(0, PER_TILE)[None, :]
    NAN_WORD: tl.constexpr = ((NAN_CODE * 0x11111111) ^ 0x80000000) - 0x80000000  # as an int32
    tl.store(
        words + offsets, tl.where((bad > 0)[:, None], NAN_WORD, packed), mask=(block < n_blocks)[:, None]
    )


@triton.jit
def nibble_word(even, odd):
    """Eight 4-bit codes in a little-endian word, from [.., 2, 2] codes of elements 2j (`even`)
    and 2j + 1 (`odd`), j in flat order: a tree of sums of disjoint fields (for sm_90 it compiles
    to fewer instructions and registers than a chain of ors)."""
    e0, e1, e2, e3 = split4(even)
    o0, o1, o2, o3 = split4(odd)
    return ((e0 + (o0 << 4)) + ((e1 + (o1 << 4)) << 8)) + (((e2 + (o2 << 4)) + ((e3 + (o3 << 4)) << 8)) << 16)


@triton.jit
def _nibble_word(
    even, odd, loaded, BLOCKS: tl.constexpr, GROUPS: tl.constexpr, SIGNS: tl.constexpr, NATIVE: tl.constexpr
):  # fmt: skip
    """[BLOCKS, GROUPS] nibble_words of [BLOCKS, 4 * GROUPS] codes, with signs from the words
    (`store_nibble_words`)."""
    shape: tl.constexpr = (BLOCKS, GROUPS, 2, 2)
    packed = nibble_word(tl.reshape(even, shape), tl.reshape(odd, shape))
    return _joined_signs(packed, tl.reshape(loaded, shape), SIGNS, NATIVE)


@triton.jit
def _joined_signs(packed, loaded, SIGNS: tl.constexpr, NATIVE: tl.constexpr):
    """Packed 4-bit magnitudes with the signs of the [.., 2, 2] `loaded` words joined
    (`store_nibble_words`' SIGNS); signed codes (SIGNS 0) as they are."""
    if SIGNS != 0:
        signs = _sign_nibbles(loaded, NATIVE)
        if SIGNS == 1:
            signs = signs & (packed + 0x77777777)
        packed = packed | (signs & -0x77777778)  # 0x88888888
    return packed


@triton.jit
def _sign_nibbles(loaded, NATIVE: tl.constexpr):
    """Bit 8j + 3 the sign of the low half of word j of four ([.., 2, 2] `loaded`), 8j + 7 the
    high half's (bits 15 and 31), other bits undefined. NATIVE (a GPU's byte permute): bytes 1
    and 3 of the words gathered in four permutes, where shifts and masks take fifteen."""
    w0, w1, w2, w3 = split4(loaded)
    if NATIVE:
        pairs_01 = libdevice.byte_perm(w0, w1, 0x7351)  # [w0.b1, w1.b1, w0.b3, w1.b3]
        pairs_23 = libdevice.byte_perm(w2, w3, 0x7351)
        lows = libdevice.byte_perm(pairs_01, pairs_23, 0x5410)  # byte j: word j's byte 1
        highs = libdevice.byte_perm(pairs_01, pairs_23, 0x7632)  # byte j: word j's byte 3
        signs = (highs & -0x7F7F7F80) | ((lows >> 4) & 0x7F7F7F7F)  # 0x80808080
    else:
        signs = (
            ((w0 >> 12) & 0x8) | ((w0 >> 24) & 0x80) | ((w1 >> 4) & 0x800) | ((w1 >> 16) & 0x8000)
            | ((w2 << 4) & 0x80000) | ((w2 >> 8) & 0x800000) | ((w3 << 12) & 0x8000000) | (w3 & -0x80000000)
        )  # fmt: skip
    return signs


@triton.jit
def word_top(word, BF16: tl.constexpr, NATIVE: tl.constexpr):
    """tile_top of [BLOCKS, n] int32 words of two 16-bit values each: the largest magnitude's
    bits as float32 bits, from maxima of both halves at once (NATIVE: the GPU's packed halfword
    max, one instruction for two values)."""
    magnitudes = word & 0x7FFF7FFF
    if NATIVE:
        halves = tl.reduce(magnitudes, 1, _max_halves)
        largest = tl.maximum(halves & 0xFFFF, halves >> 16)
    else:  # (the interpreter runs a custom reduction in Python, value by value)
        largest = tl.maximum(tl.max(magnitudes & 0xFFFF, axis=1), tl.max(magnitudes >> 16, axis=1))
    if BF16:
        top = largest << 16
    else:
        top = largest.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True)
    return top


@triton.jit
def _max_halves(a, b):
    """The unsigned maxima of two words' low and high 16-bit halves apart (one instruction)."""
    return tl.inline_asm_elementwise(
        "max.u16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True, pack=1
    )


@triton.jit
def split4(t):
    """The four parts of a [.., 2, 2] tensor, in flat order of its last two dims."""
    low, high = tl.split(t)
    e0, e2 = tl.split(low)
    e1, e3 = tl.split(high)
    return e0, e1, e2, e3


@triton.jit
def store_codes(
    codes_ptr, code, block, n_blocks, code_bytes, code_stride,
    TILE: tl.constexpr, BLOCKS: tl.constexpr, BITS: tl.constexpr, WORDS: tl.constexpr,
):  # fmt: skip
    """Pack [BLOCKS, TILE] codes little-endian, low bits first: neighbours are split apart in
    registers and OR-ed, so the loads and stores stay contiguous. WORDS: whole tiles (of at least
    8 codes, 16 for 6 bits) end on 32-bit boundaries, so they are stored a word at a time.
    8-bit codes of a block start `code_stride` codes apart (a channel row shorter than TILE);
    packed ones TILE apart."""
    if BITS == 8:
        j = tl.arange(0, TILE)
        offsets = block[:, None] * code_stride + j[None, :]
        tl.store(
            codes_ptr + offsets, code.to(tl.uint8), mask=(offsets < code_bytes) & (j < code_stride)[None, :]
        )
    elif BITS == 4 and WORDS:  # eight codes to a 32-bit word
        even, odd = tl.split(tl.reshape(code, (BLOCKS, TILE // 8, 2, 2, 2)))  # codes 2i and 2i + 1
        word = nibble_word(even, odd)
        words = codes_ptr.to(tl.pointer_type(tl.int32))
        offsets = block[:, None] * (TILE // 8) + tl.arange(0, TILE // 8)[None, :]
        tl.store(words + offsets, word, mask=(block < n_blocks)[:, None])
    elif BITS == 4:
        even, odd = tl.split(tl.reshape(code, (BLOCKS, TILE // 2, 2)))
        offsets = block[:, None] * (TILE // 2) + tl.arange(0, TILE // 2)[None, :]
        tl.store(codes_ptr + offsets, (even | (odd << 4)).to(tl.uint8), mask=offsets < code_bytes)
    elif TILE >= 16 and WORDS:  # 6 bits, sixteen codes in three little-endian 32-bit words
        parts = split4(tl.reshape(code, (BLOCKS, TILE // 16, 2, 2, 2, 2)))  # codes 4m + j, j = 0..3
        c0, c4, c8, c12 = split4(parts[0])
        c1, c5, c9, c13 = split4(parts[1])
        c2, c6, c10, c14 = split4(parts[2])
        c3, c7, c11, c15 = split4(parts[3])
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
def load_codes(
    codes_ptr,
    block,
    code_bytes,
    code_stride,
    TILE: tl.constexpr,
    BLOCKS: tl.constexpr,
    BITS: tl.constexpr,
    VEC: tl.constexpr,
    WORDS: tl.constexpr,
):
    """[BLOCKS, TILE] int32 codes. 8- and 4-bit codes are loaded VEC per thread (as many as one
    16-byte store of the output holds), so loads and stores share a layout and need no exchange
    through shared memory. 8-bit codes of a block start `code_stride` codes apart (see
    `store_codes`). WORDS: 6-bit codes of whole tiles of 16 or more, sixteen from three 32-bit
    words, as `store_codes` writes them (the codes 4-byte aligned)."""
    if BITS == 8:
        j = (tl.arange(0, TILE) // VEC) * VEC + tl.arange(0, TILE) % VEC
        offsets = block[:, None] * code_stride + j[None, :]
        inside = (offsets < code_bytes) & (j < code_stride)[None, :]
        return tl.load(codes_ptr + offsets, mask=inside, other=0).to(tl.int32)
    elif BITS == 4:
        j = tl.arange(0, TILE // 2)
        offsets = block[:, None] * (TILE // 2) + ((j // (VEC // 2)) * (VEC // 2) + j % (VEC // 2))[None, :]
        byte = tl.load(codes_ptr + offsets, mask=offsets < code_bytes, other=0).to(tl.int32)
        return tl.reshape(tl.join(byte & 15, byte >> 4), (BLOCKS, TILE))
    elif TILE >= 16 and WORDS:
        return _six_bit_words(codes_ptr, block, code_bytes, TILE, BLOCKS)
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
def _six_bit_words(codes_ptr, block, code_bytes, TILE: tl.constexpr, BLOCKS: tl.constexpr):
    """[BLOCKS, TILE] 6-bit codes, sixteen to three little-endian 32-bit words: each thread reads
    its group's words and holds its sixteen codes in order, where three byte loads a four codes
    and their interleaving cost the upcast to 16 bits a fifth of copy's bandwidth."""
    group = block[:, None] * (TILE // 16) + tl.arange(0, TILE // 16)[None, :]
    inside = group * 12 < code_bytes
    words = codes_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + group * 3
    w0 = tl.load(words, mask=inside, other=0)
    w1 = tl.load(words + 1, mask=inside, other=0)
    w2 = tl.load(words + 2, mask=inside, other=0)
    first = join4(w0 & 63, (w0 >> 24) & 63, (w1 >> 16) & 63, (w2 >> 8) & 63)  # codes 0, 4, 8, 12
    second = join4((w0 >> 6) & 63, ((w0 >> 30) & 3) | ((w1 & 15) << 2), (w1 >> 22) & 63, (w2 >> 14) & 63)
    third = join4((w0 >> 12) & 63, (w1 >> 4) & 63, ((w1 >> 28) & 15) | ((w2 & 3) << 4), (w2 >> 20) & 63)
    fourth = join4((w0 >> 18) & 63, (w1 >> 10) & 63, (w2 >> 2) & 63, (w2 >> 26) & 63)
    return tl.reshape(join4(first, second, third, fourth), (BLOCKS, TILE))


@triton.jit
def join4(e0, e1, e2, e3):
    """A [.., 2, 2] tensor of four parts in flat order of its last two dims (`split4` undone)."""
    return tl.join(tl.join(e0, e2), tl.join(e1, e3))
