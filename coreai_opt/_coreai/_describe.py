"""How a Core AI program stores each weight it computes from constants: its encoding, in the
words every container uses (`weights.describe`), and its bytes.

A weight is the float value that a compute op consumes and that comes only from constants: a
plain `coreai.constant`, or a tree of decompression ops (`lut_to_dense`, `blockwise_shift_scale`,
the sparse bitmask ops) over constants. `CoreAIWeights` reports what it wrote with
`weight_encoding`; inspect and the verifying worker walk every weight with `program_weights`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from coreai_opt.weights import Described
from coreai_opt.weights import describe as words

from ._ir import (
    DECOMPRESSION_OPS,
    constant_array,
    constant_nbytes,
    element_name,
    location_name,
    mlir_module,
    storage_nbytes,
    tensor_shape,
    walk_ops,
)

_FLOAT_ELEMENTS = re.compile(r"^(f\d+|bf16|f\d+E\d+M\d+\w*)$")


def _constant_is_zero(op: Any) -> bool:
    """Every stored byte zero (a -0.0 offset is not: it is written as one)."""
    import numpy as np

    return not np.ascontiguousarray(constant_array(op)).view(np.uint8).any()


class ConstantWalker:
    def __init__(self) -> None:
        self.stored: dict[Any, Described] = {}

    def visit(self, op: Any) -> None:
        if op.name == "coreai.constant":
            t = op.result.type
            element = element_name(t)
            nbytes, shape = constant_nbytes(op), tensor_shape(t)
            # a splat stores one value for the whole tensor: say so, its bits per weight are tiny
            splat = math.prod(shape) > 1 and nbytes < storage_nbytes(t)
            self.stored[op.result] = Described(element + (" splat" if splat else ""), nbytes, element, shape)
            return
        if op.name not in DECOMPRESSION_OPS or len(op.results) != 1:
            return
        parts = [self.stored.get(value) for value in op.operands]
        if any(part is None for part in parts):
            return
        described = self._describe(op, parts)  # type: ignore[arg-type]
        t = op.result.type
        element = element_name(t) if hasattr(t, "element_type") else "sparse"
        shape = tensor_shape(t) if hasattr(t, "shape") else parts[-1].shape  # type: ignore[union-attr]
        self.stored[op.result] = Described(described, sum(p.nbytes for p in parts), element, shape)  # type: ignore[union-attr]

    @staticmethod
    def _describe(op: Any, parts: list[Described]) -> str:
        name = op.name.removeprefix("coreai.")
        if name in ("lut_to_dense", "lut_to_sparse_with_bitmask") and len(parts) >= 2:
            return words.lut(parts[0], parts[1])
        if name == "blockwise_shift_scale" and len(parts) == 4:
            offset_op, bias_op = op.operands[2].owner, op.operands[3].owner
            zero_point = not (offset_op.name == "coreai.constant" and _constant_is_zero(offset_op))
            offset = not (bias_op.name == "coreai.constant" and _constant_is_zero(bias_op))
            return words.shift_scale(parts[0], parts[1], zero_point, offset)
        if name == "build_sparse_with_bitmask" and len(parts) == 2:
            return words.sparse(parts[0], parts[1])
        if name in ("sparse_with_bitmask_to_dense", "cast") and len(parts) == 1:
            return parts[0].encoding if name != "cast" else f"{parts[0].encoding} cast"
        return f"{name}(" + ", ".join(p.encoding for p in parts) + ")"


def weight_encoding(value: Any) -> str:
    """How a weight value is stored ("si4 + f16 scale per block 32 (axis 1)"), as inspect names it."""
    walker = ConstantWalker()

    def visit(v: Any) -> None:
        owner = v.owner
        if owner.name in DECOMPRESSION_OPS:
            for operand in owner.operands:
                visit(operand)
        walker.visit(owner)

    visit(value)
    return walker.stored[value].encoding


@dataclass(frozen=True)
class ProgramWeight:
    name: str  # the source name from the op's location, or `w<index>` where it has none
    shape: tuple[int, ...]
    encoding: str
    nbytes: int


def program_weights(program: Any) -> tuple[list[ProgramWeight], int]:
    """Every float weight a compute op reads, in program order, and how many float scalar
    constants there are besides (walking every op and decoding every weight's storage)."""
    walker = ConstantWalker()
    weights: list[ProgramWeight] = []
    scalars = 0
    for op in walk_ops(mlir_module(program)):
        walker.visit(op)
        if len(op.results) != 1 or op.result not in walker.stored:
            continue
        stored = walker.stored[op.result]
        consumers = [use.owner.name for use in op.result.uses]
        feeds_compute = any(name not in DECOMPRESSION_OPS for name in consumers)
        if not feeds_compute or not _FLOAT_ELEMENTS.match(stored.element):
            continue
        if math.prod(stored.shape) <= 1:
            scalars += 1
            continue
        name = location_name(op) or f"w{len(weights)}"
        weights.append(ProgramWeight(name, stored.shape, stored.encoding, stored.nbytes))
    return weights, scalars
