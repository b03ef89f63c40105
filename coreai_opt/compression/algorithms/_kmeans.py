"""Palettized weights: exact k-means look-up tables (per tensor, channel or group of channels).

Which values are clustered: every weight of a group goes into a histogram bin keyed by its value
- fp16 and bf16 weights by their exact value (at most 63,487 bins), fp32 weights and weights
normalized by a per-channel scale by their value at 12 significant bits in float32's range (tcast's
`e8m11`: one bit finer than fp16), and in fast mode by their value rounded to `rounding_precision`
decimals in float64.
Each bin enters the k-means as one point at the exact mean of its values, weighted by its count,
so the clustering is optimal among all partitions that keep every bin whole - for 16-bit
weights, optimal outright. Scalar clustering is the exact 1-D dynamic programme of `_kmeans_1d`;
vector clustering (`cluster_dim` > 1, vectors of consecutive output channels) has no exact
polynomial algorithm and uses Lloyd's iterations from seeded k-means++ starts, on a seeded sample
of at most 32,768 of a table's vectors (every vector is then assigned its nearest entry).

LUT entries stay in the weight's dtype or are quantized by tcast (int8 symmetric, uint8 with a zero
point, FP8) with one float32 scale per LUT; a per-channel scale and the LUT's scale fold into one
scale per channel, stored in the weight's dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

import tcast
from coreai_opt._elements import Element, element
from coreai_opt._pieces import spans
from coreai_opt.weights import Encoding, Palettized, ShiftScale, Stored, WeightSite

from ..configs import CompressionGranularity, DType, PalettizeConfig, QScheme
from ..grids import cast_codes, stored_codes, stored_float
from ._columns import in_pieces
from ._kmeans_1d import in_threads, kmeans_1d
from ._shared_clusters import shared

G = CompressionGranularity


def _lut_groups(channels: int, config: PalettizeConfig) -> int | str:
    if config.granularity is G.PER_TENSOR:
        return 1
    if config.granularity is G.PER_CHANNEL:
        return channels
    if channels % config.group_size:
        return (
            f"{channels} output channels are not a multiple of group_size {config.group_size} "
            "(lut_to_dense needs equal groups)"
        )
    return channels // config.group_size


def _keys(values: torch.Tensor, config: PalettizeConfig, exact: bool) -> torch.Tensor:
    """Histogram keys: monotone in the values, so sorting values sorts keys."""
    if config.enable_fast_kmeans_mode:
        return torch.round(values.double(), decimals=config.rounding_precision).float()
    return values if exact else tcast.cast(values, "e8m11")


def _bins(sorted_keys: np.ndarray, sorted_values: np.ndarray) -> tuple[np.ndarray, ...]:
    """Histogram rows sorted by key: (bin means, counts, bin keys, offsets)."""
    from ._kmeans_kernels import runs

    count = sorted_keys.size
    x, w = np.empty(count), np.empty(count)
    bin_keys = np.empty(count, np.float32)
    offsets = np.empty(sorted_keys.shape[0] + 1, np.int64)
    used = runs(sorted_keys, sorted_values, x, w, bin_keys, offsets)
    return x[:used], w[:used], bin_keys[:used], offsets


def _finish(
    x: np.ndarray, w: np.ndarray, bin_keys: np.ndarray, offsets: np.ndarray, config: PalettizeConfig
) -> tuple[np.ndarray, np.ndarray]:
    """k-means of every group's bins -> centroids [G, P] and cluster upper-bound keys [G, P-1]."""
    entries = 2**config.n_bits
    uppers, centroids, found = kmeans_1d(x, w, offsets, entries, config.num_kmeans_workers)
    # each cluster's bound is the key of its last bin (inf past the clusters found); unused
    # entries repeat the last centroid
    inner = np.arange(entries - 1)[None, :] < (found - 1)[:, None]
    last = np.where(inner, offsets[:-1, None] + uppers[:, : entries - 1], 0)
    bounds = np.where(inner, bin_keys[last], np.float32(np.inf)).astype(np.float32)
    unused = np.arange(entries)[None, :] >= found[:, None]
    final = centroids[np.arange(len(found)), found - 1][:, None]
    return np.where(unused, final, centroids), bounds


_PATTERNS = 1 << 16
_MAX_HISTOGRAM_BINS = 1 << 26  # groups x 65,536 counters for the 16-bit histogram path


