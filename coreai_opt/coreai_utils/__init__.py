"""Weight compression of Core AI programs as seed 002 spells it: `quantize_weights`,
`palettize_weights`, `sparsify_weights`, and their file-level forms. The work is done by
`coreai_opt.compression`; these build its configs."""

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

from ._file import (
    CompressionFileResult,
    compress_file,
    default_output,
    palettize_file,
    quantize_file,
    sparsify_file,
)
from ._seed import palettize_weights, quantize_weights, sparsify_weights

__all__ = [
    "CompressionFileResult",
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
    "compress_file",
    "default_output",
    "palettize_file",
    "palettize_weights",
    "quantize_file",
    "quantize_weights",
    "sparsify_file",
    "sparsify_weights",
]
