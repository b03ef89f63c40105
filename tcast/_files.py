"""Casting safetensors files, and the code table of small formats (what the `tcast` CLI shows)."""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._datatype import DataType
from ._metrics import sqnr_db
from ._number import NumberSpec

if TYPE_CHECKING:
    import torch

METADATA_KEY = "tcast"


@dataclass(frozen=True)
class CodeEntry:
    code: int
    bits: str
    value: float
    kind: str  # normal, subnormal, zero, nan, inf


def code_table(nspec: NumberSpec) -> list[CodeEntry]:
    """Every code of a format of 8 bits or fewer, with its value and kind (none for a codebook,
    whose `describe()` lists its tables)."""
    from ._codes import decode_table

    if nspec.is_codebook:
        return []
    if nspec.bits > 8:
        raise ValueError(f"code tables are for formats of 8 bits or fewer; {nspec.code} has {nspec.bits}")
    values = decode_table(nspec.code).tolist()
    entries = []
    for code, value in enumerate(values):
        if math.isnan(value):
            kind = "nan"
        elif math.isinf(value):
            kind = "inf"
        elif value == 0:
            kind = "zero"
        elif nspec.is_float and abs(value) < nspec.smallest_normal:
            kind = "subnormal"
        else:
            kind = "normal"
        entries.append(CodeEntry(code, format(code, f"0{nspec.bits}b"), value, kind))
    return entries


@dataclass(frozen=True)
class TensorCastResult:
    name: str
    shape: tuple[int, ...]
    sqnr_db: float
    max_abs_error: float
    bits_per_value: float
    skipped: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"shape": list(self.shape)}


def check_paths(source: Path, output: Path, *, force: bool) -> None:
    """Every path error before any work (and before torch loads): a missing or non-file input, an
    output onto the input, an existing output without `force`."""
    if not source.exists():
        raise ValueError(f"{source}: no such file")
    if source.is_dir():
        raise ValueError(f"{source}: is a directory, not a .safetensors file")
    if output.resolve() == source.resolve():
        raise ValueError(f"{output}: refusing to write the output onto the input file")
    if output.exists() and not force:
        raise ValueError(f"{output}: output already exists (pass --force to overwrite)")


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            return {key: handle.get_tensor(key) for key in handle.keys()}, metadata  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable safetensors file ({exc})") from exc


def _write(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str], *, force: bool) -> None:
    from safetensors.torch import save_file

    if path.exists() and not force:
        raise ValueError(f"{path}: output already exists (pass --force to overwrite)")
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
        os.replace(tmp, path)
    except OSError as exc:
        raise ValueError(f"{path}: cannot write output ({exc.strerror or exc})") from exc
    finally:
        if tmp.exists():
            tmp.unlink()


