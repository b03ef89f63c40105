"""Clusters shared by configs that cluster alike (`clusters_shared`).

`optimize`'s cost table encodes every weight under each choice in turn, and some choices differ
only in how a table's entries are stored: lut6 and lut6-q8 run the same weighted k-means on the
same values, then store its centroids as floats or as int8 codes under a scale (lut4 and lut4-q8
the same, before GPTQ). Exact k-means of a 6-bit table is most of such an encoding's time (0.38 s
for a 1536 x 576 weight against 5 ms to hash its values and importance), so within the scope the
second one takes the first one's clusters. An entry is keyed by the config less `lut_dtype` and a
digest of the values and importance clustered: a config that clusters otherwise, or other values
under the same name, never meet an entry that is not theirs. It is kept only while a config of the
scope that clusters alike has yet to take it, so the scope holds at most one column of clusters
when those configs come one after the other.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

from ..configs import PalettizeConfig, WeightConfig

Clusters = tuple[np.ndarray, torch.Tensor]  # centroids [G, P, V], indices


@dataclasses.dataclass
class _Memo:
    family: Callable[[PalettizeConfig], object]  # what configs that share agree on
    sharing: Counter[object]  # how many of the scope's configs each family has, where more than one
    held: dict[tuple[Any, ...], tuple[Clusters, int]] = dataclasses.field(default_factory=dict)


_MEMO: contextvars.ContextVar[_Memo | None] = contextvars.ContextVar("shared clusters", default=None)


def _alike(config: PalettizeConfig) -> PalettizeConfig:
    """What decides the clusters: the config with its tables' storage and its thread count (the
    results do not depend on it) left out."""
    return dataclasses.replace(config, lut_dtype=None, num_kmeans_workers=0)


@contextlib.contextmanager
def clusters_shared(
    configs: Iterable[WeightConfig], reads: Callable[[WeightConfig], object] = lambda c: None
) -> Iterator[None]:
    """Within it, clusters made under one of `configs` are kept for the others that cluster alike
    and read the same values of a weight (`reads(config)` equal: the caller's sample of its rows),
    each entry until as many of that family as `configs` holds have taken it; nothing is kept for
    a family of one."""

    def family(config: PalettizeConfig) -> object:
        return _alike(config), reads(config)

    families = Counter(family(c) for c in configs if isinstance(c, PalettizeConfig))
    sharing = Counter({f: n for f, n in families.items() if n > 1})
    token = _MEMO.set(_Memo(family, sharing) if sharing else None)
    try:
        yield
    finally:
        _MEMO.reset(token)


def shared(
    values: torch.Tensor, importance: torch.Tensor | None, floor: float, layout: tuple[Any, ...],
    config: PalettizeConfig, make: Callable[[], Clusters],
) -> Clusters:  # fmt: skip
    """`make()`'s clusters of `values` weighted by `importance` + `floor` under `config`, `layout`
    saying how the values are read (their shape, axes, element) - taken from an earlier config of
    the scope that clusters alike, where one made them (copies: each encoding owns its own)."""
    memo = _MEMO.get()
    family = None if memo is None else memo.family(config)
    if memo is None or family not in memo.sharing:
        return make()
    key = (family, layout, float(floor), _digest(values), None if importance is None else _digest(importance))
    if key in memo.held:
        (centroids, index), left = memo.held.pop(key)
        if left == 1:
            return centroids, index  # the last to take them: no copy is left behind
        memo.held[key] = ((centroids, index), left - 1)
        return centroids.copy(), index.clone()
    centroids, index = make()
    memo.held[key] = ((centroids.copy(), index.clone()), memo.sharing[family] - 1)
    return centroids, index


def _digest(tensor: torch.Tensor) -> tuple[str, tuple[int, ...], tuple[int, ...], bytes]:
    """The tensor's dtype, shape, broadcast axes and a hash of its bytes - of a broadcast view's
    own values (an input importance is one row expanded: never made whole here)."""
    data = tensor.detach()
    broadcast = tuple(axis for axis in range(data.dim()) if data.stride(axis) == 0 and data.shape[axis] > 1)
    for axis in broadcast:
        data = data.narrow(axis, 0, 1)
    raw = data.cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return str(data.dtype), tuple(tensor.shape), broadcast, hashlib.blake2b(raw).digest()
