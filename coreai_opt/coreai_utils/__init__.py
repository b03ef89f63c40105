"""Weight compression of Core AI programs (seed 002): quantize (palettize and sparsify to come)."""

from ._options import CompressionGranularity, DType, QScheme
from ._quantize import quantize_program, quantize_weights
from ._results import CompressionReport, WeightResult

__all__ = [
    "CompressionGranularity",
    "CompressionReport",
    "DType",
    "QScheme",
    "WeightResult",
    "quantize_program",
    "quantize_weights",
]
