"""Round to nearest: each weight's codes on the grid tcast's scale rules give it; learns from no data."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..grids import quantize_onto

if TYPE_CHECKING:
    import torch

    from coreai_opt.weights import Encoding, WeightSite

    from ..configs import QuantizeConfig


def quantize(
    w: torch.Tensor, site: WeightSite, config: QuantizeConfig, statistics: object = None
) -> Encoding | str:
    """One weight's codes, scales and offsets, rounded to nearest (or why its layout cannot take
    the config)."""
    return quantize_onto(w, site, config, None)
