"""Palettization weighted by what the data says matters (SqueezeLLM; coremltools' SKM).

The same exact k-means as data-free palettization, but each element's squared error counts by
its importance: `sensitive` weighs it by the Fisher information of the loss, E[(dL/dw)^2] per
element (a second-order estimate of how much the loss grows with the error), `importance` by
the mean square of the input channel it multiplies, E[x_i^2] (the diagonal of the consumer's
output error). Elements the data never reached still get a floor of `_FLOOR` times the mean
importance, so they are assigned sensibly and every bin has positive weight. A weight the data
gives nothing for (an embedding lookup under `importance`) is clustered as data-free k-means.
"""

from __future__ import annotations

import math

import torch

from coreai_opt.weights import Encoding, Learned, Statistics, WeightSite, decode

from ..configs import PalettizeConfig
from ._kmeans import weighted_palettize
from ._layerwise import weighted_snr_db

_FLOOR = 1e-3


def _floored(importance: torch.Tensor) -> torch.Tensor | None:
    """A floored copy on the host (where k-means runs), at least float32: of input moments, one
    value a channel (a weight-shaped importance is floored where it is read: `fisher_importance`)."""
    dtype = torch.promote_types(importance.dtype, torch.float32)
    importance = importance.to(device="cpu", dtype=dtype, copy=True).clamp_(min=0)
    mean = float(importance.sum(dtype=torch.float64)) / importance.numel() if importance.numel() else 0.0
    if not math.isfinite(mean) or mean <= 0:
        return None
    return importance.add_(_FLOOR * mean)


def fisher_importance(statistics: Statistics | None, site: WeightSite) -> tuple[torch.Tensor, float] | None:
    """The Fisher information per element (the weight's shape, on the host) and the floor to add
    to it where it is read - a piece at a time, so a 1B model's head has no floored copy; None
    without data."""
    if statistics is None or statistics.gradient_squares is None:
        return None
    squares = statistics.gradient_squares
    if tuple(squares.shape) != tuple(site.shape):
        return None
    squares = squares.cpu()  # k-means runs on the host
    mean = statistics.gradient_mean()  # a sample of rows is floored as the whole weight is
    if not math.isfinite(mean) or mean <= 0 or float(squares.min()) < 0:
        return None  # squares are never negative: such statistics are not a Fisher pass's
    return squares, _FLOOR * mean


def input_importance(statistics: Statistics | None, site: WeightSite) -> torch.Tensor | None:
    """Each element's input channel's mean square, floored, as a read-only view of the weight's
    shape (no copy); None where the data gives none that fits (no activation, a grouped convolution)."""
    if statistics is None or statistics.rows == 0:
        return None
    moments = statistics.moments
    if moments is None and statistics.gram is not None:
        moments = torch.diagonal(statistics.gram)
    if moments is None or moments.numel() != site.shape[site.input_axis]:
        return None
    floored = _floored(moments)  # the channels' mean is the broadcast's: floor once per channel
    if floored is None:
        return None
    shape = [1] * len(site.shape)
    shape[site.input_axis] = moments.numel()
    return floored.reshape(shape).expand(site.shape)  # a view: no weight-sized float64 copy


def _learned_palettize(
    w: torch.Tensor,
    site: WeightSite,
    config: PalettizeConfig,
    importance: torch.Tensor | tuple[torch.Tensor, float] | None,
    weighting: str,
    compare: bool,
) -> Encoding | str:
    """Weighted k-means, beside the data-free one where `compare`; `importance` with the floor to
    add where it is read, or already floored. Both run on the host (numba's k-means), as do the scores."""
    w = w.cpu()
    if importance is None:
        return weighted_palettize(w, site, config, None)
    free = weighted_palettize(w, site, config, None) if compare else None
    if isinstance(free, str):
        return free
    weights, floor = importance if isinstance(importance, tuple) else (importance, 0.0)
    weights = weights.cpu()
    learned = weighted_palettize(w, site, config, weights, floor)
    if isinstance(learned, str):
        return learned
    record = Learned(
        config.method,
        weighting,
        weighted_snr_db(w, decode(learned), weights, floor) if compare else None,  # an estimate reads none
        None if free is None else weighted_snr_db(w, decode(free), weights, floor),
    )
    return Encoding(learned.form, learned.element, learned.luts, learned.sparsity, learned=record)


def palettize_sensitive(
    w: torch.Tensor,
    site: WeightSite,
    config: PalettizeConfig,
    statistics: Statistics | None = None,
    compare: bool = True,
) -> Encoding | str:
    """Exact k-means weighted by each element's Fisher information (see the module)."""
    return _learned_palettize(w, site, config, fisher_importance(statistics, site), "fisher", compare)


def palettize_importance(
    w: torch.Tensor,
    site: WeightSite,
    config: PalettizeConfig,
    statistics: Statistics | None = None,
    compare: bool = True,
) -> Encoding | str:
    """Exact k-means weighted by each element's input channel's mean square (see the module)."""
    return _learned_palettize(w, site, config, input_importance(statistics, site), "input-moments", compare)
