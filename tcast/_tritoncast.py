"""TritonCast: fused Triton kernels for tile-scaled (MX-style) and unscaled casts of <= 8-bit formats.

One pass per tensor: each program loads a run of whole tiles along the last dim, finds every
tile's amax, picks its E8M0 exponent (the scale modes of TorchCast), rounds the elements in any
round mode and writes either the fake-quantized values (virtual) or packed codes plus uint8 scale
codes (actual). The upcast kernel reads codes and scales and writes values. Every operation
mirrors TorchCast's arithmetic: powers of two are built from their bits, scaling multiplies are
single float32 roundings, rounding works on exact integer/fraction splits, and contraction into
FMAs is disabled, so both engines give the same bits. Stochastic rounding draws Philox numbers
in the kernel (keyed by a seed): reproducible, but not TorchCast's stream.

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
_ELEMENTS_PER_PROGRAM = 4096
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
    noise,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    EMAX: tl.constexpr,
    IS_INT: tl.constexpr,
    ROUND: tl.constexpr,
):
    """|v| rounded onto the element grid, before saturation: value = r * 2**(e - MBITS), r integer."""
    a = tl.abs(v)
    a = tl.where(a == a, a, 0.0)  # NaN is restored by the caller
    if IS_INT:
        e = tl.zeros_like(a.to(tl.int32))
        y = tl.minimum(a * (2.0**MBITS), 2.0 ** (MBITS + 2))
    else:
        field = a.to(tl.int32, bitcast=True) >> 23
        e = tl.minimum(tl.maximum(field - 127, EMIN), EMAX + 1)
        y = tl.minimum(a * _pow2_normal(MBITS - e), 2.0 ** (MBITS + 2))
    return _round(y, noise, ROUND), e


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
    """Per-tile (has a NaN or Inf, amax of the finite values) of [BLOCKS, n] float32 values."""
    magnitude = tl.abs(x)
    nonfinite = (magnitude != magnitude) | (magnitude == float("inf"))
    bad = tl.max(nonfinite.to(tl.int32), axis=1)
    amax = tl.max(tl.where(nonfinite, 0.0, magnitude), axis=1)
    return bad, amax


@triton.jit
def _offsets(
    block, lane, n_blocks, blocks_per_row, cols, TILE: tl.constexpr, STEP: tl.constexpr, EVEN: tl.constexpr
):
    """Element offsets and mask of positions lane, lane + STEP, ... of each tile."""
    j = tl.arange(0, TILE // STEP) * STEP + lane
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
):
    block = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    offsets, valid, index = _offsets(block, 0, n_blocks, blocks_per_row, cols, TILE, 1, EVEN)
    x = tl.load(x_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
    if HAS_SCALE:
        bad, amax = _tile_stats(x)
        exponent = _tile_exponent(amax, LIMIT, EMAX, SCALE_MODE)
        v = x * _pow2(-exponent)[:, None]
    else:
        v = x
    if ROUND == 3:  # noqa: SIM108  (a constexpr branch: the noise exists only when used)
        noise = tl.rand(seed, index.to(tl.int32))
    else:
        noise = 0.0
    r, e = _grid(v, noise, MBITS, EMIN, EMAX, IS_INT, ROUND)
    q = _magnitude(r, e, MBITS, MAXV, IS_INT)
    negative = v.to(tl.int32, bitcast=True) < 0
    if FNUZ or IS_INT:  # no negative zero
        negative = negative & (q > 0.0)
    # the sign bit set directly: Triton negates as 0 - q, which loses -0
    signed = (q.to(tl.int32, bitcast=True) | (negative.to(tl.int32) << 31)).to(tl.float32, bitcast=True)
    if HAS_INF:
        signed = tl.where(tl.abs(v) == float("inf"), v, signed)
    signed = tl.where(v != v, v, signed)
    if HAS_SCALE:
        signed = signed * _pow2(exponent)[:, None]
        signed = tl.where((bad > 0)[:, None], float("nan"), signed)
    tl.store(out_ptr + offsets, signed.to(out_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _lane_codes(
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
    MAXV: tl.constexpr,
    MAX_CODE: tl.constexpr,
    IS_INT: tl.constexpr,
    FNUZ: tl.constexpr,
    HAS_INF: tl.constexpr,
    NAN_CODE: tl.constexpr,
    ROUND: tl.constexpr,
):
    """Codes of one lane of elements: integer arithmetic on the grid point, no decoding of floats."""
    v = x * to_grid[:, None] if HAS_SCALE else x
    if ROUND == 3:  # noqa: SIM108
        noise = tl.rand(seed, index.to(tl.int32))
    else:
        noise = 0.0
    r, e = _grid(v, noise, MBITS, EMIN, EMAX, IS_INT, ROUND)
    k = r.to(tl.int32)
    sign = v.to(tl.int32, bitcast=True) < 0
    if IS_INT:
        k = tl.minimum(k, MAX_CODE)
        code = tl.where(sign, -k, k) & ((1 << BITS) - 1)
    else:
        # a grid point r * 2**(e - m) with e >= emin has the code (e - emin) * 2**m + r (subnormals,
        # normals and a carry into the next binade alike); beyond max it saturates
        over = r * _pow2_normal(e - MBITS) > MAXV
        magnitude = tl.where(over, MAX_CODE, ((e - EMIN) << MBITS) + k)
        if FNUZ:
            sign = sign & (magnitude > 0)
        code = magnitude | (sign.to(tl.int32) << (BITS - 1))
        if HAS_INF:
            inf_code = (((1 << (BITS - 1 - MBITS)) - 1) << MBITS) | (sign.to(tl.int32) << (BITS - 1))
            code = tl.where(tl.abs(v) == float("inf"), inf_code, code)
    code = tl.where(v != v, NAN_CODE, code)
    if HAS_SCALE:
        code = tl.where((bad > 0)[:, None], NAN_CODE, code)
    return code


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
    MAXV: tl.constexpr,
    MAX_CODE: tl.constexpr,
    LIMIT: tl.constexpr,
    IS_INT: tl.constexpr,
    FNUZ: tl.constexpr,
    HAS_INF: tl.constexpr,
    NAN_CODE: tl.constexpr,
    SCALE_MODE: tl.constexpr,
    ROUND: tl.constexpr,
):
    """Codes in lanes: one lane per code of a packed byte group (8-bit: 1, 4-bit: 2, 6-bit: 4), so
    packing is elementwise arithmetic with no data reshuffling between threads."""
    LANES: tl.constexpr = 1 if BITS == 8 else (2 if BITS == 4 else 4)
    block = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    o0, m0, i0 = _offsets(block, 0, n_blocks, blocks_per_row, cols, TILE, LANES, EVEN)
    x0 = tl.load(x_ptr + o0, mask=m0, other=0.0).to(tl.float32)
    bad, amax = _tile_stats(x0)
    if LANES >= 2:
        o1, m1, i1 = _offsets(block, 1, n_blocks, blocks_per_row, cols, TILE, LANES, EVEN)
        x1 = tl.load(x_ptr + o1, mask=m1, other=0.0).to(tl.float32)
        bad1, amax1 = _tile_stats(x1)
        bad, amax = tl.maximum(bad, bad1), tl.maximum(amax, amax1)
    if LANES == 4:
        o2, m2, i2 = _offsets(block, 2, n_blocks, blocks_per_row, cols, TILE, LANES, EVEN)
        o3, m3, i3 = _offsets(block, 3, n_blocks, blocks_per_row, cols, TILE, LANES, EVEN)
        x2 = tl.load(x_ptr + o2, mask=m2, other=0.0).to(tl.float32)
        x3 = tl.load(x_ptr + o3, mask=m3, other=0.0).to(tl.float32)
        bad2, amax2 = _tile_stats(x2)
        bad3, amax3 = _tile_stats(x3)
        bad, amax = tl.maximum(bad, tl.maximum(bad2, bad3)), tl.maximum(amax, tl.maximum(amax2, amax3))
    if HAS_SCALE:
        exponent = _tile_exponent(amax, LIMIT, EMAX, SCALE_MODE)
        to_grid = _pow2(-exponent)
        tl.store(
            scales_ptr + block, tl.where(bad > 0, 255, exponent + 127).to(tl.uint8), mask=block < n_blocks
        )
    else:
        to_grid = amax
    c0 = _lane_codes(x0, to_grid, bad, i0, seed, HAS_SCALE, BITS, MBITS, EMIN, EMAX, MAXV, MAX_CODE,
                     IS_INT, FNUZ, HAS_INF, NAN_CODE, ROUND)  # fmt: skip
    groups = tl.arange(0, TILE // LANES)
    if LANES == 1:
        offsets = block[:, None] * TILE + groups[None, :]
        tl.store(codes_ptr + offsets, c0.to(tl.uint8), mask=offsets < code_bytes)
    elif LANES == 2:
        c1 = _lane_codes(x1, to_grid, bad, i1, seed, HAS_SCALE, BITS, MBITS, EMIN, EMAX, MAXV, MAX_CODE,
                         IS_INT, FNUZ, HAS_INF, NAN_CODE, ROUND)  # fmt: skip
        offsets = block[:, None] * (TILE // 2) + groups[None, :]
        tl.store(codes_ptr + offsets, (c0 | (c1 << 4)).to(tl.uint8), mask=offsets < code_bytes)
    else:
        c1 = _lane_codes(x1, to_grid, bad, i1, seed, HAS_SCALE, BITS, MBITS, EMIN, EMAX, MAXV, MAX_CODE,
                         IS_INT, FNUZ, HAS_INF, NAN_CODE, ROUND)  # fmt: skip
        c2 = _lane_codes(x2, to_grid, bad, i2, seed, HAS_SCALE, BITS, MBITS, EMIN, EMAX, MAXV, MAX_CODE,
                         IS_INT, FNUZ, HAS_INF, NAN_CODE, ROUND)  # fmt: skip
        c3 = _lane_codes(x3, to_grid, bad, i3, seed, HAS_SCALE, BITS, MBITS, EMIN, EMAX, MAXV, MAX_CODE,
                         IS_INT, FNUZ, HAS_INF, NAN_CODE, ROUND)  # fmt: skip
        base = block[:, None] * (TILE // 4 * 3) + groups[None, :] * 3
        tl.store(codes_ptr + base, ((c0 | (c1 << 6)) & 0xFF).to(tl.uint8), mask=base < code_bytes)
        tl.store(
            codes_ptr + base + 1, (((c1 >> 2) | (c2 << 4)) & 0xFF).to(tl.uint8), mask=base + 1 < code_bytes
        )
        tl.store(codes_ptr + base + 2, ((c2 >> 4) | (c3 << 2)).to(tl.uint8), mask=base + 2 < code_bytes)


@triton.jit
def _load_codes(codes_ptr, block, code_bytes, TILE: tl.constexpr, BLOCKS: tl.constexpr, BITS: tl.constexpr):
    if BITS == 8:
        offsets = block[:, None] * TILE + tl.arange(0, TILE)[None, :]
        return tl.load(codes_ptr + offsets, mask=offsets < code_bytes, other=0).to(tl.int32)
    elif BITS == 4:
        offsets = block[:, None] * (TILE // 2) + tl.arange(0, TILE // 2)[None, :]
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
):
    block = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    offsets, valid, _ = _offsets(block, 0, n_blocks, blocks_per_row, cols, TILE, 1, EVEN)
    code = _load_codes(codes_ptr, block, code_bytes, TILE, BLOCKS, BITS)
    values = tl.load(table_ptr + code)
    if HAS_SCALE:
        scale_code = tl.load(scales_ptr + block, mask=block < n_blocks, other=127).to(tl.int32)
        values = values * _pow2(scale_code - 127)[:, None]
        values = tl.where((scale_code == 255)[:, None], float("nan"), values)
    tl.store(out_ptr + offsets, values.to(out_ptr.dtype.element_ty), mask=valid)


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
def _element_params(nspec: NumberSpec, virtual: bool) -> dict[str, object]:
    """Kernel constants of an element format (cached: encoding the max value costs torch ops)."""
    from ._torchcast import _nan_code

    params: dict[str, object] = {
        "MBITS": nspec.mbits,
        "EMIN": nspec.emin,
        "EMAX": nspec.emax,
        "MAXV": float(nspec.max),
        "IS_INT": nspec.is_int,
        "FNUZ": nspec.infnan is InfNaN.FNUZ,
        "HAS_INF": nspec.has_inf,
    }
    if not virtual:
        params |= {"BITS": nspec.bits, "MAX_CODE": _max_code(nspec), "NAN_CODE": _nan_code(nspec)}
    return params


@dataclass(frozen=True)
class LaunchConfig:
    """Elements one program handles and its warps (tuned on an H100: see docs/benchmarks.md)."""

    elements: int = _ELEMENTS_PER_PROGRAM
    num_warps: int = 4

    def blocks(self, tile: int) -> int:
        return max(1, self.elements // tile)


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
    per_program = config.blocks(tile)
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
    if virtual:
        out = torch.empty(shape, dtype=out_dtype or x.dtype, device=x.device)
        if blocks:
            _virtual_kernel[grid](x, out, blocks, per_row, cols, seed, **common)
        return out
    codes = torch.empty(code_bytes, dtype=torch.uint8, device=x.device)
    scales = torch.empty(blocks if has_scale else 0, dtype=torch.uint8, device=x.device)
    if blocks:
        _actual_kernel[grid](x, codes, scales, blocks, per_row, cols, code_bytes, seed, **common)
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
    table = _decode_table_cpu(nspec.code).to(device=device, dtype=torch.float32)
    out = torch.empty(t.shape, dtype=torch_dtype or t.source_dtype, device=device)
    per_program = config.blocks(tile)
    if blocks:
        _upcast_kernel[(triton.cdiv(blocks, per_program),)](
            t.codes, t.scales if has_scale else t.codes, table, out, blocks, per_row, cols,
            t.codes.numel(), TILE=tile, BLOCKS=per_program, HAS_SCALE=has_scale,
            EVEN=has_scale and cols % tile == 0, BITS=nspec.bits, num_warps=config.num_warps,
            enable_fp_fusion=False,
        )  # fmt: skip
    return out
