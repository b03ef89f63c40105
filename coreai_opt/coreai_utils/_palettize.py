"""palettize_weights: k-means look-up tables emitted as `coreai.lut_to_dense` (+ a scale).

Which values are clustered: every weight of a group goes into a histogram bin keyed by its value
- fp16 and bf16 weights by their exact value (at most 63,487 bins), fp32 weights and weights
normalized by a per-channel scale by their value rounded to 11 significant bits (fp16's
precision, fp32's range: no overflow), and in fast mode by their value rounded to
`rounding_precision` decimals in float64 (never overflows, unlike rounding fp16 in fp16). Each bin
enters the k-means as one point at the exact mean of its values, weighted by its count, so the
clustering is optimal among all partitions that keep every bin whole - for 16-bit weights, optimal
outright. Scalar clustering is the exact 1-D dynamic programme of `_kmeans`; vector clustering
(`cluster_dim` > 1, vectors of consecutive output channels) has no exact polynomial algorithm and
uses Lloyd's iterations from seeded k-means++ starts.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import tcast
from coreai_opt._coreai import _rewrite as rw

from ._driver import Compressed, compress_sites
from ._kmeans import in_threads, kmeans_1d
from ._options import CompressionGranularity, DType
from ._quantize import _STORAGE as _NUMPY
from ._quantize import _fp_codes, _stored_positive
from ._results import CompressionReport, Progress

G = CompressionGranularity
N_BITS = (1, 2, 3, 4, 6, 8)
LUT_DTYPES = (DType.INT8, DType.UINT8, DType.FP8_E4M3FN, DType.FP8_E5M2)
_TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class PalettizePlan:
    n_bits: int = 4
    lut_dtype: DType | None = None
    granularity: CompressionGranularity = G.PER_TENSOR
    group_size: int = 32
    cluster_dim: int = 1
    per_channel_scale: bool = False
    workers: int = 1
    fast: bool = False
    rounding_precision: int = 4

    def validate(self) -> None:
        if self.n_bits not in N_BITS:
            raise ValueError(f"n_bits must be one of {', '.join(map(str, N_BITS))}, not {self.n_bits}")
        if self.lut_dtype is not None and self.lut_dtype not in LUT_DTYPES:
            raise ValueError("lut_dtype is None, INT8, UINT8, FP8_E4M3FN or FP8_E5M2")
        if self.granularity not in (G.PER_TENSOR, G.PER_CHANNEL, G.PER_GROUPED_CHANNEL):
            raise ValueError(
                "palettize_weights takes per-tensor, per-channel or per-grouped-channel granularity"
            )
        if self.group_size < 1:
            raise ValueError("group_size must be positive")
        if self.cluster_dim < 1:
            raise ValueError("cluster_dim must be positive")
        if self.cluster_dim > 1 and self.granularity is G.PER_CHANNEL:
            raise ValueError(
                "cluster_dim > 1 clusters vectors across output channels: use per-tensor or grouped granularity"
            )
        if (
            self.cluster_dim > 1
            and self.granularity is G.PER_GROUPED_CHANNEL
            and self.group_size % self.cluster_dim
        ):
            raise ValueError("group_size must be a multiple of cluster_dim")
        if self.workers < 1:
            raise ValueError("num_kmeans_workers must be 1 or more")
        if self.rounding_precision < 0:
            raise ValueError("rounding_precision must be 0 or more")


def _round_11_bits(x: torch.Tensor) -> torch.Tensor:
    """float32 values rounded (to nearest even) to 11 significant bits, staying in float32 range."""
    bits = x.contiguous().view(torch.int32)
    rounded = (bits + 0x7FF + ((bits >> 12) & 1)) & ~0xFFF
    out = rounded.view(torch.float32)
    return torch.where(torch.isfinite(out), out, x)  # never round a huge value up to inf


def _lut_groups(channels: int, plan: PalettizePlan) -> int | str:
    if plan.granularity is G.PER_TENSOR:
        return 1
    if plan.granularity is G.PER_CHANNEL:
        return channels
    if channels % plan.group_size:
        return (
            f"{channels} output channels are not a multiple of group_size {plan.group_size} "
            "(lut_to_dense needs equal groups)"
        )
    return channels // plan.group_size


def _keys(values: torch.Tensor, plan: PalettizePlan, exact: bool) -> torch.Tensor:
    if plan.fast:
        return torch.round(values.double(), decimals=plan.rounding_precision).float()
    return values if exact else _round_11_bits(values)


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
    x: np.ndarray, w: np.ndarray, bin_keys: np.ndarray, offsets: np.ndarray, plan: PalettizePlan
) -> tuple[np.ndarray, np.ndarray]:
    """k-means of every group's bins -> centroids [G, P] and cluster upper-bound keys [G, P-1]."""
    entries = 2**plan.n_bits
    uppers, centroids, found = kmeans_1d(x, w, offsets, entries, plan.workers)
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