def _patterns(rows: torch.Tensor) -> torch.Tensor:
    """The bit patterns of 16-bit values as int64 in [0, 65536)."""
    return rows.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF


def _clusters_16_bit(rows: torch.Tensor, config: PalettizeConfig) -> tuple[np.ndarray, torch.Tensor]:
    """Exact 16-bit weights in few large groups: histogram every bit pattern, no sorting.

    Every element's cluster is then a table lookup by its bit pattern; both passes run over
    pieces of the rows, so no temporary is the size of the weight.
    """
    groups, size = rows.shape
    counts = np.zeros((groups, _PATTERNS), np.int64)
    for g in range(groups):
        for a, b in spans(size, 1):  # column pieces of one group's row
            counts[g] += torch.bincount(_patterns(rows[g, a:b]), minlength=_PATTERNS).numpy()
    every_value = torch.arange(_PATTERNS, dtype=torch.int32).to(torch.int16).view(rows.dtype).double().numpy()
    xs, ws, offsets = [], [], [0]
    for g in range(groups):
        used = np.flatnonzero(counts[g])
        values, inverse = np.unique(every_value[used], return_inverse=True)  # +0 and -0 share a bin
        xs.append(values)
        ws.append(np.bincount(inverse, weights=counts[g, used]))
        offsets.append(offsets[-1] + len(values))
    x = np.concatenate(xs)
    centroids, bounds = _finish(x, np.concatenate(ws), x.astype(np.float32), np.array(offsets), config)
    every_key = torch.from_numpy(every_value.astype(np.float32))
    index = torch.empty((groups, size), dtype=torch.uint8)
    for g in range(groups):
        table = torch.searchsorted(torch.from_numpy(bounds[g]), every_key).to(torch.uint8)
        for a, b in spans(size, 1):
            index[g, a:b] = table[_patterns(rows[g, a:b])]
    return centroids, index


def _scalar_clusters(
    rows: torch.Tensor, native: torch.Tensor | None, config: PalettizeConfig
) -> tuple[np.ndarray, torch.Tensor]:
    """rows [G, m] (float32, or the 16-bit `native` rows themselves) -> centroids [G, P] (float64)
    and the index of every element [G, m] (uint8).

    `native` holds the same rows in their 16-bit dtype when their values are clustered exactly.
    Groups are independent, so they are clustered a few at a time (about `_pieces.PIECE` values).
    """
    groups, size = rows.shape
    if (
        native is not None
        and not config.enable_fast_kmeans_mode
        and size >= _PATTERNS
        and groups * _PATTERNS <= _MAX_HISTOGRAM_BINS
    ):
        return _clusters_16_bit(native, config)  # the histogram is smaller than the data: no sort
    index = torch.empty((groups, size), dtype=torch.uint8)
    centroids = [
        _sorted_clusters(rows[a:b].float(), native is not None, config, index[a:b].numpy())
        for a, b in spans(groups, size)
    ]
    return np.concatenate(centroids), index


def _sorted_clusters(
    rows: torch.Tensor, exact: bool, config: PalettizeConfig, index: np.ndarray
) -> np.ndarray:
    """Centroids [g, P] of a few groups' rows [g, m] (float32) by sorting them, and each element's
    cluster into `index` [g, m]."""
    from ._kmeans_kernels import assign

    groups = rows.shape[0]
    # every key function here is monotone, so sorting the values sorts their keys too; numpy's
    # vectorised sort of values alone is several times faster than an argsort
    sorted_values = rows.numpy().copy()
    in_threads(lambda a, b: sorted_values[a:b].sort(axis=1), groups, config.num_kmeans_workers)
    sorted_keys = _keys(torch.from_numpy(sorted_values), config, exact).numpy()
    x, w, bin_keys, offsets = _bins(sorted_keys, sorted_values.astype(np.float64))
    centroids, bounds = _finish(x, w, bin_keys, offsets, config)
    keys = _keys(rows, config, exact).contiguous().numpy()
    in_threads(lambda a, b: assign(keys, bounds, index, a, b), groups, config.num_kmeans_workers)
    return centroids


