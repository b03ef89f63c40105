"""Weight compression of Core AI programs (seed 002): quantize (palettize and sparsify to come)."""

from coreai_opt._coreai._rewrite import SkipKind, Skipped

from ._file import CompressionFileResult, quantize_file
from ._options import CompressionGranularity, DType, QScheme
from ._quantize import quantize_program, quantize_weights
from ._results import CompressionReport, Progress, WeightResult

__all__ = [
    "CompressionFileResult",
    "CompressionGranularity",
    "CompressionReport",
    "DType",
    "Progress",
    "QScheme",
    "SkipKind",
    "Skipped",
    "WeightResult",
    "quantize_file",
    "quantize_program",
    "quantize_weights",
]
