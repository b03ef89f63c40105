"""Which engine runs a cast: TorchCast everywhere, TritonCast where its kernels apply.

`computemode` auto takes Triton for CUDA tensors whose request it supports, else Torch; `triton`
insists (a ValueError says why it cannot); `torch` never uses Triton. CPU tensors run the Triton
kernels only when asked explicitly and TRITON_INTERPRET=1 is set (how CI checks them).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from ._datatype import DataType
from ._modes import ComputeMode
from ._number import InfNaN, NumberSpec

_TRITON_BITS = (4, 6, 8)
_TILES = (8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Support:
    """Whether the Triton engine takes a request; `reason` says why not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


@functools.cache
def _triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def _element_support(nspec: NumberSpec) -> str:
    if nspec.is_codebook:
        return f"codebook {nspec.code}: codebooks are cast by TorchCast"
    if nspec.is_uint or nspec.is_exponent:
        return f"element format {nspec.code}: Triton casts signed float and int formats"
    if nspec.infnan is InfNaN.INUZ:
        return f"element format {nspec.code}: P3109's Inf/NaN codes are cast by TorchCast"
    if nspec.bits not in _TRITON_BITS:
        return f"element format {nspec.code} has {nspec.bits} bits; Triton packs 4, 6 or 8"
    if not nspec.is_int and (nspec.emin - nspec.mbits < -126 or nspec.emax > 100):
        return f"element format {nspec.code} reaches beyond float32's normal range"
    return ""


_CPU_REASON = "a CPU tensor (Triton runs on CUDA, or on the CPU with TRITON_INTERPRET=1)"


def _check(dtype: DataType, shape: tuple[int, ...] | None, source: Any, on_cuda: bool | None) -> Support:
    """Every rule, for a dtype alone or for a tensor of `shape`, float dtype `source`, on a device."""
    if not _triton_importable():
        return Support(False, "triton is not installed")
    problem = _element_support(dtype.nspec)
    if problem:
        return Support(False, problem)
    sspec = dtype.sspec
    if sspec is not None:
        if not sspec.is_exponent or sspec.scale.code != "e8m0" or sspec.zero is not None:
            return Support(False, f"scale {sspec.code}: Triton takes E8M0 exponent scales")
        if len(sspec.tiles) != 1 or sspec.is_channel:
            return Support(False, f"scale {sspec.code}: Triton takes one tile along the last dim")
        tile = sspec.tiles[0]
        if tile.size not in _TILES:
            return Support(False, f"tile {tile.size}: Triton takes tiles of 8 to 256")
        if dtype.nspec.bits == 6 and tile.size % 4:
            return Support(False, "6-bit codes need tiles of a multiple of 4")
    if shape is not None and sspec is not None:
        if not shape:
            return Support(False, "a tile scale needs a tensor of rank >= 1")
        if sspec.tiles[0].dim not in (-1, len(shape) - 1):
            return Support(False, f"tile along dim {sspec.tiles[0].dim}, not the last dim")
    return tensor_support(source, on_cuda)


def tensor_support(source: Any, on_cuda: bool | None) -> Support:
    """The rules every Triton kernel has for its input: triton importable, a float32/16/bf16
    tensor (when `source` is given), on CUDA or under the interpreter."""
    if not _triton_importable():
        return Support(False, "triton is not installed")
    if source is not None:
        import torch

        if source not in (torch.float32, torch.float16, torch.bfloat16):
            return Support(False, f"input dtype {source}")
    if on_cuda is False and not interpreting():
        return Support(False, _CPU_REASON)
    return Support(True)


def supports(dtype: DataType, x: Any = None) -> Support:
    """Can TritonCast run this cast (of tensor `x`, when given)? The reason when it cannot."""
    if x is None:
        return _check(dtype, None, None, None)
    return _check(dtype, tuple(x.shape), x.dtype, bool(x.is_cuda))


def use_triton(
    dtype: DataType, computemode: ComputeMode, shape: tuple[int, ...], source: Any, on_cuda: bool, what: str
) -> bool:
    """Pick the engine for a cast (or an upcast) of a tensor; a Triton request that cannot run
    raises ValueError with the reason. Auto takes Triton on CUDA only."""
    if computemode is ComputeMode.TORCH:
        return False
    return choose(computemode, _check(dtype, shape, source, on_cuda), on_cuda, f"{what} {dtype.name}")


def choose(computemode: ComputeMode, support: Support, on_cuda: bool, what: str) -> bool:
    """Triton or not, given what it supports: auto takes it on CUDA only, `triton` insists (a
    ValueError says why it cannot), `torch` never."""
    if computemode is ComputeMode.TORCH:
        return False
    if computemode is ComputeMode.TRITON:
        if not support:
            raise ValueError(f"computemode triton cannot {what}: {support.reason}")
        return True
    return support.ok and on_cuda
