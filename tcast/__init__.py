"""TensorCast: low-precision number formats and casts (the numeric core of coreopt).

    import tcast
    y = tcast.cast(x, tcast.mxfp4e2)                      # virtual (fake-quantized) cast
    t = tcast.cast(x, "mxfp8e4", castmode="actual")      # packed codes + E8M0 scales
    assert torch.equal(tcast.upcast(t), tcast.cast(x, "mxfp8e4"))

Predefined types are module attributes (`tcast.mxfp6e2`, `tcast.int8_f`, ...) built on first use.
"""

from __future__ import annotations

from typing import Any

from ._codebook import Codebook, codebook
from ._datatype import ALIASES, PREDEFINED, DataType, datatype, lookup, resolve_name
from ._engine import Support, supports
from ._formats import number
from ._metrics import energies, snr_db, sqnr_db
from ._modes import CastMode, ComputeMode, RoundMode, ScaleMode, defaults, initialize
from ._number import InfNaN, Kind, NumberSpec
from ._scale import ScaleSpec, Tile, scale
from ._tensor import Tensor

__version__ = "0.1.0"

__all__ = [
    "ALIASES",
    "PREDEFINED",
    "CastMode",
    "Codebook",
    "ComputeMode",
    "DataType",
    "InfNaN",
    "Kind",
    "NumberSpec",
    "RoundMode",
    "ScaleMode",
    "ScaleSpec",
    "Support",
    "Tensor",
    "Tile",
    "__version__",
    "cast",
    "cast_file",
    "code_table",
    "codebook",
    "datatype",
    "decode",
    "defaults",
    "energies",
    "exponent_codes",
    "exponent_scales",
    "float_scales",
    "hadamard",
    "hadamard_inverse",
    "initialize",
    "lookup",
    "number",
    "pack_codes",
    "packed_nbytes",
    "scale",
    "snr_db",
    "sparse",
    "sparse_mask",
    "sqnr_db",
    "supports",
    "unpack_codes",
    "upcast",
    "upcast_file",
]


def _as_datatype(dtype: Any) -> DataType:
    if isinstance(dtype, DataType):
        return dtype
    if isinstance(dtype, str) and resolve_name(dtype) is not None:
        return lookup(dtype)
    return DataType(dtype)  # an unscaled number spec: "e4m3fn", torch.float8_e5m2, ...


def _generator(x: Any, seed: int | None, generator: Any) -> Any:
    if generator is not None or seed is None:
        return generator
    import torch

    return torch.Generator(device=x.device).manual_seed(seed)


def cast(
    x: Any,
    dtype: Any,
    roundmode: Any = None,
    scalemode: Any = None,
    castmode: Any = None,
    *,
    seed: int | None = None,
    generator: Any = None,
    out_dtype: Any = None,
    computemode: Any = None,
    measure: bool = False,
    tensor_scale: Any = None,
    scales: Any = None,
    zero_points: Any = None,
) -> Any:
    """Cast a float32/float16/bfloat16 tensor to a tcast DataType.

    castmode "virtual" (default) returns a tensor of the input's dtype (or `out_dtype`) holding
    the representable values; "actual" returns a `tcast.Tensor` of packed codes and scales, with
    `measure` also the energies of the input and of the cast's error (`Tensor.signal`, `.noise`:
    what `tcast.energies(x, tcast.upcast(t, t.value_dtype))` gives, at a fraction of the cost).
    Stochastic rounding is reproducible with `seed` or a `generator` (the Triton engine draws its
    own Philox stream from them). computemode auto (default) runs TritonCast on CUDA tensors it
    supports (see `tcast.supports`), else TorchCast. The input is never modified.

    `tensor_scale` gives the scale per tensor instead of deriving it from the tensor's amax: the
    outer fp32 scale of a two-level type (nvfp4) or the scale of a type with one float scale per
    tensor (fp8_F), as calibration or a previous step supplies it. It is rounded into the scale's
    format; the cast then reads the input once (without it, a pass over the whole tensor finds the
    amax first), values beyond the scale's range saturate, and a NaN or Inf in the input affects
    only its own element (two levels: its tile). Give a Python float: a tensor on the GPU is
    read back to check it, which waits for the GPU. A two-level tensor scale beyond 2**126 over
    the larger of the tile scale's and the element's max is cast by TorchCast (TritonCast
    divides in float32).

    `scales` (and, for unsigned types, `zero_points`) give every tile's scale instead, as
    `Tensor.scale_grid()` / `zero_grid()` hold them (E8M0 codes, or values of the scale format):
    the elements are rounded to that fixed grid - what GPTQ does column by column - by either
    engine (TritonCast: E8M0 or float scales without zero points; bit-exact with TorchCast).
    """
    from . import _torchcast

    datatype_ = _as_datatype(dtype)
    if scales is not None or zero_points is not None:
        return _cast_under(x, datatype_, roundmode, castmode, computemode, seed, generator, out_dtype,
                           measure, scales, zero_points)  # fmt: skip
    round_, scale_, actual = _resolve_modes(roundmode, scalemode, castmode, measure)
    _torchcast._check_input(x)
    given = _rounded_tensor_scale(datatype_, tensor_scale)
    if datatype_.nspec.is_codebook:
        return _codebook_cast(x, datatype_, round_, scale_, actual, out_dtype, measure, given)
    return _engine_cast(
        x, datatype_, round_, scale_, actual, computemode, seed, generator, out_dtype, measure, given
    )


