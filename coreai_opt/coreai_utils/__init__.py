"""Weight compression of Core AI programs (seed 002): quantize, palettize, sparsify and joint forms."""

from coreai_opt._coreai._rewrite import SkipKind, Skipped

from ._file import CompressionFileResult, palettize_file, quantize_file, sparsify_file
from ._options import CompressionGranularity, DType, QScheme
from ._palettize import PalettizePlan, palettize_program, palettize_weights
from ._quantize import quantize_program, quantize_weights
from ._results import CompressionReport, Progress, WeightResult
from ._sparsify import SparsifyPlan, sparsify_program, sparsify_weights

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
    "SparsifyPlan",
    "WeightResult",
    "palettize_file",
    "palettize_program",
    "palettize_weights",
    "quantize_file",
    "quantize_program",
    "quantize_weights",
    "sparsify_file",
    "sparsify_program",
    "sparsify_weights",
]