def _channel_weights(
    importance: torch.Tensor, channel_scale: np.ndarray, groups: int, floor: float = 0.0
) -> Callable[[int, int], torch.Tensor]:
    """Each element's weight for LUT groups a:b ([b - a, elements of a group], float64): its
    importance (channels first; a broadcast view stays one) times its channel scale squared - an
    error of a normalized value costs that much - widened only for the groups asked for, so a 1B
    model's head never has a float64 copy of its importance."""
    channels = importance.shape[0]
    per_group = channels // groups
    rows = importance.reshape(channels, -1)  # a view, also of a broadcast importance

    def weights(a: int, b: int) -> torch.Tensor:
        top, bottom = a * per_group, b * per_group
        piece = rows[top:bottom].double()  # may be the importance itself: never written to
        if floor:
            piece = piece + floor
        piece = piece * torch.from_numpy(channel_scale[top:bottom] ** 2)[:, None]
        return piece.reshape(b - a, -1)

    return weights


def _weighted_clusters(
    rows: torch.Tensor, weights: Callable[[int, int], torch.Tensor], exact: bool, config: PalettizeConfig
) -> tuple[np.ndarray, torch.Tensor]:
    """rows [G, m] (float32) clustered with a weight per element (`weights(a, b)`: groups a:b's
    [b - a, m], float64, positive) -> centroids [G, P] and indices [G, m]: the same exact 1-D
    programme, each histogram bin weighted by the sum of its elements' weights and placed at their
    weighted mean."""
    from ._kmeans_kernels import assign

    groups, size = rows.shape
    index = torch.empty((groups, size), dtype=torch.uint8)
    centroids = []
    for a, b in spans(groups, size):
        values, order = torch.sort(rows[a:b].float(), dim=1, stable=True)
        weight = torch.gather(weights(a, b), 1, order).numpy().reshape(-1)
        keys = _keys(values, config, exact).numpy()
        fresh = np.ones(keys.shape, bool)
        fresh[:, 1:] = keys[:, 1:] != keys[:, :-1]  # a new bin starts each row and each new key
        bin_of = np.cumsum(fresh.reshape(-1)) - 1
        total = np.bincount(bin_of, weights=weight)
        x = np.bincount(bin_of, weights=weight * values.double().numpy().reshape(-1)) / total
        offsets = np.concatenate([[0], np.cumsum(fresh.sum(axis=1))]).astype(np.int64)
        found, bounds = _finish(x, total, keys.reshape(-1)[fresh.reshape(-1)], offsets, config)
        keyed = _keys(rows[a:b].float(), config, exact).contiguous().numpy()
        in_threads(lambda c, d, k=keyed, u=bounds, i=index[a:b].numpy(): assign(k, u, i, c, d),
                   b - a, config.num_kmeans_workers)  # fmt: skip
        centroids.append(found)
    return np.concatenate(centroids), index


def _vector_clusters(
    vectors: torch.Tensor, config: PalettizeConfig, weights: torch.Tensor | None = None
) -> tuple[np.ndarray, torch.Tensor]:
    """vectors [G, m, V] -> centroids [G, P, V] and indices [G, m]: seeded k-means++ then Lloyd;
    with `weights` [G, m, V] each coordinate's squared error counts by its weight."""
    entries = 2**config.n_bits
    generator = torch.Generator().manual_seed(0)
    groups, m, dim = vectors.shape
    centroids = np.zeros((groups, entries, dim))
    index = torch.zeros(groups, m, dtype=torch.int64)
    for g in range(groups):
        every = vectors[g].double()
        every_pull = torch.ones_like(every) if weights is None else weights[g].double()
        sample = _vector_sample(m, generator)
        points, pull = (every, every_pull) if sample is None else (every[sample], every_pull[sample])
        chosen = [int(torch.randint(len(points), (1,), generator=generator))]
        nearest = ((points - points[chosen[0]]) ** 2).sum(1)
        for _ in range(1, min(entries, m)):
            total = float(nearest.sum())
            if total == 0:
                break
            pick = int(torch.multinomial(nearest / total, 1, generator=generator))
            chosen.append(pick)
            nearest = torch.minimum(nearest, ((points - points[pick]) ** 2).sum(1))
        centers = points[chosen].clone()
        for _ in range(50):
            labels = _nearest(points, pull, centers)
            sums = torch.zeros_like(centers).index_add_(0, labels, points * pull)
            counts = torch.zeros_like(centers).index_add_(0, labels, pull)
            moved = torch.where(counts > 0, sums / counts.clamp(min=1e-300), centers)
            if torch.equal(moved, centers):
                break
            centers = moved
        labels = _nearest(every, every_pull, centers)
        centroids[g, : len(centers)] = centers.numpy()
        centroids[g, len(centers) :] = centers[-1].numpy()
        index[g] = labels
    return centroids, index


