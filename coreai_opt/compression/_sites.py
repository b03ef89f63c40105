"""Which weights a pass compresses, and why every other float tensor is left.

The rules: a weight is a tensor of more than `weight_num_threshold` elements that every use reads
as the weight of a convolution, a matrix product or an embedding lookup, with one layout; its
output channels and input axis follow from that layout (`weights.Use.axes`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from coreai_opt.weights import Candidate, Consumer, SkipKind, Skipped, WeightSite, stored_nbytes

from .configs import Override


def _not_a_weight(candidate: Candidate) -> str | None:
    if candidate.tied_to is not None:
        return f"tied to {candidate.tied_to} (one tensor): stored, and compressed, with it"
    if not candidate.uses:
        return "not used by any op"
    others = sorted({u.op for u in candidate.uses if u.consumer is Consumer.OTHER})
    if others:
        return f"not a weight of conv/matmul/gather (used by {', '.join(others)})"
    rank = len(candidate.shape)
    layouts = {u.axes(rank) for u in candidate.uses}
    if len(layouts) > 1:
        ops = sorted({u.op for u in candidate.uses})
        return f"read with different layouts by {', '.join(ops)}: no one channel axis"
    return None


def select_sites(
    candidates: Sequence[Candidate], threshold: int, config_for: Callable[[str], Any]
) -> tuple[list[tuple[WeightSite, Any]], list[Skipped]]:
    """The weights to compress, each with its config (`config_for(name)`: the pass's config, an
    override's version of it, or a skipping `Override`), and every other candidate with its reason."""
    sites: list[tuple[WeightSite, Any]] = []
    skipped: list[Skipped] = []
    for candidate in candidates:
        count = math.prod(candidate.shape)
        # a tied tensor is stored once, under the name that holds it
        nbytes = 0 if candidate.tied_to is not None else candidate.stored_bytes
        if nbytes is None:
            nbytes = stored_nbytes(candidate.shape, candidate.element)
        if count <= threshold:
            reason = f"{count} elements <= threshold {threshold}"
            skipped.append(Skipped(candidate.name, candidate.shape, reason, SkipKind.SMALL, nbytes))
            continue
        reason = _not_a_weight(candidate)
        if reason is not None:
            skipped.append(Skipped(candidate.name, candidate.shape, reason, SkipKind.NOT_A_WEIGHT, nbytes))
            continue
        config = config_for(candidate.name)
        if isinstance(config, Override):
            reason = f"excluded by override {config.pattern!r}"
            skipped.append(Skipped(candidate.name, candidate.shape, reason, SkipKind.OVERRIDE, nbytes))
            continue
        out, inp = candidate.uses[0].axes(len(candidate.shape))
        site = WeightSite(candidate.handle, candidate.name, candidate.shape, candidate.element, out, inp)
        sites.append((site, config))
    return sites, skipped
