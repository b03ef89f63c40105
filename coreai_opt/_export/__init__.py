"""`torch.export` programs as compression containers: coreai-torch's own custom ops carry the weights.

A compressed weight becomes buffers (codes, indices, LUT, scales, zero points, mask) and calls of
`coreai::lut_to_dense`, `coreai::constexpr_blockwise_shift_scale` and `coreai::sparse_to_dense`,
so the program still runs in PyTorch and coreai-torch converts it to the Core AI ops the `.aimodel`
path writes. Everything here imports torch: load it on first use.
"""

from __future__ import annotations

from coreai_opt._custom_ops import register_coreai_ops

from ._describe import StateWalker
from ._edit import ProgramEdit
from ._ops import (
    COREAI_OPS,
    LUT_TO_DENSE,
    coreai_decompositions,
    fold_decompression,
    is_decompression,
    op_name,
)
from ._runnable import checked_device, compute_in_float64, ready_to_run, release_unheld, runnable
from ._weights import ExportWeights

__all__ = [
    "COREAI_OPS",
    "LUT_TO_DENSE",
    "ExportWeights",
    "ProgramEdit",
    "StateWalker",
    "checked_device",
    "compute_in_float64",
    "coreai_decompositions",
    "fold_decompression",
    "is_decompression",
    "op_name",
    "ready_to_run",
    "register_coreai_ops",
    "release_unheld",
    "runnable",
]
