"""The exact 1-D k-means: optimal against brute force, never worse than Lloyd, deterministic."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from coreai_opt.compression.algorithms._kmeans_1d import kmeans_1d


def _sse(x: np.ndarray, w: np.ndarray, uppers: np.ndarray, centroids: np.ndarray, found: int) -> float:
    total, start = 0.0, 0
    for c in range(found):
        end = uppers[c] + 1
        total += float((w[start:end] * (x[start:end] - centroids[c]) ** 2).sum())
        start = end
    return total


def _brute_force(x: np.ndarray, w: np.ndarray, k: int) -> float:
    """Every way to cut the sorted points into k contiguous runs."""
    best = np.inf
    n = len(x)
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        total = 0.0
        for a, b in itertools.pairwise(bounds):
            mean = (w[a:b] * x[a:b]).sum() / w[a:b].sum()
            total += float((w[a:b] * (x[a:b] - mean) ** 2).sum())
        best = min(best, total)
    return best


def _lloyd(x: np.ndarray, w: np.ndarray, k: int, rng: np.random.Generator) -> float:
    """Weighted Lloyd's algorithm from a k-means++ start: a local optimum, for comparison."""
    centers = [x[rng.choice(len(x), p=w / w.sum())]]
    for _ in range(1, k):
        d = np.min((x[:, None] - np.array(centers)[None]) ** 2, axis=1) * w
        if d.sum() == 0:
            break
        centers.append(x[rng.choice(len(x), p=d / d.sum())])
    c = np.array(centers, dtype=np.float64)
    for _ in range(100):
        labels = np.argmin((x[:, None] - c[None]) ** 2, axis=1)
        new = np.array([(w[labels == j] * x[labels == j]).sum() / w[labels == j].sum() if (labels == j).any()
                        else c[j] for j in range(len(c))])  # fmt: skip
        if np.array_equal(new, c):
            break
        c = new
    labels = np.argmin((x[:, None] - c[None]) ** 2, axis=1)
    return float((w * (x - c[labels]) ** 2).sum())


def _points(rng: np.random.Generator, n: int, heavy: bool) -> tuple[np.ndarray, np.ndarray]:
    raw = rng.standard_t(1.5, n) * 5 if heavy else rng.standard_normal(n)
    x = np.unique(np.round(raw, 3))
    return x, rng.integers(1, 6, len(x)).astype(np.float64)


def test_equals_brute_force_on_tiny_inputs() -> None:
    rng = np.random.default_rng(0)
    checked = 0
    for trial in range(150):
        x, w = _points(rng, int(rng.integers(2, 13)), heavy=trial % 2 == 1)
        k = int(rng.integers(1, min(6, len(x)) + 1))
        uppers, centroids, found = kmeans_1d(x, w, np.array([0, len(x)]), k, workers=1)
        assert found[0] == min(k, len(x))
        got = _sse(x, w, uppers[0], centroids[0], found[0])
        assert got == pytest.approx(_brute_force(x, w, k), rel=1e-9, abs=1e-12)
        checked += 1
    assert checked == 150


def _full_programme(x: np.ndarray, w: np.ndarray, k: int) -> float:
    """The textbook O(k n^2) dynamic programme over every state, vectorised (no bounds, no
    pruning); returns the squared error of its clustering, summed directly."""
    n = len(x)
    d = x - (w * x).sum() / w.sum()
    p0, p1, p2 = (np.concatenate([[0.0], np.cumsum(v)]) for v in (w, w * d, w * d * d))
    j, i = np.arange(n)[None, :], np.arange(n)[:, None]
    with np.errstate(all="ignore"):
        cost = (p2[i + 1] - p2[j]) - (p1[i + 1] - p1[j]) ** 2 / (p0[i + 1] - p0[j])
    cost = np.where(j <= i, np.maximum(cost, 0.0), np.inf)
    best, starts = cost[:, 0], []
    for _ in range(1, k):
        total = np.concatenate([[np.inf], best[:-1]])[None, :] + cost
        starts.append(total.argmin(axis=1))
        best = total.min(axis=1)
    uppers, end = [], n - 1
    for start in reversed(starts):
        uppers.append(end)
        end = start[end] - 1
    uppers = np.array([end, *reversed(uppers)])
    centroids = [
        np.average(x[a : b + 1], weights=w[a : b + 1])
        for a, b in zip([0, *(uppers[:-1] + 1)], uppers, strict=True)
    ]
    return _sse(x, w, uppers, np.array(centroids), k)


