"""Sparse weights: pruning stored as a bitmask and the kept values.

Which weights are kept:
- magnitude (`target_sparsity`): the largest |w| of the whole tensor; `round(count * target)` are zeroed.
- block (`block_size`): blocks of `block_size` consecutive output channels at each position of the
  other axes, ranked by L2 norm; whole blocks are kept or zeroed.
- n:m (`n_m_ratio=(n, m)`): along the consumer's input (reduction) axis, in every run of m weights
  the n largest |w| are KEPT and m - n zeroed (2:4 keeps half; `tcast.sparse_mask`). The peer
  library zeroes n instead.
Ties go to the lower index, so the result is deterministic.

Joint forms store only the kept values, compressed:
- INT8, FP8_E4M3FN, FP8_E5M2: symmetric per-output-channel codes of the pruned weight; the kept
  codes are stored and the scale decodes the dense codes (pruned positions hold code 0, which
  decodes to 0).
- UINT8: a zero point would decode pruned positions to -zero_point x scale, so uint8 codes are
  decoded before the mask scatters them: one scale and zero point per block of up to 32 kept
  values, in row-major order (magnitude and block pruning keep a multiple of 32 values for this).
- palettize: one k-means LUT (exact 1-D, as in palettization) over the kept values.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

import tcast
from coreai_opt._elements import element
from coreai_opt._pieces import spans
from coreai_opt.weights import Encoding, Palettized, Quantized, Sparse, Stored, WeightSite

from ..configs import CompressionGranularity, DType, PalettizeConfig, QScheme, QuantizeConfig, SparsifyConfig
from ..grids import stored_float
from ._kmeans import _scalar_clusters
from ._rtn import quantize

_UINT8_BLOCK = 32


def _top(scores: torch.Tensor, keep: int) -> torch.Tensor:
    """A flat mask of the `keep` largest scores (ties to the lower index): what the first `keep`
    of a stable descending sort select, found in linear time - every score above the keep-th
    largest, then as many equal to it as are left, in index order."""
    flat = scores.reshape(-1)
    if keep >= flat.numel():
        return torch.ones(flat.numel(), dtype=torch.bool)
    if torch.isnan(flat).any():  # the sort's order of NaNs (first), not selection's
        order = torch.sort(flat, descending=True, stable=True).indices
        mask = torch.zeros(flat.numel(), dtype=torch.bool)
        mask[order[:keep]] = True
        return mask
    threshold = _kth_smallest(flat, flat.numel() - keep + 1)
    mask = flat > threshold
    ties = (flat == threshold).nonzero().reshape(-1)
    mask[ties[: keep - int(torch.count_nonzero(mask))]] = True
    return mask


def _kth_smallest(flat: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th smallest value (1-based) of a float32 or float64 tensor of magnitudes (no NaN, no
    -0), as `torch.kthvalue` gives it, 4-5x faster: their bit patterns sort as they do, so a
    histogram of the top 16 bits finds the bucket holding it (1/128 of an octave in float32), and
    only that bucket's values are selected from."""
    shift = {torch.float32: (torch.int32, 16), torch.float64: (torch.int64, 48)}.get(flat.dtype)
    if shift is None:
        return torch.kthvalue(flat, k).values
    top = flat.view(shift[0]) >> shift[1]
    reached = torch.bincount(top, minlength=1 << 15).cumsum(0)
    bucket = int(torch.searchsorted(reached, k))  # the first bucket whose running count reaches k
    before = int(reached[bucket - 1]) if bucket else 0
    return torch.kthvalue(flat[top == bucket], k - before).values


def kept_units(units: int, sparsity: float, unit_size: int, uint8: bool) -> int:
    """How many units (weights or blocks) to keep; for UINT8 a multiple of 32 values when possible."""
    keep = max(1, units - round(units * sparsity))
    if uint8:
        step = _UINT8_BLOCK // math.gcd(_UINT8_BLOCK, unit_size)
        if keep >= step:
            keep -= keep % step
    return keep


