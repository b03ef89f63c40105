"""Weights are encoded a piece at a time (bounded memory): the pieces change nothing.

`_pieces.PIECE` is set so small that every weight here spans many pieces - groups larger than a
piece, pieces that end inside a group's row, a last short piece - and every encoding must equal
the one made in a single piece, array for array and bit for bit; the SNR energies are sums over
the pieces, equal to float rounding.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from coreai_opt import _pieces
from coreai_opt._elements import of_torch
from coreai_opt.compression import (
    CompressionGranularity,
    DType,
    PalettizeConfig,
    QuantizeConfig,
    SparsifyConfig,
)
from coreai_opt.compression._driver import encode_weight
from coreai_opt.weights import Encoding, WeightSite

G = CompressionGranularity
CONFIGS = {
    "palettize tensor (16-bit histogram)": PalettizeConfig(n_bits=4),
    "palettize channel": PalettizeConfig(n_bits=4, granularity=G.PER_CHANNEL),
    "palettize grouped": PalettizeConfig(n_bits=3, granularity=G.PER_GROUPED_CHANNEL, group_size=16),
    "palettize int8 LUT, channel scales": PalettizeConfig(
        n_bits=6, lut_dtype=DType.INT8, granularity=G.PER_CHANNEL, enable_per_channel_scale=True
    ),
    "palettize fast mode": PalettizeConfig(n_bits=8, enable_fast_kmeans_mode=True, rounding_precision=3),
    "sparsify 2:4": SparsifyConfig(n_m_ratio=(2, 4)),
    "sparsify 50%": SparsifyConfig(target_sparsity=0.5),
    "sparsify 2:4 + 4-bit LUT": SparsifyConfig(n_m_ratio=(2, 4), palettize_nbits=4),
    "sparsify 2:4 + int8": SparsifyConfig(n_m_ratio=(2, 4), quantize_dtype=DType.INT8),
    "quantize int4 block 32": QuantizeConfig(dtype=DType.INT4, granularity=G.PER_BLOCK, block_size=32),
}


def _arrays(value: object) -> list[np.ndarray]:
    """Every array of an encoding's form, in field order."""
    if isinstance(value, np.ndarray):
        return [value]
    if dataclasses.is_dataclass(value):
        return [a for field in dataclasses.fields(value) for a in _arrays(getattr(value, field.name))]
    return []


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_pieces_change_no_encoding(name: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    generator = torch.Generator().manual_seed(0)
    w = (torch.randn(128, 640, generator=generator) * torch.logspace(-2, 0, 640)).to(dtype)
    w[3, :40] = 0  # a run of zeros: ties in every sort
    site = WeightSite(None, "w", tuple(w.shape), of_torch(dtype), 0, 1)
    whole = encode_weight(w, site, CONFIGS[name])
    monkeypatch.setattr(_pieces, "PIECE", 1000)  # 82 pieces of the 81,920 values, rows split
    pieces = encode_weight(w, site, CONFIGS[name])
    assert isinstance(whole, Encoding) and isinstance(pieces, Encoding)
    a, b = _arrays(whole.form), _arrays(pieces.form)
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert (
            x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x.view(np.uint8), y.view(np.uint8))
        )
    assert math.isclose(whole.signal, pieces.signal, rel_tol=1e-6)
    assert math.isclose(whole.noise, pieces.noise, rel_tol=1e-5)
    assert w.dtype == dtype  # the input is not touched
