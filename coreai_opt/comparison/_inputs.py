"""Inputs for a comparison: seeded random ones built from the descriptors, or a safetensors file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coreai_opt._coreai._runtime import TensorSpec
from coreai_opt.io import ModelFileError

DEFAULT_INT_RANGE = (0, 100)


def parse_int_range(text: str) -> tuple[int, int]:
    """`"0:100"` -> (0, 100): integer inputs are drawn from [low, high)."""
    low, sep, high = text.partition(":")
    try:
        bounds = (int(low), int(high))
    except ValueError:
        bounds = None
    if not sep or bounds is None or bounds[0] >= bounds[1]:
        raise ValueError(f"integer range {text!r} is not LOW:HIGH with LOW < HIGH (e.g. 0:100)")
    return bounds


def random_inputs(
    specs: tuple[TensorSpec, ...], seed: int = 0, int_range: tuple[int, int] = DEFAULT_INT_RANGE
) -> dict[str, np.ndarray]:
    """Floats from N(0, 1); integers uniform in [low, high); booleans fair coins. One seed for all."""
    rng = np.random.default_rng(seed)
    out = {}
    for spec in specs:
        if spec.dtype == np.bool_:
            out[spec.name] = rng.integers(0, 2, spec.shape).astype(np.bool_)
        elif np.issubdtype(spec.dtype, np.integer):
            info = np.iinfo(spec.dtype)
            low, high = max(int_range[0], info.min), min(int_range[1], info.max + 1)
            if low >= high:
                raise ValueError(f"integer range {int_range} holds no {spec.dtype.name} value")
            out[spec.name] = rng.integers(low, high, spec.shape).astype(spec.dtype)
        else:
            out[spec.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
    return out


def file_inputs(path: Path, specs: tuple[TensorSpec, ...]) -> dict[str, np.ndarray]:
    """One tensor per input, by input name; integer values must fit the input's dtype."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
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
        if np.issubdtype(spec.dtype, np.integer):
            if not np.issubdtype(value.dtype, np.integer) and not np.issubdtype(value.dtype, np.bool_):
                raise ModelFileError(path, f"tensor {spec.name} is {value.dtype}; the model takes integers")
            info = np.iinfo(spec.dtype)
            if value.size and (value.min() < info.min or value.max() > info.max):
                raise ModelFileError(path, f"tensor {spec.name} has values outside {spec.dtype.name}")
        out[spec.name] = value
    return out
