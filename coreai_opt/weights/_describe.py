"""How a compressed weight is stored, in words: one vocabulary for Core AI and `torch.export` programs.

Both containers express a weight as a tree of decompression steps over stored tensors - a LUT
lookup, a block-wise shift and scale, a sparse bitmask scatter - and each describes what it holds
with these words ("ui4 LUT(16 x f16)", "si8 + f16 scale per channel"), whichever program it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Described:
    """A value computed from stored tensors only: how it is encoded and what it costs."""

    encoding: str
    nbytes: int
    element: str
    shape: tuple[int, ...]


def granularity(scale_shape: tuple[int, ...], data_shape: tuple[int, ...]) -> str:
    """Name the layout of a block-wise parameter: per tensor, per channel, or per block N (axis k)."""
    if len(scale_shape) < len(data_shape):
        scale_shape = (1,) * (len(data_shape) - len(scale_shape)) + scale_shape
    pairs = list(zip(scale_shape, data_shape, strict=True))
    if all(s == 1 for s, _ in pairs):
        return "per tensor"
    blocked = [(axis, d // s) for axis, (s, d) in enumerate(pairs) if 1 < d // s < d]
    if blocked:
        sizes = "x".join(str(size) for _, size in blocked)
        axes = ", ".join(str(axis) for axis, _ in blocked)
        return f"per block {sizes} ({'axis' if len(blocked) == 1 else 'axes'} {axes})"
    channels = [axis for axis, (s, d) in enumerate(pairs) if s == d and d > 1]
    if len(channels) == 1:
        return "per channel"
    return f"per channel (axes {', '.join(str(axis) for axis in channels)})"


def lut(indices: Described, table: Described) -> str:
    entries, vector = table.shape[-2], table.shape[-1]
    luts = math.prod(table.shape[:-2])
    text = f"{indices.encoding} LUT({entries} x {table.encoding})"
    if vector > 1:
        text += f" vector {vector}"
    if luts > 1:
        text += f" x {luts} LUTs"
    return text


def shift_scale(data: Described, scale: Described, zero_point: bool, offset: bool) -> str:
    text = f"{data.encoding} + {scale.encoding} scale {granularity(scale.shape, data.shape)}"
    if zero_point:
        text += " + zero point"
    if offset:
        text += " + offset"
    return text


def sparse(values: Described, mask: Described) -> str:
    density = math.prod(values.shape) / max(1, math.prod(mask.shape))
    return f"sparse bitmask {density:.0%} kept, values {values.encoding}"