def _clusters_16_bit(rows: torch.Tensor, plan: PalettizePlan) -> tuple[np.ndarray, torch.Tensor]:
    """Exact 16-bit weights in few large groups: histogram every bit pattern, no sorting.

    Every element's cluster is then a table lookup by its bit pattern.
    """
    groups = rows.shape[0]
    patterns = rows.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
    keyed = patterns + (torch.arange(groups)[:, None] * _PATTERNS)
    counts = (
        torch.bincount(keyed.reshape(-1), minlength=groups * _PATTERNS).reshape(groups, _PATTERNS).numpy()
    )
    every_value = torch.arange(_PATTERNS, dtype=torch.int32).to(torch.int16).view(rows.dtype).double().numpy()
    xs, ws, offsets = [], [], [0]
    for g in range(groups):
        used = np.flatnonzero(counts[g])
        values, inverse = np.unique(every_value[used], return_inverse=True)  # +0 and -0 share a bin
        xs.append(values)
        ws.append(np.bincount(inverse, weights=counts[g, used]))
        offsets.append(offsets[-1] + len(values))
    x = np.concatenate(xs)
    centroids, bounds = _finish(x, np.concatenate(ws), x.astype(np.float32), np.array(offsets), plan)
    table = torch.searchsorted(
        torch.from_numpy(bounds),
        torch.from_numpy(every_value.astype(np.float32)).expand(groups, -1).contiguous(),
    )
    return centroids, table.reshape(-1)[keyed]


def _scalar_clusters(
    rows: torch.Tensor, native: torch.Tensor | None, plan: PalettizePlan
) -> tuple[np.ndarray, torch.Tensor]:
    """rows [G, m] (float32) -> centroids [G, P] (float64) and the index of every element [G, m].

    `native` holds the same rows in their 16-bit dtype when their values are clustered exactly.
    """
    from ._kmeans_kernels import assign

    groups, size = rows.shape
    if (
        native is not None
        and not plan.fast
        and size >= _PATTERNS
        and groups * _PATTERNS <= _MAX_HISTOGRAM_BINS
    ):
        return _clusters_16_bit(native, plan)  # the histogram is smaller than the data: no sort
    # every key function here is monotone, so sorting the values sorts their keys too; numpy's
    # vectorised sort of values alone is several times faster than an argsort
    sorted_values = rows.numpy().copy()
    in_threads(lambda a, b: sorted_values[a:b].sort(axis=1), groups, plan.workers)
    sorted_keys = _keys(torch.from_numpy(sorted_values), plan, native is not None).numpy()
    x, w, bin_keys, offsets = _bins(sorted_keys, sorted_values.astype(np.float64))
    centroids, bounds = _finish(x, w, bin_keys, offsets, plan)
    keys = _keys(rows, plan, native is not None).contiguous().numpy()
    index = np.empty((groups, size), np.int64)
    in_threads(lambda a, b: assign(keys, bounds, index, a, b), groups, plan.workers)
    return centroids, torch.from_numpy(index)


def _vector_clusters(vectors: torch.Tensor, plan: PalettizePlan) -> tuple[np.ndarray, torch.Tensor]:
    """vectors [G, m, V] -> centroids [G, P, V] and indices [G, m]: seeded k-means++ then Lloyd."""
    entries = 2**plan.n_bits
    generator = torch.Generator().manual_seed(0)
    groups, m, dim = vectors.shape
    centroids = np.zeros((groups, entries, dim))
    index = torch.zeros(groups, m, dtype=torch.int64)
    for g in range(groups):
        points = vectors[g].double()
        chosen = [int(torch.randint(m, (1,), generator=generator))]
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
            labels = torch.cdist(points, centers).argmin(1)
            sums = torch.zeros_like(centers).index_add_(0, labels, points)
            counts = torch.bincount(labels, minlength=len(centers)).double()
            moved = torch.where(counts[:, None] > 0, sums / counts.clamp(min=1)[:, None], centers)
            if torch.equal(moved, centers):
                break
            centers = moved
        labels = torch.cdist(points, centers).argmin(1)
        centroids[g, : len(centers)] = centers.numpy()
        centroids[g, len(centers) :] = centers[-1].numpy()
        index[g] = labels
    return centroids, index


