"""Which engine runs a cast: TorchCast everywhere, TritonCast where its kernels apply.

`computemode` auto takes Triton for CUDA tensors whose request it supports, else Torch; `triton`
insists (a ValueError says why it cannot); `torch` never uses Triton. CPU tensors run the Triton
kernels only when asked explicitly and TRITON_INTERPRET=1 is set (how CI checks them).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from dataclasses import dataclass
from typing import Any

from ._datatype import DataType
from ._modes import ComputeMode, RoundMode
from ._number import InfNaN, NumberSpec
from ._scale import ScaleSpec

_TRITON_BITS = (4, 6, 8)
_MAX_TILE = 16384  # values of one tile (or channel row) that a program holds in registers


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


def _float_scale_support(sspec: ScaleSpec) -> str:
    """Float scales: per tensor in any float format (the host applies the scale rule after an
    amax pass); per tile or channel row in float32 or an 8-bit float (the kernel rounds them),
    two levels only over 8-bit tile scales."""
    scale = sspec.scale
    if scale.torch_dtype is None or scale.is_int or scale.is_uint:
        return f"scale {sspec.code}: Triton takes E8M0 or float scales"
    in_kernel = not sspec.is_tensor
    eight_bit = scale.bits == 8 and scale.infnan is not InfNaN.INUZ
    if in_kernel and not eight_bit and scale.torch_dtype is not _float32():
        return f"scale {sspec.code}: tile scales in Triton are float32 or 8-bit floats"
    if sspec.tensor_scale is not None and (not eight_bit or sspec.tensor_scale.torch_dtype is not _float32()):
        return f"scale {sspec.code}: two levels in Triton are 8-bit tile scales under a float32 one"
    return ""


def _float32() -> Any:
    import torch

    return torch.float32


def _tile_support(sspec: ScaleSpec, nspec: NumberSpec) -> str:
    """Tiles along the last dim (1-D, a channel row) or the last two (2-D), powers of two that a
    program holds in registers."""
    if sspec.is_tensor:
        return "" if not sspec.is_exponent else f"scale {sspec.code}: E8M0 per tensor is cast by TorchCast"
    if sspec.is_channel:
        if sspec.is_exponent:
            return f"scale {sspec.code}: E8M0 per channel is cast by TorchCast"
        return "" if sspec.tiles[0].dim == -1 else f"channel along dim {sspec.tiles[0].dim}, not the last dim"
    sizes = [t.size for t in sspec.tiles]
    if any(size & (size - 1) for size in sizes) or sizes[-1] < 8 or math.prod(sizes) > _MAX_TILE:
        return f"tile {'x'.join(map(str, sizes))}: Triton takes power-of-two tiles of 8 to {_MAX_TILE} values"
    if nspec.bits == 6 and math.prod(sizes) % 16:
        return "6-bit codes need tiles of a multiple of 16"
    return ""


def _shape_support(sspec: ScaleSpec, nspec: NumberSpec, shape: tuple[int, ...]) -> str:
    rank = len(shape)
    if sspec.is_tensor:
        return ""
    if not shape:
        return "a tile scale needs a tensor of rank >= 1"
    dims = [t.dim % rank if -rank <= t.dim < rank else None for t in sspec.tiles]
    if dims[-1] != rank - 1:
        return f"tile along dim {sspec.tiles[-1].dim}, not the last dim"
    if len(dims) == 2 and dims[0] != rank - 2:
        return f"2-D tile along dims {sspec.tiles[0].dim} and {sspec.tiles[1].dim}, not the last two"
    if sspec.is_channel and (shape[-1] > _MAX_TILE or (nspec.bits < 8 and shape[-1] & (shape[-1] - 1))):
        return f"channel rows of {shape[-1]} values (Triton: up to {_MAX_TILE}; powers of two below 8 bits)"
    return ""


def scalar_factors(dtype: DataType) -> tuple[float, float]:
    """The least and greatest factors the Triton float kernels multiply a tensor's one scalar
    (1, or two levels' tensor scale) by under 8-bit tile scales: the tile scales' smallest and
    largest values, and under two levels the element max too (each tile scale divides the tile's
    amax by the scalar times it)."""
    sspec = dtype.sspec
    assert sspec is not None
    largest = sspec.scale.max
    if sspec.tensor_scale is not None:
        largest = max(largest, dtype.nspec.max)
    return sspec.scale.smallest_subnormal, largest


def _given_scale_support(dtype: DataType, given: float) -> str:
    """A caller's two-level tensor scale whose products with the tile scales or the element max
    pass 2**126: the kernels divide by them in float32 (their reciprocals would leave its normal
    range), TorchCast in float64. A tensor scale computed from the data never gets there."""
    _, largest = scalar_factors(dtype)
    if given * largest > 2.0**126:
        return f"tensor_scale {given:g}: times {largest:g} it passes 2**126 (Triton divides in float32)"
    return ""


def _check(
    dtype: DataType,
    shape: tuple[int, ...] | None,
    source: Any,
    on_cuda: bool | None,
    roundmode: Any = None,
    given: float | None = None,
) -> Support:
    """Every rule, for a dtype alone or for a tensor of `shape`, float dtype `source`, on a device,
    under a caller's tensor scale `given` (already rounded into its format)."""
    if not _triton_importable():
        return Support(False, "triton is not installed")
    problem = _element_support(dtype.nspec)
    if problem:
        return Support(False, problem)
    sspec = dtype.sspec
    if sspec is not None:
        if sspec.zero is not None:
            return Support(False, f"scale {sspec.code}: zero points are cast by TorchCast")
        if sspec.is_exponent:
            problem = (
                "" if sspec.scale.code == "e8m0" else f"scale {sspec.code}: Triton takes E8M0 or float scales"
            )
        else:
            problem = _float_scale_support(sspec)
            if not problem and roundmode is RoundMode.STOCHASTIC:
                problem = "stochastic rounding under float scales is cast by TorchCast"
            if not problem and given is not None and sspec.tensor_scale is not None:
                problem = _given_scale_support(dtype, given)
        problem = problem or _tile_support(sspec, dtype.nspec)
        if not problem and shape is not None:
            problem = _shape_support(sspec, dtype.nspec, shape)
        if problem:
            return Support(False, problem)
    return tensor_support(source, on_cuda)


def given_support(dtype: DataType, x: Any, roundmode: RoundMode) -> Support:
    """Can TritonCast cast tensor `x` under per-tile scales a caller gives? Every float scale
    format (its values are exact float32 divisors) or E8M0, tiles as the scale-computing kernels
    take them; zero points, scales per tensor and stochastic rounding are TorchCast's."""
    if not _triton_importable():
        return Support(False, "triton is not installed")
    sspec = dtype.sspec
    problem = _element_support(dtype.nspec)
    if not problem and sspec is not None:
        scale = sspec.scale
        if sspec.zero is not None:
            problem = f"scale {sspec.code}: zero points are cast by TorchCast"
        elif sspec.is_tensor or sspec.tensor_scale is not None:
            problem = f"scale {sspec.code}: a scale per tensor is given as tensor_scale"
        elif roundmode is RoundMode.STOCHASTIC:
            problem = "stochastic rounding under given scales is cast by TorchCast"
        elif sspec.is_exponent and scale.code != "e8m0":
            problem = f"scale {sspec.code}: Triton takes E8M0 or float scales"
        elif not sspec.is_exponent and (
            scale.is_int or scale.is_uint or (scale.bits > 16 and scale.torch_dtype is not _float32())
        ):
            problem = f"scale {sspec.code}: given scales in Triton are floats of at most 16 bits, or float32"
        elif not sspec.is_exponent and (scale.max >= 2.0**128 or scale.smallest_subnormal < 2.0**-149):
            problem = f"scale {sspec.code}: its values reach beyond float32, which Triton divides in"
        problem = (
            problem or _tile_support(sspec, dtype.nspec) or _shape_support(sspec, dtype.nspec, tuple(x.shape))
        )
    if problem:
        return Support(False, problem)
    return tensor_support(x.dtype, bool(x.is_cuda))


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


def supports(dtype: DataType, x: Any = None, roundmode: Any = None) -> Support:
    """Can TritonCast run this cast (of tensor `x`, when given; in `roundmode`, when given)? The
    reason when it cannot."""
    from ._modes import resolve_round

    mode = None if roundmode is None else resolve_round(roundmode)
    if x is None:
        return _check(dtype, None, None, None, mode)
    return _check(dtype, tuple(x.shape), x.dtype, bool(x.is_cuda), mode)


def use_triton(
    dtype: DataType,
    computemode: ComputeMode,
    shape: tuple[int, ...],
    source: Any,
    on_cuda: bool,
    what: str,
    roundmode: RoundMode | None = None,
    given: float | None = None,
) -> bool:
    """Pick the engine for a cast (or an upcast) of a tensor, under a caller's tensor scale
    `given`; a Triton request that cannot run raises ValueError with the reason. Auto takes
    Triton on CUDA only."""
    if computemode is ComputeMode.TORCH:
        return False
    support = _check(dtype, shape, source, on_cuda, roundmode, given)
    return choose(computemode, support, on_cuda, f"{what} {dtype.name}")


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
