"""What a Core AI program holds, with compressed weights read back as one logical tensor each.

A weight is the float value that a compute op consumes and that comes only from constants:
a plain `coreai.constant`, or a tree of decompression ops (`lut_to_dense`,
`blockwise_shift_scale`, the sparse bitmask ops) over constants. Its bytes are those of every
constant in the tree; its encoding says how it is stored.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from coreai_opt import _coreai

from . import _encoding as describe
from ._encoding import Stored
from ._report import ModelReport, TensorInfo, WeightInfo

_FLOAT_ELEMENTS = re.compile(r"^(f\d+|bf16|f\d+E\d+M\d+\w*)$")


def _constant_is_zero(op: Any) -> bool:
    return not any(_coreai.constant_bytes(op))


class _Walker:
    def __init__(self) -> None:
        self.stored: dict[Any, Stored] = {}

    def visit(self, op: Any) -> None:
        if op.name == "coreai.constant":
            t = op.result.type
            element = _coreai.element_name(t)
            nbytes, shape = _coreai.constant_nbytes(op), _coreai.tensor_shape(t)
            # a splat stores one value for the whole tensor: say so, its bits per weight are tiny
            splat = math.prod(shape) > 1 and nbytes < _coreai.storage_nbytes(t)
            self.stored[op.result] = Stored(element + (" splat" if splat else ""), nbytes, element, shape)
            return
        if op.name not in _coreai.DECOMPRESSION_OPS or len(op.results) != 1:
            return
        parts = [self.stored.get(value) for value in op.operands]
        if any(part is None for part in parts):
            return
        described = self._describe(op, parts)  # type: ignore[arg-type]
        t = op.result.type
        element = _coreai.element_name(t) if hasattr(t, "element_type") else "sparse"
        shape = _coreai.tensor_shape(t) if hasattr(t, "shape") else parts[-1].shape  # type: ignore[union-attr]
        self.stored[op.result] = Stored(described, sum(p.nbytes for p in parts), element, shape)  # type: ignore[union-attr]

    @staticmethod
    def _describe(op: Any, parts: list[Stored]) -> str:
        name = op.name.removeprefix("coreai.")
        if name in ("lut_to_dense", "lut_to_sparse_with_bitmask") and len(parts) >= 2:
            return describe.lut(parts[0], parts[1])
        if name == "blockwise_shift_scale" and len(parts) == 4:
            offset_op, bias_op = op.operands[2].owner, op.operands[3].owner
            zero_point = not (offset_op.name == "coreai.constant" and _constant_is_zero(offset_op))
            offset = not (bias_op.name == "coreai.constant" and _constant_is_zero(bias_op))
            return describe.shift_scale(parts[0], parts[1], zero_point, offset)
        if name == "build_sparse_with_bitmask" and len(parts) == 2:
            return describe.sparse(parts[0], parts[1])
        if name in ("sparse_with_bitmask_to_dense", "cast") and len(parts) == 1:
            return parts[0].encoding if name != "cast" else f"{parts[0].encoding} cast"
        return f"{name}(" + ", ".join(p.encoding for p in parts) + ")"


def weight_encoding(value: Any) -> str:
    """How a weight value is stored ("si4 + f16 scale per block 32 (axis 1)"), as inspect names it."""
    walker = _Walker()

    def visit(v: Any) -> None:
        owner = v.owner
        if owner.name in _coreai.DECOMPRESSION_OPS:
            for operand in owner.operands:
                visit(operand)
        walker.visit(owner)

    visit(value)
    return walker.stored[value].encoding


def _weight_name(index: int, op: Any) -> str:
    name = _coreai.location_name(op)
    return f"w{index}:{name}" if name else f"w{index}"


def inspect_ai_program(program: Any, path: Path | str = "") -> ModelReport:
    module = _coreai.mlir_module(program)
    signatures = _coreai.graph_signatures(module)
    walker = _Walker()
    weights: list[WeightInfo] = []
    scalars = 0
    for op in _coreai.walk_ops(module):
        walker.visit(op)
        if len(op.results) != 1 or op.result not in walker.stored:
            continue
        stored = walker.stored[op.result]
        consumers = [use.owner.name for use in op.result.uses]
        feeds_compute = any(name not in _coreai.DECOMPRESSION_OPS for name in consumers)
        if not feeds_compute or not _FLOAT_ELEMENTS.match(stored.element):
            continue
        if math.prod(stored.shape) <= 1:
            scalars += 1
            continue
        weights.append(
            WeightInfo(_weight_name(len(weights), op), stored.shape, stored.encoding, stored.nbytes)
        )
    main = next((s for s in signatures if s.name == "main"), signatures[0] if signatures else None)
    notes = [f"{scalars} float scalar constants not listed"] if scalars else []
    if len(signatures) > 1:
        notes.append("graphs: " + ", ".join(s.name for s in signatures))
    return ModelReport(
        path=str(path),
        format="aimodel",
        inputs=tuple(TensorInfo(t.name, t.dtype, t.shape) for t in main.inputs) if main else (),
        outputs=tuple(TensorInfo(t.name, t.dtype, t.shape) for t in main.outputs) if main else (),
        ops=dict(_coreai.op_histogram(module).most_common()),
        weights=tuple(weights),
        parameters=sum(w.numel for w in weights),
        notes=tuple(notes),
    )
