"""Arranging a tensor as rows of values that share one scale, and back.

Every scale layout (tensor, channel, 1D tile, 2D tile) becomes a [num_scales, per_scale] matrix,
so the engines only ever reduce over the last dim. Lengths that a tile does not divide are
padded with zeros, which never change a block's amax, and cropped again on the way back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._scale import ScaleSpec


@dataclass(frozen=True)
class Blocking:
    shape: tuple[int, ...]  # the tensor's own shape
    perm: tuple[int, ...]  # dims moved so that tiled dims come last
    padded: tuple[int, ...]  # permuted shape after padding
    tiles: tuple[int, ...]  # tile size per trailing tiled dim (one or two entries; empty = tensor scale)

    @property
    def num_scales(self) -> int:
        per = 1
        for t in self.tiles:
            per *= t
        total = 1
        for d in self.padded:
            total *= d
        return total // per if self.tiles else 1

    @property
    def per_scale(self) -> int:
        if not self.tiles:
            total = 1
            for d in self.shape:
                total *= d
            return total
        per = 1
        for t in self.tiles:
            per *= t
        return per


def plan(shape: tuple[int, ...], sspec: ScaleSpec | None) -> Blocking:
    rank = len(shape)
    if sspec is None or sspec.is_tensor:
        return Blocking(shape, tuple(range(rank)), shape, ())
    if rank == 0:
        raise ValueError("a channel or tile scale needs a tensor of rank >= 1")
    dims = []
    for tile in sspec.tiles:
        if not -rank <= tile.dim < rank:
            raise ValueError(f"tile dim {tile.dim} is out of range for a tensor of rank {rank}")
        dims.append(tile.dim % rank)
    if len(set(dims)) != len(dims):
        raise ValueError("the two tile dims name the same tensor dim")
    perm = tuple(d for d in range(rank) if d not in dims) + tuple(dims)
    permuted = [shape[d] for d in perm]
    sizes = []
    for i, tile in enumerate(sspec.tiles):
        axis = rank - len(dims) + i
        size = tile.size or permuted[axis]
        size = max(size, 1)
        permuted[axis] = -(-permuted[axis] // size) * size
        sizes.append(size)
    return Blocking(shape, perm, tuple(permuted), tuple(sizes))


def to_blocks(x: torch.Tensor, layout: Blocking) -> torch.Tensor:
    if not layout.tiles:
        return x.reshape(1, -1)
    xt = x.permute(layout.perm)
    pads: list[int] = []
    for axis in range(xt.dim() - 1, xt.dim() - 1 - len(layout.tiles), -1):
        pads += [0, layout.padded[axis] - xt.shape[axis]]
    if any(pads):
        xt = F.pad(xt, pads)
    if len(layout.tiles) == 1:
        return xt.reshape(-1, layout.tiles[0])
    t0, t1 = layout.tiles
    lead = xt.shape[:-2]
    n0, n1 = xt.shape[-2] // t0, xt.shape[-1] // t1
    return xt.reshape(*lead, n0, t0, n1, t1).transpose(-3, -2).reshape(-1, t0 * t1)


def from_blocks(blocks: torch.Tensor, layout: Blocking) -> torch.Tensor:
    if not layout.tiles:
        return blocks.reshape(layout.shape)
    padded = layout.padded
    if len(layout.tiles) == 1:
        xt = blocks.reshape(padded)
    else:
        t0, t1 = layout.tiles
        lead = padded[:-2]
        n0, n1 = padded[-2] // t0, padded[-1] // t1
        xt = blocks.reshape(*lead, n0, n1, t0, t1).transpose(-3, -2).reshape(padded)
    permuted_shape = [layout.shape[d] for d in layout.perm]
    index = tuple(slice(0, n) for n in permuted_shape)
    xt = xt[index]
    inverse = [0] * len(layout.perm)
    for i, d in enumerate(layout.perm):
        inverse[d] = i
    return xt.permute(inverse).contiguous()
