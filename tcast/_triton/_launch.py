"""Launching the kernels: geometry, per-format constants, engine choices (fp8 conversion, word
packing, run loads) and the host API of the Triton engine."""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass

import torch
import triton

from .._codes import decode_table, encode, max_code, nan_code
from .._datatype import DataType
from .._engine import interpreting, scalar_factors
from .._modes import RoundMode, ScaleMode
from .._number import InfNaN, NumberSpec
from .._pack import packed_nbytes
from .._primitives import float_scales, given_tensor_scale, tensor_scale_divisor, tensor_scale_of
from .._scales import step_up_limit
from .._tensor import Tensor
from ._kernels import (
    actual_kernel,
    amax_kernel,
    float_actual_kernel,
    float_upcast_kernel,
    float_virtual_kernel,
    upcast_kernel,
    virtual_kernel,
)

ROUND_CODES = {RoundMode.EVEN: 0, RoundMode.NEAREST: 1, RoundMode.ZERO: 2, RoundMode.STOCHASTIC: 3}
_SCALE = {ScaleMode.MAX: 0, ScaleMode.MIDMAX: 1, ScaleMode.CEIL: 2, ScaleMode.EVEN: 3}
_PROGRAM_BYTES = 8192  # of the float stream (input of a cast, output of an upcast) per program
_UNSCALED_TILE = 256  # unscaled casts walk the flat tensor in runs of this many elements
_AMAX_BYTES = 65536  # of the input per program of the amax pass, on 8 warps (docs/benchmarks.md)


@dataclass(frozen=True)
class Geometry:
    """How a kernel walks a tensor: blocks of `tile` elements (a power of two), `tcols` of them
    along the last dim (a 2-D tile has tile // tcols rows), numbered as TorchCast's layout numbers
    its scale blocks."""

    tile: int
    tcols: int
    per_row: int  # blocks along the last dim
    block_rows: int  # 2-D tiles: blocks along the second-to-last dim
    rows: int  # 2-D tiles: the second-to-last dim
    cols: int  # the last dim; the element count for flat runs
    blocks: int
    stride: int  # codes per block as stored: the tile, or a channel row's length
    flat: bool  # unscaled or one scale per tensor: the tensor in runs, codes unpadded

    @property
    def even(self) -> bool:
        """1-D tiles that cover every row exactly: the data is one contiguous run."""
        return not self.flat and self.tcols == self.tile and self.cols % self.tile == 0

    @property
    def stored(self) -> int:
        """Codes an actual cast stores: every element of a flat run, else whole blocks."""
        return self.cols if self.flat else self.blocks * self.stride

    def args(self) -> tuple[int, int, int, int, int]:
        return self.blocks, self.per_row, self.block_rows, self.rows, self.cols


