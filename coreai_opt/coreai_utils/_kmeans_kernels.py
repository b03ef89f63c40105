"""numba kernels of the exact 1-D k-means (see _kmeans). Imported only when palettizing: numba
compiles them on first call and caches the machine code on disk."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

jit = numba.njit(cache=True, nogil=True)


@jit
def cost(p0: Any, p1: Any, p2: Any, j: int, i: int) -> float:
    """Weighted squared error of points j..i (inclusive) about their weighted mean."""
    w = p0[i + 1] - p0[j]
    s = p1[i + 1] - p1[j]
    e = (p2[i + 1] - p2[j]) - s * s / w
    return e if e > 0.0 else 0.0


@jit
def dc_layer(prev: Any, cur: Any, arg: Any, p0: Any, p1: Any, p2: Any, r0: int, r1: int, c0: int,
             stack: Any, lower: Any) -> None:  # fmt: skip
    """Leftmost row minima of A[i][j] = prev[j-1] + cost(j, i), rows r0..r1, by divide and conquer.

    The argmin is monotone in i (A is Monge), so the middle row's argmin bounds the columns of
    the rows on either side; `lower[i]`, the argmin of row i one layer earlier, is a second lower
    bound (with one cluster more, the last one starts no earlier). O(n log n) evaluations in
    tight, predictable loops; an explicit stack replaces recursion.
    """
    stack[0, 0] = r0
    stack[0, 1] = r1
    stack[0, 2] = c0  # columns: the last cluster of row i starts in [clo, min(i, chi)]
    stack[0, 3] = r1
    top = 1
    while top > 0:
        top -= 1
        lo, hi, clo, chi = stack[top, 0], stack[top, 1], stack[top, 2], stack[top, 3]
        mid = (lo + hi) >> 1
        start = clo if clo > lower[mid] else lower[mid]
        end = mid if mid < chi else chi
        best = np.inf
        best_col = start
        w_end, s_end, q_end = p0[mid + 1], p1[mid + 1], p2[mid + 1]
        for j in range(start, end + 1):
            s = s_end - p1[j]
            e = (q_end - p2[j]) - s * s / (w_end - p0[j])
            v = prev[j - 1] + (e if e > 0.0 else 0.0)
            if v < best:
                best = v
                best_col = j
        cur[mid] = best
        arg[mid] = best_col
        if lo < mid:
            stack[top, 0], stack[top, 1], stack[top, 2], stack[top, 3] = lo, mid - 1, clo, best_col
            top += 1
        if mid < hi:
            stack[top, 0], stack[top, 1], stack[top, 2], stack[top, 3] = mid + 1, hi, best_col, chi
            top += 1


@jit
def one_group(x: Any, w: Any, k: int, upper: Any, centroid: Any) -> int:
    """Cluster one group; fills the upper point index and centroid of each cluster; returns
    the number of clusters (< k only when there are fewer than k points)."""
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
    p0 = np.zeros(n + 1)
    p1 = np.zeros(n + 1)
    p2 = np.zeros(n + 1)
    for i in range(n):
        d = x[i] - mean
        p0[i + 1] = p0[i] + w[i]
        p1[i + 1] = p1[i] + w[i] * d
        p2[i + 1] = p2[i] + w[i] * d * d
    prev = np.empty(n)
    cur = np.empty(n)
    for i in range(n):
        prev[i] = cost(p0, p1, p2, 0, i)
    split = np.zeros((k, n), np.int32)  # split[q][i]: first point of cluster q when it ends at i
    arg = np.empty(n, np.int64)
    dstack = np.empty((136, 4), np.int64)  # depth <= 2 log2(n) + 2
    lower = np.zeros(n, np.int64)
    for q in range(1, k):
        # cluster q (0-based) ends at rows q..n-1-(k-1-q) and starts at columns q..; the last
        # cluster only ever ends at the last point
        r0 = q if q < k - 1 else n - 1
        nrows = n - (k - 1 - q) - q if q < k - 1 else 1
        cur[:] = np.inf
        dc_layer(prev, cur, arg, p0, p1, p2, r0, r0 + nrows - 1, q, dstack, lower)
        for i in range(r0, r0 + nrows):
            split[q, i] = arg[i]
            lower[i] = arg[i]
        prev, cur = cur, prev
    end = n - 1
    for q in range(k - 1, -1, -1):
        begin = split[q, end] if q > 0 else 0
        upper[q] = end
        s = 0.0
        c = 0.0
        for i in range(begin, end + 1):
            s += w[i] * x[i]
            c += w[i]
        centroid[q] = s / c
        end = begin - 1
    return k


@jit
def groups(x: Any, w: Any, offsets: Any, k: int, first: int, last: int,
           uppers: Any, centroids: Any, found: Any) -> None:  # fmt: skip
    for g in range(first, last):
        a, b = offsets[g], offsets[g + 1]
        found[g] = one_group(x[a:b], w[a:b], k, uppers[g], centroids[g])


@jit
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


@jit
def assign(sorted_keys: Any, order: Any, bounds: Any, index: Any, first: int, last: int) -> None:
    """index[g, order[g, i]] = cluster of the i-th smallest key of row g (bounds: each cluster's
    largest key), in one sweep per row instead of a binary search per element."""
    for g in range(first, last):
        c = 0
        limit = bounds.shape[1]
        for i in range(sorted_keys.shape[1]):
            key = sorted_keys[g, i]
            while c < limit and key > bounds[g, c]:
                c += 1
            index[g, order[g, i]] = c