def _quantize_lut(centroids: np.ndarray, dtype: DType) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """One scale (and zero point) per LUT: (stored codes, scale [G], zero [G], element)."""
    groups = centroids.shape[0]
    flat = centroids.reshape(groups, -1)
    if dtype in (DType.INT8, DType.UINT8):
        if dtype is DType.INT8:
            amax = np.abs(flat).max(axis=1)
            scale = np.where(amax > 0, amax / 127, 1.0).astype(np.float32).astype(np.float64)
            zero = np.zeros(groups, np.int64)
            codes = np.clip(np.rint(flat / scale[:, None]), -127, 127)
            return codes.astype(np.int8).reshape(centroids.shape), scale, zero, "si8"
        lo, hi = np.minimum(flat.min(axis=1), 0.0), np.maximum(flat.max(axis=1), 0.0)
        scale = np.where(hi > lo, (hi - lo) / 255, 1.0).astype(np.float32).astype(np.float64)
        zero = np.clip(np.rint(-lo / scale), 0, 255).astype(np.int64)
        codes = np.clip(np.rint(flat / scale[:, None]) + zero[:, None], 0, 255)
        return codes.astype(np.uint8).reshape(centroids.shape), scale, zero, "ui8"
    code, element = {DType.FP8_E4M3FN: ("e4m3fn", "f8E4M3FN"), DType.FP8_E5M2: ("e5m2", "f8E5M2")}[dtype]
    amax = np.abs(flat).max(axis=1)
    fmax = float(tcast.number(code).max)
    scale = np.where(amax > 0, amax / fmax, 1.0).astype(np.float32).astype(np.float64)
    on_grid = tcast.cast(torch.from_numpy(flat / scale[:, None]).float(), code)
    codes = _fp_codes(on_grid, dtype).numpy()
    return codes.reshape(centroids.shape), scale, np.zeros(groups, np.int64), element


def _lut_values(codes: np.ndarray, element: str) -> np.ndarray:
    """Decode stored LUT codes to float64 (for the SNR and nothing else)."""
    import ml_dtypes

    if element in ("si8", "ui8"):
        return codes.astype(np.float64)
    np_type = {"f8E4M3FN": ml_dtypes.float8_e4m3fn, "f8E5M2": ml_dtypes.float8_e5m2}[element]
    return codes.view(np_type).astype(np.float64)


def _axis_constant(axis: int) -> Any:
    from coreai._compiler import ir
    from coreai._compiler.dialects import coreai as dialect

    scalar = ir.RankedTensorType.get([], ir.IntegerType.get_signed(16))
    return dialect.ConstantOp(value=ir.DenseElementsAttr.get(np.array(axis, np.int16), type=scalar)).result