_VECTOR_SAMPLE = 1 << 15  # vectors a table's Lloyd iterations learn from, at most (all are assigned)


def _vector_sample(count: int, generator: torch.Generator) -> torch.Tensor | None:
    """A seeded sample of `_VECTOR_SAMPLE` of `count` vectors, in order; None to take them all
    (a head's millions of vectors x 256 entries x 50 iterations would take hours on a CPU)."""
    if count <= _VECTOR_SAMPLE:
        return None
    return torch.randperm(count, generator=generator)[:_VECTOR_SAMPLE].sort().values


def _nearest(points: torch.Tensor, pull: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """Each point's centre under its coordinates' weights (all one: Euclidean) - the distance less
    its part that is the same for every centre, sum(w q^2) - 2 sum(w p q), as two matrix products
    (in float64, in pieces of points)."""
    step = max(1, (1 << 22) // max(1, centers.shape[0]))
    squares = centers.pow(2).T

    def piece(a: int, b: int) -> torch.Tensor:
        return (pull[a:b] @ squares - 2 * (pull[a:b] * points[a:b]) @ centers.T).argmin(1)

    return in_pieces(piece, (len(points),), step, torch.int64, points.device)


_LUT_SCALE = "float32"  # one scale per LUT, in float32


def _quantize_lut(centroids: np.ndarray, dtype: DType) -> tuple[Stored, np.ndarray, np.ndarray]:
    """LUT entries quantized with one float32 scale (and zero point) per LUT by tcast: the stored
    entries, the scale [G] and the zero point [G] (float64); INT8 symmetric, UINT8 asymmetric."""
    groups = centroids.shape[0]
    flat = torch.from_numpy(centroids.reshape(groups, -1))
    qscheme = QScheme.ASYMMETRIC if dtype is DType.UINT8 else QScheme.SYMMETRIC
    codes = cast_codes(flat, dtype, qscheme, _LUT_SCALE, "_t0d1", tcast.ScaleMode.MAX)
    entries = stored_codes(codes.data.reshape(centroids.shape), dtype.element)
    zero = np.zeros(groups) if codes.offset is None else codes.offset.reshape(-1).double().numpy()
    return entries, codes.scale.reshape(-1).double().numpy(), zero


def _store_scales(values: np.ndarray, storage: Element) -> Stored:
    """Positive scales rounded by tcast into the weight's dtype, never to zero."""
    spec = tcast.number(storage.tcast)
    floor = spec.smallest_subnormal if spec.mbits else spec.smallest_normal
    rounded = tcast.cast(torch.from_numpy(np.maximum(values, floor)), spec)
    return stored_float(rounded, storage)


def palettize(
    w: torch.Tensor, site: WeightSite, config: PalettizeConfig, statistics: object = None
) -> Encoding | str:
    """One weight's indices, LUTs and scales by exact k-means of its values (or why its layout
    cannot take the config); it learns from no data."""
    return weighted_palettize(w, site, config, None)


def weighted_palettize(
    w: torch.Tensor, site: WeightSite, config: PalettizeConfig, importance: torch.Tensor | None,
    floor: float = 0.0,
) -> Encoding | str:  # fmt: skip
    """`palettize` with each element's squared error weighted by `importance` plus `floor` (the
    weight's shape, positive; None: every element alike): what the data-aware methods cluster.
    The clustering runs on the host (numba's kernels): a weight or importance on a GPU comes back."""
    w = w.cpu()
    importance = None if importance is None else importance.cpu()
    axis, dim = site.output_axis, config.cluster_dim
    channels = site.shape[axis]
    groups = _lut_groups(channels, config)
    if isinstance(groups, str):
        return groups
    if channels % dim:
        return f"{channels} output channels are not a multiple of cluster_dim {dim}"
    moved = w.movedim(axis, 0)
    rows = moved.reshape(channels, -1)  # in the weight's dtype: widened a piece at a time
    matrix, channel_scale = _channel_scaled(rows, config)
    pull = (
        None
        if importance is None
        else _channel_weights(importance.movedim(axis, 0), channel_scale, groups, floor)
    )
    layout = (tuple(site.shape), axis, site.element.name)
    centroids, index = shared(
        w, importance, floor, layout, config, lambda: _clusters(rows, matrix, pull, groups, site, config)
    )
    return _encoding(centroids, index, channel_scale, tuple(moved.shape), site, config, groups)


def _channel_scaled(rows: torch.Tensor, config: PalettizeConfig) -> tuple[torch.Tensor, np.ndarray]:
    """The rows clustered (each divided by its max |w| with a per-channel scale) and the scales."""
    channel_scale = np.ones(rows.shape[0])
    if not config.enable_per_channel_scale:
        return rows, channel_scale
    matrix = rows.float()
    amax = matrix.abs().amax(dim=1).double().numpy()  # float32 values
    channel_scale = np.where(amax > 0, amax, 1.0)
    return matrix / torch.from_numpy(channel_scale).float()[:, None], channel_scale


def _clusters(
    rows: torch.Tensor, matrix: torch.Tensor, pull: Callable[[int, int], torch.Tensor] | None, groups: int,
    site: WeightSite, config: PalettizeConfig,
) -> tuple[np.ndarray, torch.Tensor]:  # fmt: skip
    """Each LUT's centroids [G, P, V] and each channel's (or vector's) indices [C/V, cols]."""
    channels, cols, dim = rows.shape[0], rows.shape[1], config.cluster_dim
    if dim == 1:
        exact = site.element.bits == 16 and not config.enable_per_channel_scale
        native = rows.reshape(groups, -1) if exact else None
        if pull is None:
            centroids, index = _scalar_clusters(matrix.reshape(groups, -1), native, config)
        else:
            centroids, index = _weighted_clusters(matrix.reshape(groups, -1), pull, exact, config)
        return centroids[:, :, None], index.reshape(channels, cols)
    vectors = matrix.float().reshape(channels // dim, dim, cols).transpose(1, 2)  # [C/V, cols, V]
    weights = None
    if pull is not None:
        weights = pull(0, groups).reshape(channels // dim, dim, cols).transpose(1, 2).reshape(groups, -1, dim)
    centroids, index = _vector_clusters(vectors.reshape(groups, -1, dim), config, weights)
    return centroids, index.reshape(channels // dim, cols)


def _encoding(
    centroids: np.ndarray, index: torch.Tensor, channel_scale: np.ndarray, moved_shape: tuple[int, ...],
    site: WeightSite, config: PalettizeConfig, groups: int,
) -> Encoding:  # fmt: skip
    """The palettized form: indices, the LUTs in their stored dtype and the scales folding the
    per-channel scale and the LUT's own."""
    axis, shape, dim, per_channel = (
        site.output_axis,
        site.shape,
        config.cluster_dim,
        config.enable_per_channel_scale,
    )
    channels = shape[axis]
    if config.lut_dtype is None:
        lut = stored_float(tcast.cast(torch.from_numpy(centroids), site.element.tcast), site.element)
        lut_scale, lut_zero = np.ones(groups), np.zeros(groups)
    else:
        lut, lut_scale, lut_zero = _quantize_lut(centroids, config.lut_dtype)
    group_of = np.arange(channels) // (channels // groups)
    scale = _store_scales(channel_scale * lut_scale[group_of] if per_channel else lut_scale, site.element)
    zero = lut_zero[group_of] if per_channel else lut_zero
    indices = index.reshape((channels // dim, *moved_shape[1:])).movedim(0, axis).contiguous().to(torch.uint8)
    lut_shape = (*tuple(groups if a == axis else 1 for a in range(len(shape))), 2**config.n_bits, dim)
    lut = Stored(lut.values.reshape(lut_shape), lut.element)
    decode = None
    if per_channel or config.lut_dtype is not None:
        param_shape = tuple(
            (channels if per_channel else groups) if a == axis else 1 for a in range(len(shape))
        )
        offset = None
        if np.any(zero):
            offset = Stored(
                zero.astype(np.uint8).reshape(param_shape).view(lut.element.numpy_dtype()), lut.element
            )
        decode = ShiftScale(Stored(scale.values.reshape(param_shape), site.element), offset)
    form = Palettized(Stored(indices.numpy(), element(f"ui{config.n_bits}")), lut, axis, decode, groups)
    return Encoding(form, site.element, luts=groups)