def geometry(shape: tuple[int, ...], dtype: DataType) -> Geometry:
    numel = 1
    for d in shape:
        numel *= d
    sspec = dtype.sspec
    if sspec is None or sspec.is_tensor:
        blocks = -(-numel // _UNSCALED_TILE)
        return Geometry(_UNSCALED_TILE, _UNSCALED_TILE, blocks, 1, 1, numel, blocks, _UNSCALED_TILE, True)
    cols = shape[-1]
    lines = numel // cols if cols else 0
    if sspec.is_channel:
        tile = max(8, triton.next_power_of_2(cols))
        return Geometry(tile, tile, 1, 1, 1, cols, lines, cols, False)
    if len(sspec.tiles) == 1:
        tile = sspec.tiles[0].size
        per_row = -(-cols // tile)
        return Geometry(tile, tile, per_row, 1, 1, cols, lines * per_row, tile, False)
    trows, tcols = sspec.tiles[0].size, sspec.tiles[1].size
    rows = shape[-2]
    matrices = numel // (rows * cols) if rows * cols else 0
    per_row, block_rows = -(-cols // tcols), -(-rows // trows)
    blocks = matrices * per_row * block_rows
    return Geometry(trows * tcols, tcols, per_row, block_rows, rows, cols, blocks, trows * tcols, False)


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
def element_params(nspec: NumberSpec, virtual: bool) -> dict[str, object]:
    """Kernel constants of an element format for a cast (cached: encoding the max value costs
    torch ops)."""
    params = _format_params(nspec) | {"EMAX": nspec.emax}
    if virtual:  # saturation on values; the actual kernel saturates codes
        params["MAXV"] = float(nspec.max)
    else:
        params |= {"BITS": nspec.bits, "MAX_CODE": max_code(nspec), "NAN_CODE": nan_code(nspec)}
    return params


def as_bits(t: torch.Tensor, loading: bool = False) -> torch.Tensor:
    """bfloat16 tensors travel as int16 bits: always when loaded (the kernels widen them by a
    shift), and when stored only under the interpreter (see `narrow` in _memory)."""
    if t.dtype is torch.bfloat16 and (loading or interpreting()):
        return t.view(torch.int16)
    return t


def _hardware_fp8(nspec: NumberSpec, roundmode: RoundMode, has_scale: bool, device: torch.device) -> int:
    """1 (e4m3fn) or 2 (e5m2) where the GPU's fp8 conversion gives TorchCast's codes
    (`_fp8_conversion`); else 0 (integer arithmetic)."""
    if not _fp8_conversion(roundmode, has_scale, device):
        return 0
    return {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}.get(nspec.torch_dtype, 0)


def _fp8_grid(
    nspec: NumberSpec, roundmode: RoundMode, has_scale: bool, device: torch.device
) -> tuple[int, float]:
    """(1 or 2, the power of two onto the grid) where a 6-bit fnuz float's codes come from the
    GPU's e4m3 or e5m2 conversion (`_elements.fnuz6_codes_by_fp8`: 3 or 2 mantissa bits; every
    fnuz code below 32 a magnitude, as its PTX assumes; its halfword min wants `_native`); else
    (0, 1.0)."""
    six_bit_fnuz = (
        nspec.bits == 6 and not nspec.is_int and nspec.infnan is InfNaN.FNUZ and nspec.mbits in (2, 3)
    )
    if not six_bit_fnuz or not _fp8_conversion(roundmode, has_scale, device) or not _native(device):
        return 0, 1.0
    return _fp8_grid_of(nspec)


@functools.lru_cache(maxsize=16)
def _fp8_grid_of(nspec: NumberSpec) -> tuple[int, float]:
    """`_fp8_grid`'s answer for a 6-bit fnuz float where the GPU may take it (parsed once a format)."""
    fp8 = NumberSpec("e4m3fn" if nspec.mbits == 3 else "e5m2")
    shift = fp8.emin - nspec.emin
    if not -126 <= shift <= 127:  # a bias of its own so far off that the shift is no float32 normal
        return 0, 1.0
    return (1 if nspec.mbits == 3 else 2), math.ldexp(1.0, shift)


def _native(device: torch.device) -> bool:
    """Whether the kernels may take the GPU's own instructions in PTX (halfword min and max:
    sm_90 and later); the interpreter and older GPUs take plain Triton for the same bits."""
    return _capability(device) >= (9, 0)


def _fp8_conversion(roundmode: RoundMode, has_scale: bool, device: torch.device) -> bool:
    """Whether the GPU's fp8 conversion may give a cast's codes: tile-scaled values (in range, so
    saturation is all that overflow needs; a NaN or Inf anywhere makes the tile NaN) rounded to
    nearest even on sm_89 or later."""
    return has_scale and roundmode is RoundMode.EVEN and _capability(device) >= (8, 9)


def _capability(device: torch.device) -> tuple[int, int]:
    """The CUDA device's compute capability; (0, 0) elsewhere and under the interpreter, whose
    arithmetic is not the hardware's."""
    if device.type != "cuda" or interpreting():
        return (0, 0)
    return _capability_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=16)
def _capability_of(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@dataclass(frozen=True)
class LaunchConfig:
    """Elements one program handles and its warps (tuned on an H100: see docs/benchmarks.md).
    elements None: 8 KiB of the float stream, 4,096 16-bit or 2,048 float32 values (with 4,096
    float32 values ptxas hoists the loads into 116 registers and fp32 -> fp6/fp4 lost 14%).
    A tile larger than that is one program, with more warps (about 32 values a thread, 64 as
    16-bit pairs in words). registers: a cap on a thread's registers where ptxas takes more than
    the kernel needs and loses occupancy (None: ptxas decides)."""

    elements: int | None = None
    num_warps: int = 4
    registers: int | None = None

    def blocks(self, tile: int, element_size: int) -> int:
        elements = self.elements or _PROGRAM_BYTES // element_size
        return max(1, elements // tile)

    def warps(self, tile: int, per_warp: int = 1024) -> int:
        """per_warp: the values a warp holds of a large tile (2,048 where 16-bit pairs travel as
        32-bit words: H100, 128x128 blocks from bf16 96% of copy on 16 warps, 101% on 8)."""
        return max(self.num_warps, min(16, tile // per_warp))


def _square_tile_config(tile: int) -> LaunchConfig:
    """Square (2-D) E8M0 tiles, whose values lie in strided rows: 32 values a thread, a 32x32 tile
    to a one-warp program, where the default launch leaves the stream short of bandwidth (H100:
    mxfp4s actual from bf16 40% -> 86% of copy, from fp32 85% -> 100%, virtual from bf16 86% ->
    96%; upcasts of square tiles to bf16 78-88% -> 95-97%; docs/benchmarks.md)."""
    elements = tile if tile >= 1024 else 2048
    return LaunchConfig(elements, max(1, elements // 1024))


def _square_upcast_config(tile: int) -> LaunchConfig:
    """Upcasts of square E8M0 tiles to 16-bit values: 32x32 tiles as `_square_tile_config`;
    smaller ones 2,048 values on 4 warps, 16 a thread (H100, to bf16: mxfp4s16 40% -> 97% of
    copy, mxfp8s16 89% -> 97%). With 32 values a thread on 2 warps, Triton 3.6's LLVM miscompiled
    the column offsets of 4-bit 16x16 tiles (a pair of lane shifts lowered as one 64-bit
    multiply: half of each tile read wrong codes; docs/benchmarks.md)."""
    return _square_tile_config(tile) if tile >= 1024 else LaunchConfig(2048, 4)


def _upcast_config(dtype: DataType, geo: Geometry, out_size: int) -> LaunchConfig:
    """The launch of an upcast where the default is short (H200 sweeps of the kernels' own time,
    docs/benchmarks.md): square E8M0 tiles to 16 bits as `_square_upcast_config`, 4-bit codes of
    square tiles of 1,024 values or more to float32 4,096 values a program (measured on 32x32:
    mxfp4s 77% -> 90% of copy); one float scale per tensor 4 KiB of output a program on 4 warps
    (fp8_F to bf16 69% -> 97%, to float32 76% -> 97%); tiles under other float scales and 4- and
    8-bit codes of 1-D E8M0 tiles to float32 1,024 values on 4 warps (measured on nvfp4, nvf4,
    fp8_1x128, mxfp4e2, mxint4: 92-93% -> 94-95%; mxfp8e4, mxint8, bfp16: 93-94% -> 96%), 6-bit
    ones on 2 warps (mxfp6e3: 94% -> 95%; 4 warps: 78%)."""
    sspec, bits = dtype.sspec, dtype.nspec.bits
    if sspec is None:
        return LaunchConfig()
    if sspec.is_exponent and sspec.is_2d:
        if out_size == 2:
            return _square_upcast_config(geo.tile)
        return LaunchConfig(4096, 4) if bits == 4 and geo.tile >= 1024 else LaunchConfig()
    if geo.flat:
        return LaunchConfig(4096 // out_size, 4)
    if out_size == 4 and (not sspec.is_exponent or bits in (4, 8)):
        return LaunchConfig(1024, 4)
    return LaunchConfig(1024, 2) if out_size == 4 and bits == 6 else LaunchConfig()


def _nibble_words_config(geo: Geometry, halves: bool) -> LaunchConfig:
    """The launch of `_kernels._nibble_words` (H100 sweeps, docs/benchmarks.md): 64 values a
    thread - two 32x32 tiles to a one-warp program (mxfp4s from bf16 93% -> 97% of copy), 8,192
    values of 1-D tiles on 4 warps (mxfp4e2 97% -> 100%); smaller square tiles as
    `_square_tile_config` (16x16 at 64 values a thread: 87% -> 66%). `halves`: codes from bf16x2
    arithmetic (`_bf16_halves`), whose 1-D tiles go 2,048 values on one warp (H200: mxfp4e2
    86.6-86.9% -> 92.0-92.3%, mxint4 93.5-93.8% -> 97.3%; docs/benchmarks.md)."""
    if geo.tcols == geo.tile:
        return LaunchConfig(2048, 1) if halves else LaunchConfig(8192, 4)
    return LaunchConfig(2 * geo.tile, 1) if geo.tile >= 1024 else _square_tile_config(geo.tile)


@functools.lru_cache(maxsize=32)
def _scale_format_params(scale: NumberSpec) -> dict[str, object]:
    """The constants every float-scale kernel takes of the scale format: float32, or an 8-bit
    float decoded from its codes (the upcast needs no more)."""
    return {
        "S_FP32": scale.torch_dtype is torch.float32, "S_MBITS": scale.mbits, "S_EMIN": scale.emin,
        "S_FNUZ": scale.infnan is InfNaN.FNUZ, "S_HAS_INF": scale.has_inf,
    }  # fmt: skip


def _scale_params(dtype: DataType, scalemode: ScaleMode) -> dict[str, object]:
    """Kernel constants of a float scale for a cast: its format, the codes an 8-bit scale
    saturates, fails and starts at, the element max it divides amax by, and whether it rounds
    up (ceil) or to nearest."""
    sspec = dtype.sspec
    assert sspec is not None
    scale = sspec.scale
    params = _scale_format_params(scale) | {
        "ELEM_MAX": float(dtype.nspec.max), "S_EMAX": scale.emax, "CEIL": scalemode is ScaleMode.CEIL,
    }  # fmt: skip
    if params["S_FP32"]:
        return params | {"S_MAX_CODE": 0, "S_NAN_CODE": 0, "S_ONE_CODE": 0}
    one = int(encode(torch.ones(1), scale)[0])
    return params | {"S_MAX_CODE": max_code(scale), "S_NAN_CODE": nan_code(scale), "S_ONE_CODE": one}


@functools.lru_cache(maxsize=128)
def _float_constants(dtype: DataType, roundmode: RoundMode, scalemode: ScaleMode) -> dict[str, object]:
    """The kernel constants of a float-scaled cast that depend on the type and modes alone (cached:
    a cast's host time adds to the GPU's on every call)."""
    sspec = dtype.sspec
    assert sspec is not None
    two_level = sspec.tensor_scale is not None
    return {
        "TWO_LEVEL": two_level, "ROUND": ROUND_CODES[roundmode],
        "TENSOR_DIVISOR": tensor_scale_divisor(dtype) if two_level else 1.0,
        "LEAN": lean_nearest(dtype.nspec, roundmode),
        "S_LEAN": scalemode is not ScaleMode.CEIL and lean_nearest(sspec.scale, RoundMode.EVEN),
    } | element_params(dtype.nspec, False) | _scale_params(dtype, scalemode)  # fmt: skip


@functools.lru_cache(maxsize=32)
def _runs16(nspec: NumberSpec, x: torch.Tensor, geo: Geometry) -> bool:
    """Whether 4- and 6-bit codes of 16-bit inputs pack into words from 16-element runs per
    thread (tiles with rows of at least 16 values)."""
    return nspec.bits in (4, 6) and x.element_size() == 2 and not geo.flat and geo.tcols >= 16


def _pairs(nspec: NumberSpec, x: torch.Tensor, geo: Geometry) -> bool:
    """Whether a float-scaled actual cast reads 16-value tiles of 16-bit values as 32-bit words
    of two values (`_kernels._float_pairs`): 4-bit codes, a contiguous aligned stream."""
    return (
        nspec.bits == 4 and x.element_size() == 2 and geo.even and geo.tile == 16 and x.data_ptr() % 16 == 0
    )


def _word_tiles(x: torch.Tensor, geo: Geometry) -> bool:
    """Whether x's tiles (not one scale per tensor) read as 32-bit words of two 16-bit values:
    rows, tile rows and code rows of even length, a 4-byte aligned stream."""
    return (
        not geo.flat and x.element_size() == 2 and geo.cols % 2 == 0 and geo.tcols % 2 == 0
        and geo.stride % 2 == 0 and x.data_ptr() % 4 == 0
    )  # fmt: skip


def _byte_words(nspec: NumberSpec, x: torch.Tensor, geo: Geometry) -> bool:
    """Whether a float-scaled actual cast reads tiles of 16-bit values as 32-bit words of two
    (`_kernels._float_byte_words`): 8-bit float codes of word tiles."""
    return nspec.bits == 8 and not nspec.is_int and _word_tiles(x, geo)


def _bf16_halves(nspec: NumberSpec, x: torch.Tensor) -> bool:
    """Whether a word path's 4-bit codes come from bf16x2 arithmetic (`_elements.bf16_pair_codes`):
    bfloat16 input on sm_90 and later, and a format whose finest step is at least 2**-125. A
    product |x| * 2**-k below 2**-126 is a bf16 subnormal, rounded to a multiple of 2**-133 where
    float32 keeps it whole: with steps of 2**-126 (e2m1 at bias 126) that rounding can land on a
    tie the exact product is not on."""
    return x.dtype is torch.bfloat16 and _native(x.device) and nspec.emin - nspec.mbits > -126


def _virtual_words(
    nspec: NumberSpec, roundmode: RoundMode, x: torch.Tensor, out: torch.dtype, geo: Geometry
) -> int | None:
    """The largest value's bfloat16 bits where an E8M0-scaled virtual cast of bfloat16 to bfloat16
    takes words of two values in bf16x2 arithmetic (`_kernels._virtual_words`): 4- and 6-bit float
    elements rounded to nearest even, word tiles, where `_bf16_halves` holds; else None. (The
    float32 path is bound by its integer operations on a bf16 stream: H200, mxfp6 and mxfp4e2
    88% of copy.)"""
    if not (
        nspec.bits in (4, 6) and not nspec.is_int and roundmode is RoundMode.EVEN and out is torch.bfloat16
        and not geo.flat and _word_tiles(x, geo) and _bf16_halves(nspec, x)
    ):  # fmt: skip
        return None
    return _bf16_bits_of(float(nspec.max))


def _bf16_bits_of(value: float) -> int | None:
    """The bfloat16 bits of a value bfloat16 holds exactly, else None."""
    (bits,) = struct.unpack("<I", struct.pack("<f", value))
    return bits >> 16 if bits & 0xFFFF == 0 else None


def _nibble_words(nspec: NumberSpec, roundmode: RoundMode, x: torch.Tensor, geo: Geometry) -> bool:
    """Whether an E8M0-scaled actual cast reads tiles of 16-bit values as 32-bit words of two
    (`_kernels._nibble_words`): 4-bit codes rounded to nearest even of word tiles of at least 8
    values, each tile's codes a whole number of words."""
    return (
        nspec.bits == 4 and roundmode is RoundMode.EVEN and _word_tiles(x, geo) and geo.tile % 8 == 0
        and geo.stride == geo.tile
    )  # fmt: skip


def _words16(nspec: NumberSpec, x: torch.Tensor, out: torch.dtype, geo: Geometry) -> bool:
    """Whether a float-scaled virtual cast reads and writes tiles of 16-bit values as 32-bit
    words of two (`_kernels._float_virtual_words`): the tiles and elements `_byte_words` takes
    but fnuz ones (no -0: the sign would need a select), a 16-bit output."""
    return _byte_words(nspec, x, geo) and nspec.infnan is not InfNaN.FNUZ and out.itemsize == 2


def _float_config(
    nspec: NumberSpec, x: torch.Tensor, geo: Geometry, two_level: bool, virtual: bool, checked: bool
) -> LaunchConfig:
    """The launch of a float-scaled cast where the default is short (H100 sweeps of actual casts,
    H200 of virtual ones; docs/benchmarks.md): from float32, one scale per tensor 1,024 values a
    program (actual fp8_F 79% -> 102% of copy, int4_f 70% -> 95%; virtual fp8_F on the H200 94% ->
    100%); the rest of the virtual casts the default. Actual casts: two levels 1,024 on 2 warps
    (nvfp4 88% -> 90%); 4-bit codes from 16-bit runs 2,048 (nvf4 69% -> 74%; read as word pairs,
    94%). `checked`: the kernel checks a tensor scale it reads (`_divisors`), whose two arms
    ptxas gives 40 registers as word pairs of 16-bit values and 56 from float32: capped at 32 and
    40 (nvfp4 cast pass from bf16 273 -> 259 us, from fp32 442 -> 420 us; offline, the fast arm
    alone fits 32 unspilled)."""
    wide = x.element_size() == 4
    if geo.flat and wide:
        return LaunchConfig(1024, 4)
    if virtual:
        return LaunchConfig()
    if two_level and wide:
        return LaunchConfig(1024, 2, 40 if checked else None)
    if nspec.bits == 4 and _runs16(nspec, x, geo):
        return LaunchConfig(2048, 4, 32 if checked and _pairs(nspec, x, geo) else None)
    return LaunchConfig()


def lean_nearest(nspec: NumberSpec, roundmode: RoundMode) -> bool:
    """Whether quotients onto this grid round by the kernels' lean nearest path
    (`_elements.nearest_magnitudes`): nearest modes on a float grid whose every half step is a
    normal float32 (so the midpoint is exact), whose steps times 2**23 stay finite one binade
    above the largest, and whose binades hold at most 2**17 steps (the approximate quotient,
    within 2**-21 of the exact one, then lies within 1/16 step of it)."""
    nearest = roundmode in (RoundMode.EVEN, RoundMode.NEAREST)
    grid = nspec.mbits <= 16 and nspec.emin - nspec.mbits - 1 >= -126 and nspec.emax - nspec.mbits + 24 <= 127
    return nearest and not nspec.is_int and grid


def _divisors(geo: Geometry, dtype: DataType, given_value: float | None) -> dict[str, object]:
    """What the float-scale kernels may assume of their divisors (`_elements.quotient_magnitudes`):
    DIVISORS 0 nothing (small ones are prescaled, at a multiply a value); 1 at least 2**-64; 2
    also at most 2**126, on a GPU (the hardware's approximate reciprocal). Each divisor is the
    tensor's one scalar (a scale per tensor, or two levels' tensor scale; else 1) times at most
    one 8-bit tile scale (`_engine.scalar_factors`). A scalar known here decides it. A two-level
    tensor scale on the device (computed from the amax pass) the kernel checks against
    [SCALAR_LO, SCALAR_HI], taking the DIVISORS arm inside and the prescaling arm outside (H100,
    nvfp4 actual from bf16: cast pass 279 -> 259 us). One scale per tensor on the device is not
    checked: its prescaling costs one multiply a value, and the second arm cost more (fp8_F
    actual from bf16 296 -> 322 us: LLVM hoists the arms' common loads above the branch and the
    kernel kept 79 registers, not 37)."""
    sspec = dtype.sspec
    assert sspec is not None
    unchecked = {"SCALAR_LO": 0.0, "SCALAR_HI": 0.0}
    if geo.flat and given_value is None:
        return {"DIVISORS": 0} | unchecked
    if geo.flat:
        smallest = largest = 1.0
    elif sspec.scale.bits == 8:
        smallest, largest = scalar_factors(dtype)
    else:
        return {"DIVISORS": 0} | unchecked
    fast = 1 if interpreting() else 2
    if given_value is None and sspec.tensor_scale is not None:  # on the device: the kernel checks it
        least = 2.0 ** math.ceil(math.log2(2.0**-64 / smallest))  # powers of two: exact float32 bounds
        most = 2.0 ** math.floor(math.log2(2.0**126 / largest))
        return {"DIVISORS": fast, "SCALAR_LO": least, "SCALAR_HI": most}
    scalar = 1.0 if given_value is None else given_value
    if scalar * smallest < 2.0**-64:
        return {"DIVISORS": 0} | unchecked
    return {"DIVISORS": 1 if scalar * largest > 2.0**126 else fast} | unchecked


def _amax_stats(x: torch.Tensor) -> torch.Tensor:
    """The amax pass: int32 [3], the bits of x's largest magnitude (a NaN or Inf pattern when it
    holds one) and of its largest finite magnitude; the third is where a cast kernel keeps a
    two-level tensor scale it computes from them."""
    stats = torch.zeros(3, dtype=torch.int32, device=x.device)
    numel = x.numel()
    if numel:
        block = _AMAX_BYTES // x.element_size()
        amax_kernel[(triton.cdiv(numel, block),)](
            as_bits(x, loading=True), stats, numel, BLOCK=block, num_warps=8
        )
    return stats


def _tensor_scale(given: torch.Tensor, from_amax: bool) -> torch.Tensor:
    """A two-level cast's tensor scale, a float32 0-d tensor: the caller's or the host's, or the
    one the cast kernel computed from the amax pass and kept beside its bits."""
    return given[2:3].view(torch.float32).reshape(()) if from_amax else given.reshape(())


def _given_scale(x: torch.Tensor, dtype: DataType, scalemode: ScaleMode) -> torch.Tensor:
    """The per-tensor scale of a float-scaled cast, as a float32 [1] on x's device: one amax pass
    in a kernel, then TorchCast's own scale rule on it (no copy to the host). Two levels: the
    tensor scale over the largest finite magnitude; one level: the scale over the amax (NaN when
    the tensor holds a NaN or Inf)."""
    sspec = dtype.sspec
    assert sspec is not None
    magnitudes = _amax_stats(x).view(torch.float32).double()
    if sspec.tensor_scale is not None:
        return tensor_scale_of(magnitudes[1], dtype).reshape(1)
    return float_scales(magnitudes[:1], dtype.nspec, sspec.scale, scalemode).float()


def cast(
    x: torch.Tensor,
    dtype: DataType,
    roundmode: RoundMode,
    scalemode: ScaleMode,
    seed: int,
    virtual: bool,
    out_dtype: torch.dtype | None = None,
    given: float | None = None,
    config: LaunchConfig = LaunchConfig(),
) -> torch.Tensor | Tensor:
    """The Triton cast (the caller has checked `supports`); `given`: the caller's scale per
    tensor (`tcast.cast`'s tensor_scale, rounded into its format), which only float-scaled
    types take."""
    if dtype.sspec is not None and not dtype.sspec.is_exponent:
        return _float_cast(x, dtype, roundmode, scalemode, virtual, out_dtype, given, config)
    assert given is None
    x = x.contiguous()
    shape = tuple(x.shape)
    geo = geometry(shape, dtype)
    config, narrow_square, words = _exponent_config(dtype, roundmode, virtual, x, geo, config)
    out_size = out_dtype.itemsize if virtual and out_dtype is not None else x.element_size()
    per_program = config.blocks(geo.tile, max(x.element_size(), out_size))
    grid = (triton.cdiv(geo.blocks, per_program),)
    common = _exponent_common(dtype, roundmode, scalemode, virtual, x, geo, config, per_program)
    source = as_bits(x, loading=True)
    if virtual:
        out = torch.empty(shape, dtype=out_dtype or x.dtype, device=x.device)
        max_bits = _virtual_words(dtype.nspec, roundmode, x, out.dtype, geo)
        if geo.blocks:
            virtual_kernel[grid](
                source, as_bits(out), *geo.args(), seed, WORDS=max_bits is not None, MAX_BITS=max_bits or 0,
                **common,
            )  # fmt: skip
        return out
    return _exponent_actual(x, dtype, roundmode, seed, geo, grid, source, common, narrow_square, words)


def _exponent_config(
    dtype: DataType, roundmode: RoundMode, virtual: bool, x: torch.Tensor, geo: Geometry, config: LaunchConfig
) -> tuple[LaunchConfig, bool, int]:
    """Choosing the launch config of an exponent-scaled or unscaled cast (a caller's config stands):
    nibble words, or plain loads for 4- and 6-bit codes under square tiles; actual 4- and 6-bit
    codes of float32 1-D tiles 1,024 values on one warp, 6-bit codes of bf16 ones from the fp8
    conversion 2,048 on one warp (H200 sweeps: docs/benchmarks.md); with the
    square flag and the actual kernel's NIBBLE_WORDS (0: none, 1: word path, 2: in bf16x2
    arithmetic)."""
    nspec = dtype.nspec
    has_scale = dtype.sspec is not None
    # 4- and 6-bit codes under square tiles pack best from plain loads (no 16-element runs)
    narrow_square = has_scale and dtype.sspec.is_2d and nspec.bits in (4, 6)
    words = 0
    if has_scale and not virtual and _nibble_words(nspec, roundmode, x, geo):
        words = 2 if _bf16_halves(nspec, x) else 1
    half, wide = x.element_size() == 2, x.element_size() == 4
    if config != LaunchConfig():
        pass
    elif words:
        config = _nibble_words_config(geo, words == 2)
    elif narrow_square and (not virtual or half):
        config = _square_tile_config(geo.tile)
    elif has_scale and dtype.sspec.is_2d and geo.tile >= 1024 and virtual and half:
        config = LaunchConfig(2048, 4)  # codes of widths but 4 and 6 (H200: mxfp8s from bf16 85% -> 99%)
    elif has_scale and not dtype.sspec.is_2d and not virtual and wide and nspec.bits in (4, 6):
        config = LaunchConfig(1024, 1)  # 32 float32 values a thread (H200: mxint4 88% -> 96%)
    elif has_scale and not dtype.sspec.is_2d and not virtual and _even_six_bits_of_bf16(nspec, roundmode, x):
        config = LaunchConfig(2048, 1)  # 64 bf16 values a thread (H200: mxfp6e3 88% -> 92%)
    return config, narrow_square, words


def _even_six_bits_of_bf16(nspec: NumberSpec, roundmode: RoundMode, x: torch.Tensor) -> bool:
    """6-bit fnuz float codes of bfloat16 from the GPU's fp8 conversion (`_fp8_grid`): an actual
    cast launched on its own (measured on that route only)."""
    return x.dtype is torch.bfloat16 and _fp8_grid(nspec, roundmode, True, x.device)[0] != 0


def _exponent_common(
    dtype: DataType, roundmode: RoundMode, scalemode: ScaleMode, virtual: bool, x: torch.Tensor, geo: Geometry,
    config: LaunchConfig, per_program: int,
) -> dict[str, object]:  # fmt: skip
    """The constexprs both kernels of an exponent-scaled or unscaled cast take."""
    nspec = dtype.nspec
    has_scale = dtype.sspec is not None
    common = {
        "TILE": geo.tile, "TCOLS": geo.tcols, "BLOCKS": per_program, "HAS_SCALE": has_scale, "EVEN": geo.even,
        "ROUND": ROUND_CODES[roundmode], "num_warps": config.warps(geo.tile), "enable_fp_fusion": False,
    } | element_params(nspec, virtual)  # fmt: skip
    if has_scale:
        common |= {"LIMIT": float(step_up_limit(nspec, scalemode)), "SCALE_MODE": _SCALE[scalemode]}
    else:
        common |= {"LIMIT": 0.0, "SCALE_MODE": 0}
    common["HW_FP8"] = _hardware_fp8(nspec, roundmode, has_scale, x.device)
    return common


def _exponent_actual(
    x: torch.Tensor, dtype: DataType, roundmode: RoundMode, seed: int, geo: Geometry, grid: tuple[int],
    source: torch.Tensor, common: dict[str, object], narrow_square: bool, words: int,
) -> Tensor:  # fmt: skip
    """Building the result of an actual cast: packed codes and E8M0 scales from the actual kernel."""
    nspec = dtype.nspec
    has_scale = dtype.sspec is not None
    numel_padded = geo.stored
    code_bytes = packed_nbytes(numel_padded, nspec.bits)
    codes = torch.empty(code_bytes, dtype=torch.uint8, device=x.device)
    scales = torch.empty(geo.blocks if has_scale else 0, dtype=torch.uint8, device=x.device)
    fast = (
        has_scale and roundmode is RoundMode.EVEN and nspec.infnan is InfNaN.FNUZ and not nspec.is_int
    )  # fmt: skip
    runs16 = has_scale and not narrow_square and _runs16(nspec, x, geo)
    fp8_grid, fp8_shift = _fp8_grid(nspec, roundmode, has_scale, x.device)
    if geo.blocks:
        actual_kernel[grid](
            source, codes, scales, *geo.args(), code_bytes, seed, FAST=fast, RUNS16=runs16, NIBBLE_WORDS=words,
            NATIVE=_native(x.device), FP8_GRID=fp8_grid, FP8_SHIFT=fp8_shift, **common,
        )  # fmt: skip
    return Tensor(
        dtype=dtype,
        shape=tuple(x.shape),
        source_dtype=x.dtype,
        codes=codes,
        scales=scales if has_scale else None,
        zeros=None,
        numel_padded=numel_padded,
    )


def _float_cast(
    x: torch.Tensor,
    dtype: DataType,
    roundmode: RoundMode,
    scalemode: ScaleMode,
    virtual: bool,
    out_dtype: torch.dtype | None,
    given_value: float | None,
    config: LaunchConfig,
) -> torch.Tensor | Tensor:
    """A cast under float scales: per tile (1-D, 2-D or a channel row) computed in the kernel,
    or one per tensor (and two-level's tensor scale): `given`, else from an amax pass first."""
    assert dtype.sspec is not None
    nspec = dtype.nspec
    x = x.contiguous()
    shape = tuple(x.shape)
    geo = geometry(shape, dtype)
    two_level = dtype.sspec.tensor_scale is not None
    given, tensor_amax = _float_scalar(x, dtype, geo, scalemode, given_value)
    out = out_dtype or x.dtype
    divisors = _divisors(geo, dtype, given_value)
    if config == LaunchConfig():
        config = _float_config(nspec, x, geo, two_level, virtual, divisors["SCALAR_HI"] > 0)
    per_program = config.blocks(geo.tile, max(x.element_size(), out.itemsize if virtual else 0))
    grid = (triton.cdiv(geo.blocks, per_program),)
    common = {
        "TILE": geo.tile, "TCOLS": geo.tcols, "BLOCKS": per_program, "EVEN": geo.even, "GIVEN": geo.flat,
        "TENSOR_AMAX": tensor_amax, "enable_fp_fusion": False,
    } | _float_constants(dtype, roundmode, scalemode) | divisors  # fmt: skip
    if config.registers:
        common["maxnreg"] = config.registers
    words = _words16(nspec, x, out, geo) if virtual else _byte_words(nspec, x, geo)
    common["num_warps"] = config.warps(geo.tile, 2048 if words else 1024)
    source = as_bits(x, loading=True)
    placeholder = given if given is not None else source
    if virtual:
        result = torch.empty(shape, dtype=out, device=x.device)
        if geo.blocks:
            float_virtual_kernel[grid](
                source, as_bits(result), placeholder, *geo.args(), WORDS16=words,
                NATIVE=_native(x.device), **common,
            )  # fmt: skip
        return result
    return _float_actual(x, dtype, geo, given, tensor_amax, grid, common, words, source, placeholder)


def _float_scalar(
    x: torch.Tensor, dtype: DataType, geo: Geometry, scalemode: ScaleMode, given_value: float | None
) -> tuple[torch.Tensor | None, bool]:
    """(the one scale per tensor or two-level tensor scale the kernel reads, or None; whether
    the kernel derives it from an amax pass's bits)."""
    sspec = dtype.sspec
    assert sspec is not None
    two_level = sspec.tensor_scale is not None
    # one scale per tensor in float32 or 8 bits, or a float32 tensor scale over tile scales: the
    # kernel derives it from the amax pass's bits, where the host's rule would launch a dozen
    # tiny kernels between the two passes
    if two_level:
        in_kernel = sspec.tensor_scale.torch_dtype is torch.float32
    else:
        in_kernel = geo.flat and (sspec.scale.torch_dtype is torch.float32 or sspec.scale.bits == 8)
    given = None if given_value is None else given_tensor_scale(given_value, x.device)
    tensor_amax = given is None and in_kernel and x.numel() > 0
    if tensor_amax:
        given = _amax_stats(x)
    elif given is None and (geo.flat or two_level):
        given = _given_scale(x, dtype, scalemode)
    return given, tensor_amax


def _float_actual(
    x: torch.Tensor, dtype: DataType, geo: Geometry, given: torch.Tensor | None, tensor_amax: bool,
    grid: tuple[int], common: dict[str, object], words: bool, source: torch.Tensor, placeholder: torch.Tensor,
) -> Tensor:  # fmt: skip
    """The actual cast's launch: codes packed, scales stored by the kernel or given."""
    sspec, nspec = dtype.sspec, dtype.nspec
    assert sspec is not None
    numel_padded = geo.stored
    code_bytes = packed_nbytes(numel_padded, nspec.bits)
    codes = torch.empty(code_bytes, dtype=torch.uint8, device=x.device)
    scale_dtype = sspec.scale.torch_dtype
    stored_by_kernel = tensor_amax or not geo.flat  # float32 values or 8-bit codes
    if stored_by_kernel:
        count = 1 if geo.flat else geo.blocks
        scales = torch.empty(count, dtype=torch.float32 if common["S_FP32"] else torch.uint8, device=x.device)
    else:
        assert given is not None
        scales = given.to(scale_dtype)
    if geo.blocks:
        float_actual_kernel[grid](
            source, codes, scales, placeholder, *geo.args(), code_bytes, geo.stride, WORDS=not geo.flat,
            RUNS16=_runs16(nspec, x, geo), PAIRS=_pairs(nspec, x, geo), BYTE_WORDS=words,
            NATIVE=_native(x.device), **common,
        )  # fmt: skip
    if stored_by_kernel and not common["S_FP32"]:
        scales = scales.view(scale_dtype)
    two_level = sspec.tensor_scale is not None
    return Tensor(
        dtype=dtype, shape=tuple(x.shape), source_dtype=x.dtype, codes=codes, scales=scales, zeros=None,
        tensor_scale=_tensor_scale(given, tensor_amax) if two_level else None, numel_padded=numel_padded,
    )  # fmt: skip


def upcast(
    t: Tensor, torch_dtype: torch.dtype | None = None, config: LaunchConfig = LaunchConfig()
) -> torch.Tensor:
    nspec = t.dtype.nspec
    device = t.codes.device
    geo = geometry(t.shape, t.dtype)
    out = torch.empty(t.shape, dtype=torch_dtype or t.source_dtype, device=device)
    sspec = t.dtype.sspec
    if config == LaunchConfig():
        config = _upcast_config(t.dtype, geo, out.element_size())
    per_program = config.blocks(geo.tile, out.element_size())
    grid = (triton.cdiv(geo.blocks, per_program),)
    vec = min(geo.tcols, 16 // out.element_size())
    common = {
        "TILE": geo.tile, "TCOLS": geo.tcols, "BLOCKS": per_program, "EVEN": geo.even, "BITS": nspec.bits,
        "VEC": vec, "WORDS": _six_bit_words(t, geo), "num_warps": config.warps(geo.tile), "enable_fp_fusion": False,
    } | _format_params(nspec)  # fmt: skip
    if sspec is not None and not sspec.is_exponent:
        return _float_upcast(t, out, geo, grid, common)
    has_scale = t.scales is not None
    # codes decode by arithmetic where 2**(126 + emin) is a float32; else gather from a value table
    decode = nspec.is_int or nspec.emin <= 1
    table = t.codes if decode else decode_table(nspec.code).to(device=device, dtype=torch.float32)
    if geo.blocks:
        upcast_kernel[grid](
            t.codes, t.scales if has_scale else t.codes, table, as_bits(out), *geo.args(), t.codes.numel(),
            HAS_SCALE=has_scale, DECODE=decode, **common,
        )  # fmt: skip
    return out


def _six_bit_words(t: Tensor, geo: Geometry) -> bool:
    """Whether an upcast reads 6-bit codes sixteen from three 32-bit words (`_memory.load_codes`):
    whole tiles of a multiple of 16 codes, 4-byte aligned."""
    codes = t.codes
    return (
        t.dtype.nspec.bits == 6
        and geo.tile % 16 == 0
        and codes.data_ptr() % 4 == 0
        and codes.numel() == geo.blocks * geo.tile * 3 // 4
    )


def _float_upcast(
    t: Tensor, out: torch.Tensor, geo: Geometry, grid: tuple[int], common: dict[str, object]
) -> torch.Tensor:
    sspec = t.dtype.sspec
    assert sspec is not None and t.scales is not None
    scale = sspec.scale
    two_level = sspec.tensor_scale is not None
    if two_level and t.tensor_scale is None:
        raise ValueError(f"{t.dtype.name} needs the cast's tensor scale to upcast")
    device = t.codes.device
    if geo.flat:
        given = t.scales.to(device=device, dtype=torch.float32).reshape(1)
    elif two_level:
        assert t.tensor_scale is not None
        given = t.tensor_scale.to(device=device, dtype=torch.float32).reshape(1)
    else:
        given = t.codes
    params = _scale_format_params(scale)
    scales = t.scales if params["S_FP32"] or geo.flat else t.scales.view(torch.uint8)
    if geo.blocks:
        float_upcast_kernel[grid](
            t.codes, scales, given, as_bits(out), *geo.args(), t.codes.numel(), geo.stride, GIVEN=geo.flat,
            TWO_LEVEL=two_level, **params, **common,
        )  # fmt: skip
    return out