def _palettize_one(
    w: torch.Tensor, site: rw.WeightSite, plan: PalettizePlan, rewriter: rw.Rewriter
) -> Compressed | str:
    axis, shape, dim = site.output_axis, site.shape, plan.cluster_dim
    channels = shape[axis]
    groups = _lut_groups(channels, plan)
    if isinstance(groups, str):
        return groups
    if channels % dim:
        return f"{channels} output channels are not a multiple of cluster_dim {dim}"
    moved = w.movedim(axis, 0)
    moved_shape = tuple(moved.shape)
    matrix = moved.reshape(channels, -1).float()
    exact = site.element in ("f16", "bf16") and not plan.per_channel_scale
    channel_scale = np.ones(channels)
    if plan.per_channel_scale:
        amax = matrix.abs().amax(dim=1).double().numpy()
        channel_scale = np.where(amax > 0, amax, 1.0).astype(np.float32).astype(np.float64)
        matrix = matrix / torch.from_numpy(channel_scale).float()[:, None]
    cols = matrix.shape[1]
    if dim == 1:
        native = moved.reshape(groups, -1) if exact else None
        centroids, index = _scalar_clusters(matrix.reshape(groups, -1), native, plan)
        centroids = centroids[:, :, None]  # [G, P, 1]
        index = index.reshape(channels, cols)
    else:
        vectors = matrix.reshape(channels // dim, dim, cols).transpose(1, 2)  # [C/V, cols, V]
        centroids, index = _vector_clusters(vectors.reshape(groups, -1, dim), plan)
        index = index.reshape(channels // dim, cols)
    entries = 2**plan.n_bits
    storage = _TORCH[site.element]
    if plan.lut_dtype is None:
        lut_store = torch.from_numpy(centroids).to(storage)
        lut_dense = lut_store.double().numpy()
        lut_element, lut_scale, lut_zero = site.element, np.ones(groups), np.zeros(groups, np.int64)
        lut_array = (
            lut_store.numpy() if storage is not torch.bfloat16 else lut_store.view(torch.int16).numpy()
        )
    else:
        lut_array, lut_scale, lut_zero, lut_element = _quantize_lut(centroids, plan.lut_dtype)
        lut_dense = _lut_values(lut_array, lut_element) - lut_zero[:, None, None]
    # one scale per channel (or per LUT) folds the per-channel scale and the LUT's own scale
    per_channel = plan.per_channel_scale
    group_of = np.arange(channels) // (channels // groups)
    # stored in the weight's dtype: the runtime mis-computes fp16 outputs from f32 scales
    scale = _stored_positive(
        channel_scale * lut_scale[group_of] if per_channel else lut_scale, _NUMPY[site.element]
    )
    zero = lut_zero[group_of] if per_channel else lut_zero
    needs_scale = per_channel or plan.lut_dtype is not None

    # the reconstruction, for the SNR: LUT entry (less zero point) x scale
    rows_per_group = index.shape[0] // groups
    dense = torch.from_numpy(lut_dense)[
        torch.arange(groups).repeat_interleave(rows_per_group)[:, None], index
    ]  # [rows, cols, V]
    dense = dense.permute(0, 2, 1).reshape(channels, cols)
    if needs_scale:
        per_row = scale.astype(np.float64) if per_channel else scale.astype(np.float64)[group_of]
        dense = dense * torch.from_numpy(per_row)[:, None]
    reference = moved.reshape(channels, -1).double()
    noise = float(((dense - reference) ** 2).sum())
    signal = float((reference * reference).sum())

    index_shape = (channels // dim, *moved_shape[1:])
    indices = index.reshape(index_shape).movedim(0, axis).contiguous().to(torch.uint8)
    lut_shape = (*tuple(groups if a == axis else 1 for a in range(len(shape))), entries, dim)
    param_shape = tuple((channels if per_channel else groups) if a == axis else 1 for a in range(len(shape)))
    index_dims = tuple(indices.shape)

    def build() -> Any:
        from coreai._compiler.dialects import coreai as dialect

        idx_c = rewriter.constant(site, indices.numpy(), f"ui{plan.n_bits}", index_dims)
        lut_c = rewriter.constant(site, lut_array, lut_element, lut_shape)
        out = dialect.LutToDenseOp(idx_c, lut_c, _axis_constant(axis)).result
        if not needs_scale:
            return out
        return rewriter.shift_scale(
            site, out, scale.reshape(param_shape), site.element, param_shape,
            zero.astype(np.uint8).reshape(param_shape), lut_element,
        )  # fmt: skip

    return Compressed(build, signal, noise, luts=groups)


def palettize_program(
    program: Any,
    plan: PalettizePlan,
    weight_num_threshold: int = 1024,
    progress: Progress | None = None,
) -> CompressionReport:
    """Palettize every eligible weight of `program` in place and report each one."""
    plan.validate()
    return compress_sites(
        program, weight_num_threshold, lambda w, site, rw_: _palettize_one(w, site, plan, rw_), progress
    )


def palettize_weights(
    coreai_program: Any,
    n_bits: int = 4,
    lut_dtype: DType | None = None,
    granularity: CompressionGranularity = G.PER_TENSOR,
    group_size: int = 32,
    cluster_dim: int = 1,
    enable_per_channel_scale: bool = False,
    weight_num_threshold: int = 1024,
    num_kmeans_workers: int = 1,
    enable_fast_kmeans_mode: bool = False,
    rounding_precision: int = 4,
    in_place: bool = False,
) -> Any:
    """Seed API: palettize the weights of an AIProgram; returns the (copied unless in_place) program.

    `num_kmeans_workers` threads share the k-means groups (no processes); results do not depend on it.
    """
    plan = PalettizePlan(
        n_bits, lut_dtype, granularity, group_size, cluster_dim, enable_per_channel_scale,
        num_kmeans_workers, enable_fast_kmeans_mode, rounding_precision,
    )  # fmt: skip
    plan.validate()
    program = coreai_program if in_place else copy.deepcopy(coreai_program)
    palettize_program(program, plan, weight_num_threshold)
    return program
