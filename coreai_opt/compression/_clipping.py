"""Importance-weighted scale choice for symmetric integer codes (clipping).

Round to nearest takes each tile's scale from its largest magnitude, so the largest code lands on
the tile's maximum. At 2 bits (codes -1, 0, 1) that leaves almost every weight on zero, and at 4
bits one outlier stretches the steps of its whole tile. A smaller scale clips the few largest
values and rounds the rest finer: each tile here takes the shrink of round-to-nearest's scale,
from `_SHRINKS`, whose round to nearest has the least squared error weighted by the inputs'
mean squares (what reaches the layer's output), with the larger scale on ties. GPTQ then rounds
onto that grid; the data-free `rtn` keeps the maximum.
"""

from __future__ import annotations

import torch

import tcast
from coreai_opt.weights import Encoding, Quantized, WeightSite

from ._config import QuantizeConfig
from ._options import QScheme
from ._quantize import Grid, spread_tiles

# 1.0 first: a tile keeps round-to-nearest's scale unless a smaller one is strictly better.
_SHRINKS = tuple(1.0 - 0.04 * i for i in range(20))  # 1.00 ... 0.24
_PIECE = 1 << 20  # elements of the weight searched at a time


def weighted_grid(
    w: torch.Tensor, site: WeightSite, config: QuantizeConfig, grid: Grid, free: Encoding,
    importance: torch.Tensor | None,
) -> Grid:  # fmt: skip
    """`grid` (round to nearest's, of the encoding `free`) with each tile's scale shrunk where that
    lowers the tile's `importance`-weighted (the weight's shape) error; other formats as given."""
    from coreai_opt.weights._decode import torch_values

    form = free.form
    symmetric_int = config.dtype.is_int and config.qscheme is QScheme.SYMMETRIC
    if importance is None or not symmetric_int or not isinstance(form, Quantized) or form.decode is None:
        return grid
    step = torch_values(form.decode.scale).double()  # per tile, in the weight's layout
    largest = 2 ** (config.dtype.bits - 1) - 1
    best = torch.empty_like(step)
    axis, channels = site.output_axis, site.shape[site.output_axis]
    rows = channels if step.shape[axis] != channels else max(1, _PIECE * channels // max(1, w.numel()))
    for a in range(0, channels, rows):  # pieces of whole output channels: the temporaries stay small
        n = min(rows, channels - a)
        tiles = step if step.shape[axis] != channels else step.narrow(axis, a, n)
        piece = w.narrow(axis, a, n).double()
        weight = importance.narrow(axis, a, n).double().to(w.device)
        out = best if tiles is step else best.narrow(axis, a, n)
        out.copy_(_least_error_steps(piece, weight, tiles, largest, site))
    mbits = tcast.number(f"int{config.dtype.bits}").mbits  # tcast's scale is the step x 2**m
    scales = (best * 2.0**mbits).reshape(grid.scales.shape).to(grid.scales.dtype)
    return Grid(scales, grid.zero_points)


def _least_error_steps(
    x: torch.Tensor, weight: torch.Tensor, step: torch.Tensor, largest: int, site: WeightSite
) -> torch.Tensor:
    """Per tile of `step`, the first shrink of it (on the stored scales' own grid, as the codes
    will be decoded) with the least `weight`ed squared error of round to nearest of `x`."""
    shape = tuple(x.shape)
    best_step, best_error = step.clone(), torch.full_like(step, float("inf"))
    for shrink in _SHRINKS:
        candidate = (step * shrink).to(site.element.torch_dtype()).double()
        usable = candidate > 0
        spread = spread_tiles(torch.where(usable, candidate, step), shape)
        rounded = torch.clamp(torch.round(x / spread), -largest, largest) * spread
        error = _tile_sums(weight * (x - rounded) ** 2, tuple(step.shape))
        better = usable & (error < best_error)
        best_step = torch.where(better, candidate, best_step)
        best_error = torch.where(better, error, best_error)
    return best_step


def _tile_sums(t: torch.Tensor, tiles: tuple[int, ...]) -> torch.Tensor:
    """Sums of `t` over each tile, `tiles` being the number of tiles along each axis."""
    split: list[int] = []
    for length, count in zip(t.shape, tiles, strict=True):
        split += [count, length // count]
    return t.reshape(split).sum(dim=tuple(range(1, 2 * len(tiles), 2)))
