"""M:N magnitude sparsity along one dim, signs kept."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sparse_mask(x: torch.Tensor, m: int, n: int, dim: int = -1) -> torch.Tensor:
    """Where `sparse` keeps values: the `n` largest magnitudes of every `m` consecutive values along
    `dim` (ties to the lower index, so the mask is the same on every run and device; NaN counts as
    the largest magnitude). A length that `m` does not divide ends in a shorter group."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"sparse takes a torch tensor, got {type(x).__name__}")
    if not (isinstance(m, int) and isinstance(n, int) and 0 < n <= m):
        raise ValueError(f"need integers 0 < N <= M, got M={m}, N={n}")
    if x.dim() == 0:
        raise ValueError("sparse needs a tensor of rank >= 1")
    moved = x.movedim(dim, -1)
    length = moved.shape[-1]
    pad = (-length) % m
    magnitude = moved.abs()
    if pad:
        magnitude = F.pad(magnitude, (0, pad), value=-1.0)  # padding never outranks a real value
    groups = magnitude.reshape(*magnitude.shape[:-1], -1, m)
    if m <= _RANKED:
        mask = _ranked(_order_keys(groups), n)
    else:
        order = torch.sort(groups, dim=-1, descending=True, stable=True).indices
        mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, order[..., :n], True)
    return mask.reshape(*moved.shape[:-1], length + pad)[..., :length].movedim(-1, dim)


_RANKED = 16  # groups up to this size are ranked by m comparisons, larger ones sorted


def _order_keys(magnitude: torch.Tensor) -> torch.Tensor:
    """Integers that order as a stable descending sort orders the magnitudes: the bit patterns of
    non-negative floats (every NaN made one pattern, above Inf, as the sort puts NaN first)."""
    if not magnitude.is_floating_point():
        return magnitude.long()
    wide = magnitude.dtype == torch.float64
    values = magnitude if wide else magnitude.float()
    keys = values.view(torch.int64 if wide else torch.int32)
    return keys.masked_fill(torch.isnan(values), 0x7FF8000000000000 if wide else 0x7FC00000)


def _ranked(keys: torch.Tensor, n: int) -> torch.Tensor:
    """Where each of the last axis's values ranks among the first n: outranked by a greater key,
    or an equal one at a lower index (the stable sort's rule); m - 1 comparisons a value, each
    position's keys laid out in one run."""
    m = keys.shape[-1]
    columns = keys.reshape(-1, m).T.contiguous()
    rank = torch.zeros(columns.shape, dtype=torch.uint8, device=keys.device)
    for i in range(m):
        for j in range(m):
            if j != i:
                rank[i] += columns[j] >= columns[i] if j < i else columns[j] > columns[i]
    return (rank < n).T.reshape(keys.shape)


def sparse(x: torch.Tensor, m: int, n: int, dim: int = -1) -> torch.Tensor:
    """Keep the `n` largest magnitudes of every `m` consecutive values along `dim`; zero the rest.

    Signs are kept. A length that `m` does not divide ends in a shorter group, which keeps at
    most `n` values. NaN counts as the largest magnitude, so it is never dropped silently; ties go
    to the lower index (`sparse_mask`).
    """
    mask = sparse_mask(x, m, n, dim)
    return torch.where(mask, x, torch.zeros_like(x))
