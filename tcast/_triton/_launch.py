"""Launching the kernels: geometry, per-format constants, engine choices (fp8 conversion, word
packing, run loads) and the host API of the Triton engine."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

from .._codes import decode_table, max_code, nan_code
from .._datatype import DataType
from .._engine import interpreting
from .._modes import RoundMode, ScaleMode
from .._number import InfNaN, NumberSpec
from .._pack import packed_nbytes
from .._scales import step_up_limit
from .._tensor import Tensor
from ._kernels import actual_kernel, upcast_kernel, virtual_kernel

_ROUND = {RoundMode.EVEN: 0, RoundMode.NEAREST: 1, RoundMode.ZERO: 2, RoundMode.STOCHASTIC: 3}
_SCALE = {ScaleMode.MAX: 0, ScaleMode.MIDMAX: 1, ScaleMode.CEIL: 2, ScaleMode.EVEN: 3}
_PROGRAM_BYTES = 8192  # of the float stream (input of a cast, output of an upcast) per program
_UNSCALED_TILE = 256  # unscaled casts walk the flat tensor in runs of this many elements


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
    params = _format_params(nspec) | {"EMAX": nspec.emax}
    if virtual:  # saturation on values; the actual kernel saturates codes
        params["MAXV"] = float(nspec.max)
    else:
        params |= {"BITS": nspec.bits, "MAX_CODE": max_code(nspec), "NAN_CODE": nan_code(nspec)}
    return params


def _as_bits(t: torch.Tensor, loading: bool = False) -> torch.Tensor:
    """bfloat16 tensors travel as int16 bits: always when loaded (the kernels widen them by a
    shift), and when stored only under the interpreter (see `narrow` in _memory)."""
    if t.dtype is torch.bfloat16 and (loading or interpreting()):
        return t.view(torch.int16)
    return t


def _hardware_fp8(nspec: NumberSpec, roundmode: RoundMode, has_scale: bool, device: torch.device) -> int:
    """1 (e4m3fn) or 2 (e5m2) where the GPU's fp8 conversion gives TorchCast's codes: round to
    nearest even of tile-scaled values (in range, so saturation is all that overflow needs; a
    NaN or Inf anywhere makes the tile NaN) on sm_89 or later; else 0 (integer arithmetic).
    Never under the interpreter, whose fp8 conversion is not the hardware's."""
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
        common |= {"LIMIT": float(step_up_limit(nspec, scalemode)), "SCALE_MODE": _SCALE[scalemode]}
    else:
        common |= {"LIMIT": 0.0, "SCALE_MODE": 0}
    common["HW_FP8"] = _hardware_fp8(nspec, roundmode, has_scale, x.device)
    source = _as_bits(x, loading=True)
    if virtual:
        out = torch.empty(shape, dtype=out_dtype or x.dtype, device=x.device)
        if blocks:
            virtual_kernel[grid](source, _as_bits(out), blocks, per_row, cols, seed, **common)
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
        actual_kernel[grid](
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
    nspec = t.dtype.nspec
    device = t.codes.device
    tile, per_row, cols, blocks = _geometry(t.shape, t.dtype)
    has_scale = t.scales is not None
    # codes decode by arithmetic where 2**(126 + emin) is a float32; else gather from a value table
    decode = nspec.is_int or nspec.emin <= 1
    table = t.codes if decode else decode_table(nspec.code).to(device=device, dtype=torch.float32)
    out = torch.empty(t.shape, dtype=torch_dtype or t.source_dtype, device=device)
    per_program = config.blocks(tile, out.element_size())
    if blocks:
        upcast_kernel[(triton.cdiv(blocks, per_program),)](
            t.codes, t.scales if has_scale else t.codes, table, _as_bits(out), blocks, per_row, cols,
            t.codes.numel(), TILE=tile, BLOCKS=per_program, HAS_SCALE=has_scale,
            EVEN=has_scale and cols % tile == 0, BITS=nspec.bits, DECODE=decode,
            VEC=min(tile, 16 // out.element_size()), num_warps=config.num_warps, enable_fp_fusion=False,
            **_format_params(nspec),
        )  # fmt: skip
    return out
