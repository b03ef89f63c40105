"""Exact optimal 1-D weighted k-means, for palettization.

The points of one group are histogram bins: sorted distinct values `x` with weights `w` (how many
weights fell in the bin) - so a group of fp16 weights has at most 63,487 points however large it
is. The optimal k clusters are contiguous runs of sorted points, found by the dynamic programme

    D[q][i] = min over j of D[q-1][j-1] + cost(j, i)    (cost: the weighted squared error of x[j..i])

Costs come in O(1) from prefix sums of the points less their weighted mean (which keeps the
differences of prefix sums accurate). The matrix of each layer is Monge, so its row argmins are
monotone: each layer is solved by divide and conquer over rows, every row scanning only the
columns between its neighbours' argmins and above its own argmin one layer earlier -
O(k n log n) evaluations in tight loops. Two exact cuts halve the work again: the programme runs
k//2 layers over prefixes and the rest over (mirrored) suffixes and the halves meet at the best
cut, and any state costing more than a quick Lloyd clustering (an upper bound on the optimum)
is dropped with every longer prefix of its layer - few clusters over many points never pay.
An iterative SMAWK (O(k n), Wu 1991; Gronlund et al. 2017) was measured here too and was 5-7x
slower at every size that palettization meets (768 to 24,000 points, k 4 to 256): its REDUCE
step's data-dependent branches cost more than the log factor saves. See docs/benchmarks.md.

The kernels are compiled by numba on first use (nogil, so threads run groups in parallel) and
cached on disk; importing this module compiles nothing.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np


def _kernels() -> Any:
    from ._kmeans_kernels import groups

    return groups


def kmeans_1d(
    x: np.ndarray, w: np.ndarray, offsets: np.ndarray, k: int, workers: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Optimal k-means of many groups at once.

    `x` (sorted within each group, distinct) and `w` hold every group's points back to back,
    group g at offsets[g]:offsets[g+1]. Returns, per group, the index (within the group) of the
    last point of each cluster [G, k], the cluster centroids [G, k] (float64 weighted means) and
    the number of clusters found [G] (fewer than k only when a group has fewer points).
    `workers` threads share the groups (0: one per CPU); the result does not depend on it.
    """
    if not (np.isfinite(x).all() and np.isfinite(w).all() and (w > 0).all()):
        raise ValueError("kmeans_1d needs finite points and finite positive weights")
    kernel = _kernels()
    count = len(offsets) - 1
    uppers = np.zeros((count, k), np.int64)
    centroids = np.zeros((count, k), np.float64)
    found = np.zeros(count, np.int64)
    x = np.ascontiguousarray(x, np.float64)
    w = np.ascontiguousarray(w, np.float64)
    offsets = np.ascontiguousarray(offsets, np.int64)
    # chunks balanced by points, several per worker so uneven groups even out
    cuts = np.searchsorted(offsets, np.linspace(0, offsets[-1], _chunks(count, workers) + 1))
    in_threads(lambda a, b: kernel(x, w, offsets, k, a, b, uppers, centroids, found), count, workers, cuts)
    return uppers, centroids, found


def warm_kernels() -> None:
    """Compile (or load from the cache) the kernels by one call on two points."""
    kmeans_1d(np.array([0.0, 1.0]), np.ones(2), np.array([0, 2]), 1, workers=1)


def _chunks(count: int, workers: int) -> int:
    return max(1, min(count, (workers or os.cpu_count() or 1) * 8))


def in_threads(
    task: Callable[[int, int], Any], count: int, workers: int = 0, cuts: np.ndarray | None = None
) -> None:
    """Run task(first, last) over spans covering range(count) on `workers` threads (0: one per
    CPU); the tasks are numba kernels or numpy calls that release the GIL. `cuts` (ascending,
    from 0 to count) overrides the default of several equal spans per worker."""
    workers = workers or os.cpu_count() or 1
    if cuts is None:
        cuts = np.linspace(0, count, _chunks(count, workers) + 1).round()
    cuts = np.asarray(cuts, np.int64).clip(0, count)
    cuts[0], cuts[-1] = 0, count
    spans = [(int(a), int(b)) for a, b in itertools.pairwise(cuts) if b > a]
    if workers == 1 or len(spans) <= 1:
        for a, b in spans:
            task(a, b)
        return
    with ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(task, a, b) for a, b in spans]:
            future.result()
