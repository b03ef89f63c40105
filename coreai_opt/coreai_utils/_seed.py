"""The seed's functions (seed 002), keyword for keyword: each builds its pass's config and compresses
a copy of the program (or the program itself with `in_place=True`)."""

from __future__ import annotations

import copy
from typing import Any

from coreai_opt.compression import (
    CompressionGranularity,
    DType,
    PalettizeConfig,
    QScheme,
    QuantizeConfig,
    SparsifyConfig,
    compress_,
)

G = CompressionGranularity


def _run(program: Any, config: Any, in_place: bool) -> Any:
    target = program if in_place else copy.deepcopy(program)
    compress_(target, config)
    return target


def quantize_weights(
    coreai_program: Any,
    dtype: DType,
    qscheme: QScheme = QScheme.SYMMETRIC,
    granularity: CompressionGranularity = G.PER_CHANNEL,
    block_size: int = 32,
    weight_num_threshold: int = 1024,
    scale_dtype: DType | None = None,
    in_place: bool = False,
) -> Any:
    """Quantize the weights of an AIProgram; returns the (copied unless in_place) program."""
    config = QuantizeConfig(
        dtype=dtype,
        qscheme=qscheme,
        granularity=granularity,
        block_size=block_size,
        scale_dtype=scale_dtype,
        weight_num_threshold=weight_num_threshold,
    )
    return _run(coreai_program, config, in_place)


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
    """Palettize the weights of an AIProgram; returns the (copied unless in_place) program.

    `num_kmeans_workers` threads share the k-means groups (no processes); results do not depend on it.
    """
    config = PalettizeConfig(
        n_bits=n_bits,
        lut_dtype=lut_dtype,
        granularity=granularity,
        group_size=group_size,
        cluster_dim=cluster_dim,
        enable_per_channel_scale=enable_per_channel_scale,
        num_kmeans_workers=num_kmeans_workers,
        enable_fast_kmeans_mode=enable_fast_kmeans_mode,
        rounding_precision=rounding_precision,
        weight_num_threshold=weight_num_threshold,
    )
    return _run(coreai_program, config, in_place)


def sparsify_weights(
    coreai_program: Any,
    target_sparsity: float | None = None,
    block_size: int | None = None,
    n_m_ratio: tuple[int, int] | None = None,
    quantize_dtype: DType | None = None,
    palettize_nbits: int | None = None,
    weight_num_threshold: int = 1024,
    in_place: bool = False,
) -> Any:
    """Prune the weights of an AIProgram (optionally compressing the kept values); returns the
    (copied unless in_place) program. `target_sparsity` is 0.5 unless `n_m_ratio=(n, m)` (n of
    every m weights kept) is given instead."""
    config = SparsifyConfig(
        target_sparsity=target_sparsity,
        block_size=block_size,
        n_m_ratio=n_m_ratio,
        quantize_dtype=quantize_dtype,
        palettize_nbits=palettize_nbits,
        weight_num_threshold=weight_num_threshold,
    )
    return _run(coreai_program, config, in_place)
