"""Pieces of a weight worked on one at a time, so that no temporary is the size of the weight.

A pass widens values to float32 or float64, sorts them, or holds int64 indices; done on a whole
65.5M-value embedding that is several copies of half a gigabyte each. Row by row in pieces of
about `PIECE` elements the working set stays near a hundred MB, whatever the weight.
"""

from __future__ import annotations

PIECE = 1 << 22  # elements


def spans(count: int, width: int) -> list[tuple[int, int]]:
    """Consecutive spans of the `count` rows of a [count, width] array, each about `PIECE`
    elements (at least one row)."""
    step = max(1, PIECE // max(width, 1))
    return [(a, min(count, a + step)) for a in range(0, count, step)]
