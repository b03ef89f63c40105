"""Weight compression of Core AI programs (seed 002): quantize and palettize (sparsify to come)."""

from coreai_opt._coreai._rewrite import SkipKind, Skipped

from ._file import CompressionFileResult, palettize_file, quantize_file
from ._options import CompressionGranularity, DType, QScheme
from ._palettize import PalettizePlan, palettize_program, palettize_weights
from ._quantize import quantize_program, quantize_weights
from ._results import CompressionReport, Progress, WeightResult

__all__ = [
    "CompressionFileResult",
    "CompressionGranularity",
    "CompressionReport",
    "DType",
    "PalettizePlan",
    "Progress",
    "QScheme",
    "SkipKind",
    "Skipped",
    "WeightResult",
    "palettize_file",
    "palettize_program",
    "palettize_weights",
    "quantize_file",
    "quantize_program",
    "quantize_weights",
]