def _resolve_modes(
    roundmode: Any, scalemode: Any, castmode: Any, measure: bool
) -> tuple[RoundMode, ScaleMode, bool]:
    """Argument checking: the round and scale modes, whether the cast is actual (measure needs one)."""
    from ._modes import resolve_cast, resolve_round, resolve_scale

    round_ = resolve_round(roundmode)
    scale_ = resolve_scale(scalemode)
    actual = resolve_cast(castmode) is CastMode.ACTUAL
    if measure and not actual:
        raise ValueError("measure records the error of an actual cast (castmode='actual')")
    return round_, scale_, actual


def _rounded_tensor_scale(datatype_: DataType, tensor_scale: Any) -> float | None:
    """The caller's scale per tensor rounded into the scale's format (None: derive it from the amax)."""
    from . import _primitives

    return None if tensor_scale is None else _primitives.rounded_tensor_scale(datatype_, tensor_scale)


def _codebook_cast(
    x: Any, datatype_: DataType, round_: RoundMode, scale_: ScaleMode, actual: bool, out_dtype: Any, measure: bool,
    given: float | None,
) -> Any:  # fmt: skip
    """Codebook types have their own engine (LUTCast), which takes no scale per tensor."""
    from . import _lutcast

    if given is not None:
        raise ValueError(f"tensor_scale: codebook type {datatype_.name} takes no scale per tensor")
    if actual:
        return _lutcast.actual_cast(x, datatype_, round_, scale_, measure)
    return _lutcast.virtual_cast(x, datatype_, round_, scale_, out_dtype)


def _engine_cast(
    x: Any, datatype_: DataType, round_: RoundMode, scale_: ScaleMode, actual: bool, computemode: Any,
    seed: int | None, generator: Any, out_dtype: Any, measure: bool, given: float | None,
) -> Any:  # fmt: skip
    """Choosing the engine: TritonCast where computemode and `supports` allow it, else TorchCast."""
    from . import _primitives, _torchcast
    from ._engine import use_triton
    from ._modes import resolve_compute

    if use_triton(
        datatype_, resolve_compute(computemode), tuple(x.shape), x.dtype, x.is_cuda, "cast to", round_, given
    ):
        return _triton_cast(x, datatype_, round_, scale_, actual, seed, generator, out_dtype, measure, given)
    gen = _generator(x, seed, generator)
    on_device = None if given is None else _primitives.given_tensor_scale(given, x.device)
    if actual:
        return _torchcast.actual_cast(x, datatype_, round_, scale_, gen, measure, on_device)
    return _torchcast.virtual_cast(x, datatype_, round_, scale_, gen, out_dtype, on_device)


def _triton_cast(
    x: Any, datatype_: DataType, round_: RoundMode, scale_: ScaleMode, actual: bool, seed: int | None,
    generator: Any, out_dtype: Any, measure: bool, given: float | None,
) -> Any:  # fmt: skip
    from . import _triton

    kernel_seed = _kernel_seed(x, seed, generator) if round_ is RoundMode.STOCHASTIC else 0
    result = _triton.cast(
        x, datatype_, round_, scale_, kernel_seed, not actual, None if actual else out_dtype, given
    )
    if measure:
        import dataclasses

        signal, noise = energies(x, upcast(result, result.value_dtype))
        result = dataclasses.replace(result, signal=signal, noise=noise)
    return result


