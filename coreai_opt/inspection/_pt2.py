"""What a `torch.export` program holds: signature, ops and state."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from ._report import ModelReport, TensorInfo, WeightInfo

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram


def torch_dtype_name(dtype: torch.dtype) -> str:
    """The element type's name as Core AI (MLIR) prints it, so both formats read alike."""
    from coreai_opt._elements import of_torch

    try:
        return of_torch(dtype).name
    except ValueError:
        return str(dtype).removeprefix("torch.")


def _tensor_info(name: str, value: object) -> TensorInfo:
    dtype = getattr(value, "dtype", None)
    shape = tuple(int(d) for d in getattr(value, "shape", ()))
    return TensorInfo(name, torch_dtype_name(dtype) if dtype is not None else type(value).__name__, shape)


def op_name(target: object) -> str:
    """`aten.addmm.default` for OpOverloads, the function name for Python callables."""
    name = str(target)
    if name.startswith("<built-in function "):
        return name.removeprefix("<built-in function ").removesuffix(">")
    return name


def inspect_exported_program(program: ExportedProgram, path: Path | str = "") -> ModelReport:
    signature = program.graph_signature
    nodes = {node.name: node for node in program.graph.nodes}
    user_inputs = tuple(
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
    ops = Counter(op_name(node.target) for node in program.graph.nodes if node.op == "call_function")

    kinds = {
        "PARAMETER": "parameter",
        "BUFFER": "buffer",
        "CONSTANT_TENSOR": "constant",
    }
    weights: list[WeightInfo] = []
    parameters = 0
    for spec in signature.input_specs:
        kind = kinds.get(spec.kind.name)
        if kind is None or spec.target is None:
            continue
        tensor = program.state_dict.get(spec.target)
        if tensor is None:
            tensor = program.constants.get(spec.target)
        if tensor is None:
            continue
        shape = tuple(int(d) for d in tensor.shape)
        weights.append(
            WeightInfo(
                name=spec.target,
                shape=shape,
                encoding=torch_dtype_name(tensor.dtype),
                nbytes=tensor.numel() * tensor.element_size(),
                kind=kind,
            )
        )
        if kind == "parameter":
            parameters += tensor.numel()
    return ModelReport(
        path=str(path),
        format="pt2",
        inputs=user_inputs,
        outputs=outputs,
        ops=dict(ops.most_common()),
        weights=tuple(weights),
        parameters=parameters,
    )
