"""The vocabulary every container and every pass shares: where a weight is, how it is read, how it
is encoded, how an encoding decodes, and which container holds which program.

Neutral ground: this package imports neither the passes (`compression`, `quantization`) nor the
containers (`_coreai`, `_export`), which all import it.
"""

from __future__ import annotations

from . import _describe as describe
from ._container import CONTAINERS, Container, Written, container_of, register_container
from ._decode import (
    decode,
    lut_to_dense,
    row_slice,
    shift_scale,
    sparse_to_dense,
    torch_values,
)
from ._describe import Described
from ._forms import (
    Encoding,
    Form,
    Learned,
    Palettized,
    Quantized,
    ShiftScale,
    Sparse,
    Stored,
    nbytes_for_rows,
)
from ._sites import Candidate, Consumer, SkipKind, Skipped, Use, WeightSite, stored_nbytes
from ._statistics import (
    Calibration,
    Checkpoints,
    Known,
    Narrowable,
    Needs,
    Statistics,
    known_of,
    statistics_from,
)

__all__ = [
    "CONTAINERS",
    "Calibration",
    "Candidate",
    "Checkpoints",
    "Consumer",
    "Container",
    "Described",
    "Encoding",
    "Form",
    "Known",
    "Learned",
    "Narrowable",
    "Needs",
    "Palettized",
    "Quantized",
    "ShiftScale",
    "SkipKind",
    "Skipped",
    "Sparse",
    "Statistics",
    "Stored",
    "Use",
    "WeightSite",
    "Written",
    "container_of",
    "decode",
    "describe",
    "known_of",
    "lut_to_dense",
    "nbytes_for_rows",
    "register_container",
    "row_slice",
    "shift_scale",
    "sparse_to_dense",
    "statistics_from",
    "stored_nbytes",
    "torch_values",
]
