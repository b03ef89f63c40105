"""numba kernels of the exact 1-D k-means (see _kmeans_1d), made on first use and cached as
`_numba.Kernels` says."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._numba import Kernels

_kernel = Kernels(
    globals(), __file__, "the k-means kernels compile afresh (about 15 s) and are not stored"
).kernel


@_kernel
def prefix_sums(x: Any, w: Any, mean: float, reverse: bool, p0: Any, p1: Any, p2: Any) -> None:
    """Prefix sums of the weights, weighted deviations from `mean` and their squares; with
    `reverse`, of the mirrored points (-x read from the end), which are again ascending."""
    n = x.shape[0]
    for t in range(n):
        i = n - 1 - t if reverse else t
        d = mean - x[i] if reverse else x[i] - mean
        p0[t + 1] = p0[t] + w[i]
        p1[t + 1] = p1[t] + w[i] * d
        p2[t + 1] = p2[t] + w[i] * d * d


@_kernel
def run_cost(p0: Any, p1: Any, p2: Any, j: int, i: int) -> float:
    """Weighted squared error of points j..i (inclusive) about their weighted mean."""
    s = p1[i + 1] - p1[j]
    e = (p2[i + 1] - p2[j]) - s * s / (p0[i + 1] - p0[j])
    return e if e > 0.0 else 0.0


@_kernel
def lloyd_cost(x: Any, mean: float, p0: Any, p1: Any, p2: Any, k: int) -> float:
    """Squared error of a quick heuristic clustering (Lloyd's iterations from weight quantiles):
    an upper bound on the optimum that lets the dynamic programme drop hopeless states."""
    n = x.shape[0]
    ends = np.empty(k, np.int64)
    fresh = np.empty(k, np.int64)
    count = 0
    for c in range(k - 1):
        target = p0[n] * (c + 1) / k
        i = np.searchsorted(p0[1:], target)
        if i < n - 1 and (count == 0 or i > ends[count - 1]):
            ends[count] = i
            count += 1
    ends[count] = n - 1
    count += 1
    centre = np.empty(k)
    for _ in range(25):
        start = 0
        for c in range(count):
            centre[c] = mean + (p1[ends[c] + 1] - p1[start]) / (p0[ends[c] + 1] - p0[start])
            start = ends[c] + 1
        moved = 0
        for c in range(count - 1):
            i = np.searchsorted(x, 0.5 * (centre[c] + centre[c + 1]), side="right") - 1
            if i >= 0 and i < n - 1 and (moved == 0 or i > fresh[moved - 1]):
                fresh[moved] = i
                moved += 1
        fresh[moved] = n - 1
        moved += 1
        same = moved == count
        for c in range(moved):
            same = same and fresh[c] == ends[c]
            ends[c] = fresh[c]
        count = moved
        if same:
            break
    total = 0.0
    start = 0
    for c in range(count):
        total += run_cost(p0, p1, p2, start, ends[c])
        start = ends[c] + 1
    return total


@_kernel
def layer(a: Any, cur: Any, arg: Any, p0: Any, p1: Any, p2: Any, r0: int, r1: int, c0: int, c1: int,
          lower: Any, limit: float, stack: Any) -> int:  # fmt: skip
    """Row minima of A[i][j] = a[j] + p2[i+1] - (p1[i+1]-p1[j])^2 / (p0[i+1]-p0[j]) for rows
    r0..r1 and columns c0..min(i, c1), by divide and conquer; returns the last row kept.

    The argmin is monotone in i (A is Monge), so the middle row's argmin bounds the columns of
    the rows on either side; `lower[i]` (the argmin one layer earlier) is a second lower bound.
    A row whose minimum exceeds `limit` cannot lie on an optimal path and nor can any row after
    it (the cost of a prefix never falls as it grows): those rows are not solved at all.
    """
    stack[0, 0], stack[0, 1], stack[0, 2], stack[0, 3] = r0, r1, c0, r1
    top = 1
    cut = r1 + 1  # first row dropped
    while top > 0:
        top -= 1
        lo, hi, clo, chi = stack[top, 0], stack[top, 1], stack[top, 2], stack[top, 3]
        if lo >= cut:
            continue
        if hi >= cut:
            hi = cut - 1
        mid = (lo + hi) >> 1
        start = max(clo, lower[mid], 0)
        end = min(chi, mid, c1)
        best = np.inf
        best_col = end
        w_end, s_end = p0[mid + 1], p1[mid + 1]
        for j in range(start, end + 1):
            s = s_end - p1[j]
            v = a[j] - s * s / (w_end - p0[j])
            if v < best:
                best = v
                best_col = j
        value = best + p2[mid + 1]
        if not value <= limit:
            cut = mid
            if lo < mid:
                stack[top, 0], stack[top, 1], stack[top, 2], stack[top, 3] = lo, mid - 1, clo, end
                top += 1
            continue
        cur[mid] = value if value > 0.0 else 0.0
        arg[mid] = best_col
        if lo < mid:
            stack[top, 0], stack[top, 1], stack[top, 2], stack[top, 3] = lo, mid - 1, clo, best_col
            top += 1
        if mid < hi:
            stack[top, 0], stack[top, 1], stack[top, 2], stack[top, 3] = mid + 1, hi, best_col, chi
            top += 1
    return cut - 1


@_kernel
def half(p0: Any, p1: Any, p2: Any, k: int, clusters: int, limit: float, split: Any, last: Any) -> int:
    """The first `clusters` layers of the dynamic programme over all n points (k in total):
    fills split[q][i] (first point of cluster q when it ends at i) and last[i] (the cost of
    points 0..i in `clusters` clusters, inf where dropped); returns the last row kept."""
    n = p0.shape[0] - 1
    prev = np.empty(n)
    cur = np.empty(n)
    a = np.empty(n)
    arg = np.empty(n, np.int64)
    lower = np.zeros(n, np.int64)
    stack = np.empty((136, 4), np.int64)  # depth <= 2 log2(n) + 2
    kept = n - 1
    for i in range(n):
        prev[i] = run_cost(p0, p1, p2, 0, i)
        if not prev[i] <= limit:
            kept = i - 1
            break
    for q in range(1, clusters):
        r0, r1 = q, n - k + q  # the other k-1-q clusters need a point each
        for j in range(q, kept + 2):
            a[j] = prev[j - 1] - p2[j]
        kept = layer(a, cur, arg, p0, p1, p2, r0, r1, q, kept + 1, lower, limit, stack)
        for i in range(r0, kept + 1):
            split[q, i] = arg[i]
            lower[i] = arg[i]
        for i in range(kept + 1, r1 + 1):
            lower[i] = arg[kept]  # a later row's argmin is no smaller
        prev, cur = cur, prev
    for i in range(n):
        last[i] = prev[i] if i <= kept else np.inf
    return kept


@_kernel
def one_group(x: Any, w: Any, k: int, upper: Any, centroid: Any) -> int:
    """Cluster one group; fills the upper point index and centroid of each cluster; returns
    the number of clusters (< k only when there are fewer than k points).

    The programme runs from both ends - k//2 clusters over prefixes, the rest over suffixes -
    and the halves meet at the best cut; a Lloyd clustering bounds the cost, so states costing
    more than it (prefixes with too few clusters) are never solved.
    """
    n = x.shape[0]
    if n <= k:
        for i in range(n):
            upper[i] = i
            centroid[i] = x[i]
        return n
    total = 0.0
    mean = 0.0
    for i in range(n):
        total += w[i]
        mean += w[i] * x[i]
    mean /= total
    fp0, fp1, fp2 = np.zeros(n + 1), np.zeros(n + 1), np.zeros(n + 1)
    bp0, bp1, bp2 = np.zeros(n + 1), np.zeros(n + 1), np.zeros(n + 1)
    prefix_sums(x, w, mean, False, fp0, fp1, fp2)
    prefix_sums(x, w, mean, True, bp0, bp1, bp2)
    limit = lloyd_cost(x, mean, fp0, fp1, fp2, k)
    limit += 1e-6 * limit + 1e-9 * fp2[n]  # room for rounding: never drop the optimum
    ahead = k // 2
    behind = k - ahead
    ahead_split = np.zeros((max(ahead, 1), n), np.int32)
    behind_split = np.zeros((behind, n), np.int32)
    ahead_last = np.empty(n)
    behind_last = np.empty(n)
    cut = -1  # the last point of the prefix half
    if ahead > 0:
        half(fp0, fp1, fp2, k, ahead, limit, ahead_split, ahead_last)
        half(bp0, bp1, bp2, k, behind, limit, behind_split, behind_last)
        best = np.inf
        for i in range(ahead - 1, n - behind):
            v = ahead_last[i] + behind_last[n - 2 - i]
            if v < best:
                best = v
                cut = i
    end = cut
    for q in range(ahead - 1, -1, -1):
        upper[q] = end
        end = ahead_split[q, end] - 1 if q > 0 else -1
    end = n - 2 - cut  # in mirrored positions
    for r in range(behind - 1, -1, -1):
        begin = behind_split[r, end] if r > 0 else 0
        upper[ahead + behind - 1 - r] = n - 1 - begin
        end = begin - 1
    fill_centroids(x, w, k, upper, centroid)
    return k


@_kernel
def fill_centroids(x: Any, w: Any, k: int, upper: Any, centroid: Any) -> None:
    """Each cluster's weighted mean, the clusters given by their upper point indices."""
    begin = 0
    for q in range(k):
        s = 0.0
        c = 0.0
        for i in range(begin, upper[q] + 1):
            s += w[i] * x[i]
            c += w[i]
        centroid[q] = s / c
        begin = upper[q] + 1


@_kernel
def groups(x: Any, w: Any, offsets: Any, k: int, first: int, last: int,
           uppers: Any, centroids: Any, found: Any) -> None:  # fmt: skip
    for g in range(first, last):
        a, b = offsets[g], offsets[g + 1]
        found[g] = one_group(x[a:b], w[a:b], k, uppers[g], centroids[g])


@_kernel
def runs(keys: Any, values: Any, x: Any, w: Any, bin_keys: Any, offsets: Any) -> int:
    """Run-length encode sorted rows: one bin per distinct key, with the mean of its values.

    keys/values: [G, m] sorted by key along each row. Fills x (bin means), w (counts), bin_keys
    and offsets (G + 1) and returns the number of bins.
    """
    count = 0
    offsets[0] = 0
    for g in range(keys.shape[0]):
        m = keys.shape[1]
        i = 0
        while i < m:
            key = keys[g, i]
            total = 0.0
            j = i
            while j < m and keys[g, j] == key:
                total += values[g, j]
                j += 1
            x[count] = total / (j - i)
            w[count] = j - i
            bin_keys[count] = key
            count += 1
            i = j
        offsets[g + 1] = count
    return count


@_kernel
def assign(keys: Any, bounds: Any, index: Any, first: int, last: int) -> None:
    """index[g, i] = the cluster of keys[g, i]: how many cluster bounds (each cluster's largest
    key, ascending) lie below it, by binary search."""
    limit = bounds.shape[1]
    for g in range(first, last):
        for i in range(keys.shape[1]):
            key = keys[g, i]
            lo, hi = 0, limit
            while lo < hi:
                mid = (lo + hi) >> 1
                if bounds[g, mid] < key:
                    lo = mid + 1
                else:
                    hi = mid
            index[g, i] = lo
