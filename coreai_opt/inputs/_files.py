"""Inputs from a user's safetensors file: one tensor per input, by input name."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from coreai_opt.io import ModelFileError

from ._policy import InputSpec, Kind

if TYPE_CHECKING:
    import torch


def read_inputs_file(path: Path | str, specs: Sequence[InputSpec]) -> dict[str, torch.Tensor]:
    """The file's tensor for every input; names, shapes and integer kinds must match."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise ModelFileError(path, "no such file" if not path.exists() else "not a file")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ModelFileError(path, f"not a readable safetensors file ({exc})") from None
    missing = [s.name for s in specs if s.name not in tensors]
    if missing:
        expected = ", ".join(s.name for s in specs)
        raise ModelFileError(path, f"has no tensor for input(s) {', '.join(missing)} (expected {expected})")
    out = {}
    for spec in specs:
        value = tensors[spec.name]
        if tuple(value.shape) != spec.shape:
            raise ModelFileError(
                path, f"tensor {spec.name} has shape {list(value.shape)}; the model takes {list(spec.shape)}"
            )
        if spec.kind is not Kind.FLOAT and value.dtype.is_floating_point:
            raise ModelFileError(path, f"tensor {spec.name} is {value.dtype}; the model takes integers")
        out[spec.name] = value
    return out