def sparsity_mask(w: torch.Tensor, site: WeightSite, config: SparsifyConfig) -> torch.Tensor | str:
    """The kept positions of one weight (bool, its shape), or why its layout cannot take the config."""
    uint8 = config.quantize_dtype is DType.UINT8
    if config.n_m_ratio is not None:
        n, m = config.n_m_ratio
        moved = w.movedim(site.input_axis, -1)
        if moved.shape[-1] % m:
            return f"input axis length {moved.shape[-1]} is not a multiple of m={m}"
        runs = moved.reshape(-1, m)
        mask = torch.empty(runs.shape, dtype=torch.bool)
        for a, b in spans(runs.shape[0], m):  # runs are independent: a piece at a time
            mask[a:b] = tcast.sparse_mask(runs[a:b].float(), m, n)  # tcast's rule: ties to the lower index
        return mask.reshape(moved.shape).movedim(-1, site.input_axis)
    magnitude = w.float().abs()
    sparsity = float(config.target_sparsity or 0.0)
    if config.block_size is None:
        keep = kept_units(magnitude.numel(), sparsity, 1, uint8)
        return _top(magnitude, keep).reshape(w.shape)
    size = config.block_size
    moved = magnitude.movedim(site.output_axis, 0)
    channels = moved.shape[0]
    if channels % size:
        return f"{channels} output channels are not a multiple of block_size {size}"
    blocks = moved.reshape(channels // size, size, -1)
    norms = blocks.double().square().sum(dim=1)  # [C / size, rest]: L2 norm squared of each block
    keep = kept_units(norms.numel(), sparsity, size, uint8)
    kept = _top(norms, keep).reshape(norms.shape)
    mask = kept[:, None, :].expand(-1, size, -1).reshape(moved.shape)
    return mask.movedim(0, site.output_axis)


def _quantized(
    w: torch.Tensor, mask: torch.Tensor, site: WeightSite, config: SparsifyConfig
) -> tuple[Stored | Quantized, object] | str:
    """(kept values, the decode after scattering)."""
    dtype = config.quantize_dtype
    assert dtype is not None
    kept = int(np.count_nonzero(mask.numpy()))
    if dtype is DType.UINT8:
        block = math.gcd(kept, _UINT8_BLOCK)
        if block < 8:
            return f"{kept} kept values do not split into blocks of 8 or more for uint8 scales"
        line = dataclasses.replace(site, shape=(kept,), output_axis=0, input_axis=0)
        inner = QuantizeConfig(
            dtype=dtype,
            qscheme=QScheme.ASYMMETRIC,
            granularity=CompressionGranularity.PER_BLOCK,
            block_size=block,
            weight_num_threshold=0,
        )
        encoded = quantize(_kept(w, mask), line, inner)
        assert isinstance(encoded, Encoding) and isinstance(encoded.form, Quantized)
        return encoded.form, None
    pruned = torch.where(mask, w, torch.zeros((), dtype=w.dtype))
    inner = QuantizeConfig(
        dtype=dtype,
        qscheme=QScheme.SYMMETRIC,
        granularity=CompressionGranularity.PER_CHANNEL,
        weight_num_threshold=0,
    )
    encoded = quantize(pruned, site, inner)
    assert isinstance(encoded, Encoding) and isinstance(encoded.form, Quantized)
    codes = encoded.form.data
    return Stored(codes.values[mask.numpy()], codes.element), encoded.form.decode


def _palettized(w: torch.Tensor, mask: torch.Tensor, site: WeightSite, config: SparsifyConfig) -> Palettized:
    n_bits = config.palettize_nbits
    assert n_bits is not None
    values = _kept(w, mask)
    exact = site.element.bits == 16
    rows = values.float()[None, :]
    centroids, index = _scalar_clusters(
        rows, values[None, :] if exact else None, PalettizeConfig(n_bits=n_bits)
    )
    lut = stored_float(tcast.cast(torch.from_numpy(centroids[0]), site.element.tcast), site.element)
    rank = len(site.shape)
    lut = Stored(lut.values.reshape((*(1,) * rank, 2**n_bits, 1)), site.element)
    indices = Stored(index[0].to(torch.uint8).numpy(), element(f"ui{n_bits}"))
    return Palettized(indices, lut, site.output_axis, None, 1)


def _kept(w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`w[mask]` (in row-major order) by numpy, which builds no index array: torch's boolean
    indexing makes an int64 index per kept value first, four times the kept values' bytes."""
    as_bits = w.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[w.element_size()])
    return torch.from_numpy(as_bits.numpy()[mask.numpy()]).view(w.dtype)


def sparsify(
    w: torch.Tensor, site: WeightSite, config: SparsifyConfig, statistics: object = None
) -> Encoding | str:
    """One weight's mask and kept values by magnitude (or why its layout cannot take the config);
    it learns from no data."""
    mask = sparsity_mask(w, site, config)
    if isinstance(mask, str):
        return mask
    return sparse_encoding(w, mask, site, config)


def sparse_encoding(
    w: torch.Tensor, mask: torch.Tensor, site: WeightSite, config: SparsifyConfig
) -> Encoding | str:
    """The kept values of `w` under `mask` (bool, the weight's shape), compressed as the config's
    joint form says, with the mask (or why the kept values cannot take that form)."""
    decode = None
    if config.palettize_nbits is not None:
        kept = _palettized(w, mask, site, config)
    elif config.quantize_dtype is not None:
        outcome = _quantized(w, mask, site, config)
        if isinstance(outcome, str):
            return outcome
        kept, decode = outcome  # type: ignore[assignment]
    else:
        kept = stored_float(_kept(w, mask), site.element)
    zeros = 1.0 - int(np.count_nonzero(mask.numpy())) / math.prod(site.shape)
    form = Sparse(mask.numpy(), kept, decode)  # type: ignore[arg-type]
    return Encoding(form, site.element, sparsity=zeros)
