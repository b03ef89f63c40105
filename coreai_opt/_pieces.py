"""Pieces of a weight worked on one at a time, so that no temporary is the size of the weight.

A pass widens values to float32 or float64, sorts them, or holds int64 indices; done on a whole
65.5M-value embedding that is several copies of half a gigabyte each. Row by row in pieces of
about `PIECE` elements the working set stays near a hundred MB, whatever the weight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PIECE = 1 << 22  # elements
SOLVE_PIECE = 1 << 24  # elements of rows a GPTQ or SparseGPT solve holds in float64 at a time


_ALIGN = 64  # rows: a whole number of any BLAS kernel's register tiles


def spans(count: int, width: int, piece: int | None = None) -> list[tuple[int, int]]:
    """Consecutive spans of the `count` rows of a [count, width] array, each about `piece`
    elements (default `PIECE`, read at the call) - at least one row; spans of more than `_ALIGN`
    rows are multiples of it, so on the CPU a matrix product taken a span at a time meets the same
    BLAS kernels row for row as the whole one (the same bits; a GPU's library may pick its kernels
    by shape)."""
    step = max(1, (PIECE if piece is None else piece) // max(width, 1))
    step = step - step % _ALIGN if step > _ALIGN else step
    return [(a, min(count, a + step)) for a in range(0, count, step)]


def energies_in_pieces(
    reference: torch.Tensor, approximation: Callable[[int, int], torch.Tensor], piece: int | None = None
) -> tuple[float, float]:
    """`tcast.energies(reference, approximation)` of a [rows, cols] reference, summed over row
    pieces of about `piece` elements: `approximation(a, b)` gives rows a:b only, so the full
    approximation never exists."""
    import tcast

    signal = noise = 0.0
    for a, b in spans(*reference.shape, piece):
        piece_signal, piece_noise = tcast.energies(reference[a:b], approximation(a, b))
        signal, noise = signal + piece_signal, noise + piece_noise
    return signal, noise