def _cast_under(
    x: Any, datatype_: DataType, roundmode: Any, castmode: Any, computemode: Any, seed: int | None, generator: Any,
    out_dtype: Any, measure: bool, scales: Any, zero_points: Any,
) -> Any:  # fmt: skip
    """A cast to the per-tile scales (and zero points) a caller gives: TritonCast's kernel for
    them where it supports the cast (auto: on CUDA), else TorchCast's element rounding."""
    from . import _torchcast
    from ._engine import choose, given_support
    from ._modes import resolve_cast, resolve_compute, resolve_round

    if scales is None:
        raise ValueError("zero_points come with the scales they belong to")
    if datatype_.nspec.is_codebook:
        raise ValueError(f"codebook type {datatype_.name} chooses its tables itself: no scales to give")
    round_ = resolve_round(roundmode)
    actual = resolve_cast(castmode) is CastMode.ACTUAL
    if measure and not actual:
        raise ValueError("measure records the error of an actual cast (castmode='actual')")
    _torchcast._check_input(x)
    import torch

    given = (
        torch.as_tensor(scales, device=x.device),
        None if zero_points is None else torch.as_tensor(zero_points, device=x.device),
    )
    compute = resolve_compute(computemode)
    what = f"cast to {datatype_.name} under given scales"
    if choose(compute, given_support(datatype_, x, round_), bool(x.is_cuda), what):
        from ._triton import cast_under

        result = cast_under(x, datatype_, round_, given[0], not actual, None if actual else out_dtype)
        if measure:
            import dataclasses

            signal, noise = energies(x, upcast(result, result.value_dtype))
            result = dataclasses.replace(result, signal=signal, noise=noise)
        return result
    gen = _generator(x, seed, generator)
    if actual:
        return _torchcast.actual_cast(x, datatype_, round_, ScaleMode.MAX, gen, measure, None, given)
    return _torchcast.virtual_cast(x, datatype_, round_, ScaleMode.MAX, gen, out_dtype, None, given)


def _kernel_seed(x: Any, seed: int | None, generator: Any) -> int:
    """The Philox key of a stochastic Triton cast: `seed`, else drawn from the generator."""
    if seed is not None:
        return int(seed) & 0x7FFFFFFF
    import torch

    device = generator.device if generator is not None else "cpu"
    return int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=device))


def upcast(t: Tensor, torch_dtype: Any = None, computemode: Any = None) -> Any:
    """Values of an actual cast, in `torch_dtype` (default: the dtype that was cast)."""
    from . import _torchcast
    from ._engine import use_triton
    from ._modes import resolve_compute

    if not isinstance(t, Tensor):
        raise TypeError(f"upcast takes a tcast.Tensor, got {type(t).__name__}")
    mode = resolve_compute(computemode)
    if t.dtype.nspec.is_codebook:
        from . import _lutcast

        return _lutcast.upcast(t, torch_dtype)
    if use_triton(t.dtype, mode, t.shape, t.source_dtype, t.codes.is_cuda, "upcast"):
        from . import _triton

        return _triton.upcast(t, torch_dtype)
    return _torchcast.upcast(t, torch_dtype)


# Functions whose modules import torch: loaded on first use, so `import tcast` (and `tcast --help`,
# `tcast list`) costs no torch import.
_LAZY = {
    "pack_codes": "_pack",
    "packed_nbytes": "_pack",
    "unpack_codes": "_pack",
    "sparse": "_sparse",
    "sparse_mask": "_sparse",
    "exponent_scales": "_scales",
    "decode": "_codes",
    "exponent_codes": "_scales",
    "float_scales": "_primitives",
    "hadamard": "_hadamard",
    "hadamard_inverse": "_hadamard",
    "cast_file": "_files",
    "upcast_file": "_files",
    "code_table": "_files",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    else:
        key = ALIASES.get(name, name)
        if key not in PREDEFINED:
            raise AttributeError(f"module 'tcast' has no attribute {name!r}")
        value = lookup(key)
    globals()[name] = value
    return value
