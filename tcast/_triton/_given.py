"""The Triton cast under per-tile scales a caller gives (GPTQ rounds columns onto a grid it fixed
first): the scales are checked by TorchCast's own rule (`_primitives.checked_scales`) and stored
as given, each tile's scale becomes a float32 divisor (an E8M0 code its power of two, exact), and
one kernel rounds every element over it, as the float-scale kernels do under a caller's scale per
tensor."""

from __future__ import annotations

import math

import torch
import triton

from .._blocks import plan
from .._datatype import DataType
from .._engine import interpreting
from .._modes import RoundMode
from .._pack import packed_nbytes
from .._primitives import checked_scales, compute_dtype
from .._tensor import Tensor
from ._kernels import given_tiles_kernel
from ._launch import ROUND_CODES, LaunchConfig, as_bits, element_params, geometry, lean_nearest


def _divisors(per_block: torch.Tensor, exponent: bool) -> torch.Tensor:
    """float32 divisors, one per tile: an E8M0 code's power of two built from its bits (code 0 is
    2**-127, a subnormal; 255 NaN), or a float scale's value (exact in float32)."""
    if not exponent:
        return per_block.reshape(-1).float()
    codes = per_block.reshape(-1).to(torch.int32)
    powers = (codes << 23).view(torch.float32)
    powers = torch.where(codes == 0, 2.0**-127, powers)
    return torch.where(codes == 255, math.nan, powers)


def _divisor_arm(divisors: torch.Tensor) -> int:
    """What the kernel may assume of the divisors (`_launch._divisors`): 0 nothing (small ones are
    prescaled); 1 at least 2**-64; 2 also at most 2**126, on a GPU. One read-back."""
    if divisors.numel() == 0:
        return 0
    smallest, largest = (float(v) for v in torch.aminmax(torch.nan_to_num(divisors, nan=1.0)))
    if smallest < 2.0**-64:
        return 0
    return 1 if largest > 2.0**126 or interpreting() else 2


def cast_under(
    x: torch.Tensor,
    dtype: DataType,
    roundmode: RoundMode,
    scales: torch.Tensor,
    virtual: bool,
    out_dtype: torch.dtype | None = None,
    config: LaunchConfig = LaunchConfig(),
) -> torch.Tensor | Tensor:
    """The cast of `x` under per-tile `scales` shaped as `Tensor.scale_grid()` gives them (the
    caller has checked `_engine.supports` and `given_support`)."""
    sspec, nspec = dtype.sspec, dtype.nspec
    assert sspec is not None
    x = x.contiguous()
    shape = tuple(x.shape)
    per_block = checked_scales(dtype, plan(shape, sspec), scales.to(x.device))
    divisors = _divisors(per_block, sspec.is_exponent)
    geo = geometry(shape, dtype)
    out = out_dtype or x.dtype
    per_program = config.blocks(geo.tile, max(x.element_size(), out.itemsize if virtual else 0))
    constants = {
        "TILE": geo.tile, "TCOLS": geo.tcols, "BLOCKS": per_program, "EVEN": geo.even, "VIRTUAL": virtual,
        "ROUND": ROUND_CODES[roundmode], "LEAN": lean_nearest(nspec, roundmode), "DIVISORS": _divisor_arm(divisors),
        "num_warps": config.warps(geo.tile), "enable_fp_fusion": False,
    } | element_params(nspec, False)  # fmt: skip
    grid = (triton.cdiv(geo.blocks, per_program),)
    source = as_bits(x, loading=True)
    if virtual:
        result = torch.empty(shape, dtype=out, device=x.device)
        if geo.blocks:
            given_tiles_kernel[grid](
                source, as_bits(result), divisors, *geo.args(), 0, geo.stride, **constants
            )
        return result
    code_bytes = packed_nbytes(geo.stored, nspec.bits)
    codes = torch.empty(code_bytes, dtype=torch.uint8, device=x.device)
    if geo.blocks:
        given_tiles_kernel[grid](source, codes, divisors, *geo.args(), code_bytes, geo.stride, **constants)
    if sspec.is_exponent:
        stored = per_block.reshape(-1).to(torch.uint8)
    else:  # as TorchCast stores them: the format's dtype, else its work dtype
        stored = per_block.reshape(-1).to(sspec.scale.torch_dtype or compute_dtype(dtype, x.dtype, roundmode))
    return Tensor(
        dtype=dtype, shape=shape, source_dtype=x.dtype, codes=codes, scales=stored, zeros=None,
        numel_padded=geo.stored,
    )  # fmt: skip
