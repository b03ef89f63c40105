"""TensorCast: low-precision number formats and casts (the numeric core of coreopt).

    import tcast
    y = tcast.cast(x, tcast.mxfp4e2)                      # virtual (fake-quantized) cast
    t = tcast.cast(x, "mxfp8e4", castmode="actual")      # packed codes + E8M0 scales
    assert torch.equal(tcast.upcast(t), tcast.cast(x, "mxfp8e4"))

Predefined types are module attributes (`tcast.mxfp6e2`, `tcast.int8_f`, ...) built on first use.
"""

from __future__ import annotations

from typing import Any

from ._datatype import ALIASES, PREDEFINED, DataType, datatype, lookup
from ._modes import CastMode, ComputeMode, RoundMode, ScaleMode, defaults, initialize
from ._number import InfNaN, Kind, NumberSpec, number
from ._pack import pack_codes, packed_nbytes, sqnr_db, unpack_codes
from ._scale import ScaleSpec, Tile, scale
from ._sparse import sparse
from ._tensor import Tensor

__version__ = "0.1.0"

__all__ = [
    "ALIASES",
    "PREDEFINED",
    "CastMode",
    "ComputeMode",
    "DataType",
    "InfNaN",
    "Kind",
    "NumberSpec",
    "RoundMode",
    "ScaleMode",
    "ScaleSpec",
    "Tensor",
    "Tile",
    "__version__",
    "cast",
    "datatype",
    "defaults",
    "initialize",
    "lookup",
    "number",
    "pack_codes",
    "packed_nbytes",
    "scale",
    "sparse",
    "sqnr_db",
    "unpack_codes",
    "upcast",
]


def _as_datatype(dtype: Any) -> DataType:
    if isinstance(dtype, DataType):
        return dtype
    if isinstance(dtype, str):
        key = ALIASES.get(dtype.strip().lower(), dtype.strip().lower())
        if key in PREDEFINED:
            return lookup(key)
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
) -> Any:
    """Cast a float32/float16/bfloat16 tensor to a tcast DataType.

    castmode "virtual" (default) returns a tensor of the input's dtype (or `out_dtype`) holding
    the representable values; "actual" returns a `tcast.Tensor` of packed codes and scales.
    Stochastic rounding is reproducible with `seed` or a `generator`. The input is never modified.
    """
    from . import _torchcast
    from ._modes import resolve_cast, resolve_round, resolve_scale

    datatype_ = _as_datatype(dtype)
    round_ = resolve_round(roundmode)
    scale_ = resolve_scale(scalemode)
    gen = _generator(x, seed, generator)
    if resolve_cast(castmode) is CastMode.ACTUAL:
        return _torchcast.actual_cast(x, datatype_, round_, scale_, gen)
    return _torchcast.virtual_cast(x, datatype_, round_, scale_, gen, out_dtype)


def upcast(t: Tensor, torch_dtype: Any = None) -> Any:
    """Values of an actual cast, in `torch_dtype` (default: the dtype that was cast)."""
    from . import _torchcast

    if not isinstance(t, Tensor):
        raise TypeError(f"upcast takes a tcast.Tensor, got {type(t).__name__}")
    return _torchcast.upcast(t, torch_dtype)


def __getattr__(name: str) -> DataType:
    key = ALIASES.get(name, name)
    if key in PREDEFINED:
        value = lookup(key)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tcast' has no attribute {name!r}")
