"""A large weight's encoding estimated on a sample of its output channels.

Most encodings keep nothing shared between output channels but the calibration's input Gram
matrix: a scale per channel or per block of a channel, a look-up table per channel or per group
of channels, GPTQ's error feedback along each row. For those, encoding whole row groups of a
weight gives the rows that encoding the whole weight gives (bit for bit on the CPU; a GPU's
matrix products may pick other kernels for another row count), and each row's error is its own:
an error summed over evenly spread row groups, divided by the share they are of the weight,
estimates the whole weight's - at that share of the cost. `optimize` prices every choice on every
weight this way when a model is large (its cost table), and measures the plan it picks whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from coreai_opt.weights import Statistics, WeightSite

from .configs import CompressionGranularity, DType, PalettizeConfig, QuantizeConfig, WeightConfig
from .registry import algorithm_for


@dataclass(frozen=True)
class RowSample:
    """The output channels `rows` (ascending) of a weight of `of` of them."""

    rows: torch.Tensor
    of: int

    @property
    def share(self) -> float:
        """How much of the weight the sample is: its rows over the weight's."""
        return len(self.rows) / self.of

    def take(self, tensor: torch.Tensor, axis: int) -> torch.Tensor:
        """The sample's rows of `tensor` (the weight's shape along `axis`)."""
        return tensor.index_select(axis, self.rows.to(tensor.device))

    def site(self, site: WeightSite) -> WeightSite:
        """`site` as the weight made of the sample's rows."""
        shape = list(site.shape)
        shape[site.output_axis] = len(self.rows)
        return replace(site, shape=tuple(shape))

    def statistics(self, statistics: Statistics | None, site: WeightSite) -> Statistics | None:
        """The statistics of the sample's rows of `site`: what the consumer's inputs saw is the
        whole weight's; squared gradients, one per value, are the sample's, with their mean over
        the whole weight (what a floor is taken from)."""
        squares = None if statistics is None else statistics.gradient_squares
        if statistics is None or squares is None or tuple(squares.shape) != tuple(site.shape):
            return statistics
        taken = self.take(squares, site.output_axis)
        return replace(statistics, gradient_squares=taken, squares_mean=statistics.gradient_mean())


def row_unit(config: WeightConfig) -> int | None:
    """How many neighbouring output channels an encoding under `config` shares its parameters
    between (None: something is shared by the whole weight - a tensor's scale or table, a vector
    table, a sparsity threshold, tuning end to end, a method not known to keep rows apart)."""
    G = CompressionGranularity
    if not algorithm_for(config).rows_apart:
        return None
    if isinstance(config, QuantizeConfig):
        return 1 if config.granularity in (G.PER_CHANNEL, G.PER_BLOCK) else None
    tuned = isinstance(config, PalettizeConfig) and (config.tune_epochs or config.tune_blocks)
    if isinstance(config, PalettizeConfig) and config.cluster_dim == 1 and not tuned:
        if config.lut_dtype is DType.UINT8:  # an offset array is stored if any table needs one
            return None
        return {G.PER_CHANNEL: 1, G.PER_GROUPED_CHANNEL: config.group_size}.get(config.granularity)
    return None


_TABLE_ENTRIES_PRICED = 16  # a look-up table's entries up to which a sample is the given size


def sample_size(config: WeightConfig, elements: int) -> int:
    """The values an estimate under `config` is made on, for `elements` asked (and the size from
    which a weight is sampled): for a look-up table of k > 16 entries 16/k of them, as exact
    k-means costs about k a value - so a 256-entry table's estimate costs what a 16-entry one's
    does (on SmolLM2, 8-bit tables were most of the cost table's k-means time, and no 4-bit plan
    took one)."""
    if isinstance(config, PalettizeConfig) and elements > 0:
        entries = 2**config.n_bits
        if entries > _TABLE_ENTRIES_PRICED:
            return max(1, elements * _TABLE_ENTRIES_PRICED // entries)
    return elements


def row_sample(site: WeightSite, config: WeightConfig, elements: int) -> RowSample | None:
    """Whole row groups of `site`, evenly spread, of about `elements` values in all - or None
    when the weight is that small, its encoding shares something between its rows, or its rows
    do not divide into groups. The sample's rows are even where the weight's are, as containers
    that pack two codes a byte along the rows ask."""
    unit = row_unit(config)
    rows = site.shape[site.output_axis] if site.shape else 0
    if elements <= 0 or unit is None or site.count <= elements or rows % unit or rows % 2:
        return None
    groups = rows // unit
    wanted = max(1, math.ceil(elements / (unit * (site.count // rows))))
    wanted += (wanted * unit) % 2
    if wanted >= groups:
        return None
    first = (torch.arange(wanted) * 2 + 1) * groups // (2 * wanted)  # the middle of each stretch
    kept = (first[:, None] * unit + torch.arange(unit)).reshape(-1)
    return RowSample(kept, rows)
