"""What a `torch.export` program holds: signature, ops and state."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from coreai_opt._elements import core_ai_name
from coreai_opt._export import StateWalker, is_decompression
from coreai_opt.io import declared_shape, flattened_outputs

from ._report import ModelReport, TensorInfo, WeightInfo

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram


def torch_dtype_name(dtype: torch.dtype) -> str:
    """The element type's name as Core AI (MLIR) prints it, so both formats read alike."""
    return core_ai_name(dtype)


def _tensor_info(name: str, value: object) -> TensorInfo:
    dtype = getattr(value, "dtype", None)
    shape = tuple(declared_shape(value)) if hasattr(value, "shape") else ()  # a symbolic size at its hint
    return TensorInfo(name, torch_dtype_name(dtype) if dtype is not None else type(value).__name__, shape)


def op_name(target: object) -> str:
    """`aten.addmm.default` for OpOverloads, the function name for Python callables."""
    name = str(target)
    if name.startswith("<built-in function "):
        return name.removeprefix("<built-in function ").removesuffix(">")
    return name


def inspect_exported_program(program: ExportedProgram, path: Path | str = "") -> ModelReport:
    inputs, outputs = _signature(program)
    ops = Counter(op_name(node.target) for node in program.graph.nodes if node.op == "call_function")
    weights, parameters = _weights(program)
    compressed = any(w.kind == "compressed" for w in weights)
    notes = tuple(
        f"output container {flat.describe()} is not one coreopt knows: read as a tuple of its "
        "tensors in declared order"
        for flat in flattened_outputs(program)
    ) + (
        ("sub-byte codes are held one per byte in a .pt2; bytes are as converted (packed)",)
        if compressed
        else ()
    )
    return ModelReport(
        path=str(path), format="pt2", inputs=inputs, outputs=outputs, ops=dict(ops.most_common()),
        weights=tuple(weights), parameters=parameters, notes=notes,
    )  # fmt: skip


def _signature(program: ExportedProgram) -> tuple[tuple[TensorInfo, ...], tuple[TensorInfo, ...]]:
    """The user inputs and the user outputs, in declared order."""
    signature = program.graph_signature
    nodes = {node.name: node for node in program.graph.nodes}
    inputs = tuple(
        _tensor_info(spec.arg.name, nodes[spec.arg.name].meta.get("val"))
        for spec in signature.input_specs
        if spec.kind.name == "USER_INPUT"
    )
    output_node = next(node for node in program.graph.nodes if node.op == "output")
    returned = (
        output_node.args[0] if isinstance(output_node.args[0], (list, tuple)) else (output_node.args[0],)
    )
    by_name = {getattr(node, "name", None): node for node in returned}
    outputs = tuple(
        _tensor_info(spec.arg.name, by_name[spec.arg.name].meta.get("val"))
        for spec in signature.output_specs
        if spec.kind.name == "USER_OUTPUT" and spec.arg.name in by_name
    )
    return inputs, outputs


def _weights(program: ExportedProgram) -> tuple[list[WeightInfo], int]:
    """Every stored tensor as stored (a compressed weight once, under its name, its parts not
    listed) and the parameters' element count."""
    walker = StateWalker(program)
    nodes = {node.name: node for node in program.graph.nodes}
    weights: list[WeightInfo] = []
    parameters = 0
    for spec in program.graph_signature.input_specs:
        kind = _KINDS.get(spec.kind.name)
        node = nodes.get(spec.arg.name)
        if kind is None or spec.target is None or node is None or walker.tensor(node) is None:
            continue
        if node.users and all(is_decompression(user) for user in node.users):
            continue  # a part of a compressed weight: listed with it below
        stored = walker.stored(node)
        assert stored is not None
        weights.append(WeightInfo(spec.target, stored.shape, stored.encoding, stored.nbytes, kind))
        parameters += math.prod(stored.shape) if kind == "parameter" else 0
    for node in program.graph.nodes:
        if not is_decompression(node) or all(is_decompression(user) for user in node.users):
            continue
        stored = walker.stored(node)
        if stored is None:
            continue
        weights.append(
            WeightInfo(walker.weight_name(node), stored.shape, stored.encoding, stored.nbytes, "compressed")
        )
        parameters += math.prod(stored.shape)
    return weights, parameters


_KINDS = {"PARAMETER": "parameter", "BUFFER": "buffer", "CONSTANT_TENSOR": "constant"}