def _shapes(rng: np.random.Generator, n: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Point sets that stress the cost bound and the meeting of the two halves: tight clumps
    (the Lloyd bound is loose there), an even grid (many equal-cost optima), one far outlier,
    heavy tails and fp16-like Gaussian rows."""
    clumps = np.unique(np.concatenate([c + 1e-3 * rng.standard_normal(n // 5) for c in (-9, -1, 0, 4, 30)]))
    grid = np.arange(float(n))
    outlier = np.unique(np.append(rng.standard_normal(n - 1), 1e4))
    heavy = np.unique(np.round(rng.standard_t(1.2, n) * 3, 4))
    fp16 = np.unique((0.02 * rng.standard_normal(n)).astype(np.float16).astype(np.float64))
    return {
        name: (v, rng.integers(1, 9, len(v)).astype(np.float64) if name != "grid" else np.ones(len(v)))
        for name, v in [("clumps", clumps), ("grid", grid), ("outlier", outlier), ("heavy", heavy), ("fp16", fp16)]
    }  # fmt: skip


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 16, 33])
def test_equals_the_full_programme_on_every_shape(k: int) -> None:
    rng = np.random.default_rng(k)
    for name, (x, w) in _shapes(rng, 300).items():
        uppers, centroids, found = kmeans_1d(x, w, np.array([0, len(x)]), k, workers=1)
        assert found[0] == k, name
        assert np.all(np.diff(uppers[0]) > 0) and uppers[0, -1] == len(x) - 1, name
        got = _sse(x, w, uppers[0], centroids[0], k)
        # both programmes compare costs from prefix sums: they agree to rounding of the total
        spread = float((w * (x - np.average(x, weights=w)) ** 2).sum())
        assert got == pytest.approx(_full_programme(x, w, k), rel=1e-9, abs=1e-14 * spread), name


@pytest.mark.parametrize("heavy", [False, True], ids=["gaussian", "heavy-tailed"])
def test_never_worse_than_lloyd(heavy: bool) -> None:
    rng = np.random.default_rng(1)
    groups = [_points(rng, 400, heavy) for _ in range(12)]
    x = np.concatenate([g[0] for g in groups])
    w = np.concatenate([g[1] for g in groups])
    offsets = np.cumsum([0] + [len(g[0]) for g in groups])
    for k in (2, 4, 16):
        uppers, centroids, found = kmeans_1d(x, w, offsets, k, workers=2)
        for g, (gx, gw) in enumerate(groups):
            exact = _sse(gx, gw, uppers[g], centroids[g], found[g])
            lloyd = min(_lloyd(gx, gw, k, np.random.default_rng(s)) for s in range(3))
            assert exact <= lloyd * (1 + 1e-12) + 1e-12


def test_threads_do_not_change_the_result() -> None:
    rng = np.random.default_rng(2)
    parts = [np.unique(rng.standard_normal(300).astype(np.float16).astype(np.float64)) for _ in range(40)]
    x = np.concatenate(parts)
    offsets = np.cumsum([0] + [len(p) for p in parts])
    one = kmeans_1d(x, np.ones_like(x), offsets, 16, workers=1)
    two = kmeans_1d(x, np.ones_like(x), offsets, 16, workers=2)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b)


def test_fewer_points_than_clusters_keeps_every_point() -> None:
    x = np.array([-1.0, 0.5, 3.0])
    _, centroids, found = kmeans_1d(x, np.ones(3), np.array([0, 3]), 16)
    assert found[0] == 3
    np.testing.assert_array_equal(centroids[0, :3], x)


def test_kernels_are_ready_before_the_first_weight() -> None:
    """What the CLI waits for under its spinner leaves nothing for the first weight to compile."""
    from coreai_opt.compression import load_kmeans_kernels
    from coreai_opt.compression.algorithms._kmeans_kernels import groups

    load_kmeans_kernels()
    assert len(groups.signatures) == 1  # compiled, or loaded from numba's cache
    _, centroids, found = kmeans_1d(np.array([0.5, 1.5, 4.0]), np.ones(3), np.array([0, 3]), 2, workers=1)
    assert len(groups.signatures) == 1  # a weight's call needs no other: nothing left to compile
    assert found.tolist() == [2] and centroids.tolist() == [[1.0, 4.0]]
