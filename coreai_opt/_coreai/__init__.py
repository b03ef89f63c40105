"""The one place that touches coreai-core internals (MLIR module, ops, types).

Everything else in coreopt talks to these helpers, so a change in coreai-core's private
layout is mended here once. coreai is imported lazily: importing coreopt costs nothing.
"""

from __future__ import annotations

from ._describe import ProgramWeight, program_weights, weight_encoding
from ._ir import (
    BYTECODE_FILE,
    BYTECODE_MAGIC,
    DECOMPRESSION_OPS,
    GraphSignature,
    TensorSig,
    constant_bytes,
    constant_nbytes,
    constant_ops,
    element_bits,
    element_name,
    graph_ops,
    graph_signatures,
    input_usage,
    location_name,
    main_graph,
    mlir_module,
    new_context,
    op_histogram,
    storage_nbytes,
    stored_nbytes,
    tensor_shape,
    walk_ops,
)
from ._narrow import NARROWED_ENTRIES, narrow_repeated_luts
from ._native import first_error, native_stderr
from ._rewrite import canonical_symbol_names, name_constants
from ._runtime import RunResult, run_in
from ._sandbox import AssetWorker, TensorSpec, WorkerFailure

__all__ = [
    "BYTECODE_FILE",
    "BYTECODE_MAGIC",
    "DECOMPRESSION_OPS",
    "NARROWED_ENTRIES",
    "AssetWorker",
    "GraphSignature",
    "ProgramWeight",
    "RunResult",
    "TensorSig",
    "TensorSpec",
    "WorkerFailure",
    "canonical_symbol_names",
    "constant_bytes",
    "constant_nbytes",
    "constant_ops",
    "element_bits",
    "element_name",
    "first_error",
    "graph_ops",
    "graph_signatures",
    "input_usage",
    "location_name",
    "main_graph",
    "mlir_module",
    "name_constants",
    "narrow_repeated_luts",
    "native_stderr",
    "new_context",
    "op_histogram",
    "program_weights",
    "run_in",
    "storage_nbytes",
    "stored_nbytes",
    "tensor_shape",
    "walk_ops",
    "weight_encoding",
]
