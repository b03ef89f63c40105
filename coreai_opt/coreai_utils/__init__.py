"""Weight compression of Core AI programs as seed 002 spells it: `quantize_weights`,
`palettize_weights`, `sparsify_weights` (their file forms: `coreai_opt.recipes`). The work is done
by `coreai_opt.compression`; these build its configs."""

from coreai_opt.compression import (
    CompressionGranularity,
    CompressionReport,
    DType,
    Override,
    PalettizeConfig,
    Progress,
    QScheme,
    QuantizeConfig,
    SkipKind,
    Skipped,
    SparsifyConfig,
    WeightResult,
    compress_,
)

from ._seed import palettize_weights, quantize_weights, sparsify_weights

__all__ = [
    "CompressionGranularity",
    "CompressionReport",
    "DType",
    "Override",
    "PalettizeConfig",
    "Progress",
    "QScheme",
    "QuantizeConfig",
    "SkipKind",
    "Skipped",
    "SparsifyConfig",
    "WeightResult",
    "compress_",
    "palettize_weights",
    "quantize_weights",
    "sparsify_weights",
]