def _sqnr(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    err = (y.double() - x.double()).nan_to_num(nan=math.inf)
    return sqnr_db(x, y), float(err.abs().max()) if err.numel() else 0.0


def cast_file(
    source: Path | str,
    output: Path | str,
    dtype: DataType,
    *,
    castmode: str = "virtual",
    roundmode: str | None = None,
    only: str | None = None,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[TensorCastResult]:
    """Cast the float tensors of a safetensors file (those matching `only`); copy the rest.

    With a CUDA device present each tensor is cast there (TritonCast where it supports the type);
    results come back to the CPU and are the same bits either way.
    """
    source, output = Path(source), Path(output)
    check_paths(source, output, force=force)
    import torch

    from . import cast

    device = "cuda" if torch.cuda.is_available() else "cpu"
    pattern = re.compile(only) if only else None
    tensors, metadata = _read(source)
    written: dict[str, torch.Tensor] = {}
    layout: dict[str, Any] = {}
    results = []
    for name, tensor in tensors.items():
        if progress:
            progress(name)
        reason = _skip_reason(name, tensor, pattern)
        if reason:
            written[name] = tensor
            results.append(TensorCastResult(name, tuple(tensor.shape), math.nan, math.nan, math.nan, reason))
            continue
        if castmode == "actual":
            values, bits = _cast_actual(name, tensor.to(device), dtype, roundmode, written, layout)
        else:
            values = cast(tensor.to(device), dtype, roundmode=roundmode).cpu()
            written[name] = values
            bits = dtype.bits_per_value() or float(dtype.nspec.bits)
        sqnr, max_err = _sqnr(tensor, values)
        results.append(TensorCastResult(name, tuple(tensor.shape), sqnr, max_err, bits))
    if layout:
        metadata = dict(metadata) | {METADATA_KEY: json.dumps(layout)}
    _write(output, written, metadata, force=force)
    return results


def _skip_reason(name: str, tensor: torch.Tensor, pattern: re.Pattern[str] | None) -> str:
    """Why a tensor is copied rather than cast ("" where it is cast): not a float, or not matched."""
    import torch

    eligible = tensor.dtype in (torch.float32, torch.float16, torch.bfloat16)
    if not eligible or (pattern and not pattern.search(name)):
        return "not a float tensor" if not eligible else "not matched by --only"
    return ""


def _cast_actual(
    name: str, x: torch.Tensor, dtype: DataType, roundmode: str | None, written: dict[str, torch.Tensor],
    layout: dict[str, Any],
) -> tuple[torch.Tensor, float]:  # fmt: skip
    """Building the stored parts of an actual cast (into `written`, its layout into `layout`); returns
    the upcast values on the CPU and the bits per value."""
    from . import cast, upcast

    packed = cast(x, dtype, roundmode=roundmode, castmode="actual")
    values = upcast(packed).cpu()
    written[f"{name}.codes"] = packed.codes.cpu()
    if packed.scales is not None:
        written[f"{name}.scales"] = packed.scales.cpu()
    if packed.zeros is not None:
        written[f"{name}.zeros"] = packed.zeros.cpu()
    if packed.tensor_scale is not None:
        written[f"{name}.tensor_scale"] = packed.tensor_scale.reshape(1).cpu()
    if packed.meta is not None:
        written[f"{name}.meta"] = packed.meta.cpu()
    layout[name] = {
        "nspec": dtype.nspec.code,
        "sspec": dtype.sspec.code if dtype.sspec else None,
        "datatype": dtype.name,
        "shape": list(packed.shape),
        "source_dtype": str(packed.source_dtype).removeprefix("torch."),
        "numel_padded": packed.numel_padded,
    }
    return values, packed.bits_per_value


_PARTS = (".codes", ".scales", ".zeros", ".tensor_scale", ".meta")  # what an actual cast stores per tensor


def upcast_file(source: Path | str, output: Path | str, *, force: bool = False) -> list[str]:
    """Read a file written by an actual cast back to float tensors; returns the restored names."""
    source, output = Path(source), Path(output)
    check_paths(source, output, force=force)
    import torch

    from . import upcast
    from ._tensor import Tensor

    tensors, metadata = _read(source)
    if METADATA_KEY not in metadata:
        raise ValueError(f"{source}: no tcast metadata (was it written by `tcast cast --mode actual`?)")
    layout = json.loads(metadata[METADATA_KEY])
    restored = {k: v for k, v in tensors.items() if not k.endswith(_PARTS)}
    for name, info in layout.items():
        if f"{name}.codes" not in tensors:
            raise ValueError(f"{source}: tensor {name!r} has no codes")
        packed = Tensor(
            dtype=DataType(info["nspec"], info["sspec"], info["datatype"]),
            shape=tuple(info["shape"]),
            source_dtype=getattr(torch, info["source_dtype"]),
            codes=tensors[f"{name}.codes"],
            scales=tensors.get(f"{name}.scales"),
            zeros=tensors.get(f"{name}.zeros"),
            numel_padded=int(info["numel_padded"]),
            tensor_scale=outer.reshape(())
            if (outer := tensors.get(f"{name}.tensor_scale")) is not None
            else None,
            meta=tensors.get(f"{name}.meta"),
        )
        restored[name] = upcast(packed)
    rest = {k: v for k, v in metadata.items() if k != METADATA_KEY}
    _write(output, restored, rest, force=force)
    return sorted(layout)
