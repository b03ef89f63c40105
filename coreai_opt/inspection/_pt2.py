"""What a `torch.export` program holds: signature, ops and state."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coreai_opt._elements import ELEMENTS

from . import _encoding as describe
from ._encoding import Stored
from ._report import ModelReport, TensorInfo, WeightInfo

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram
    from torch.fx import Node


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

    walker = _Walker(program)
    weights: list[WeightInfo] = []
    parameters = 0
    compressed = False
    for spec in signature.input_specs:
        kind = _KINDS.get(spec.kind.name)
        node = nodes.get(spec.arg.name)
        if kind is None or spec.target is None or node is None or walker.tensor(node) is None:
            continue
        if node.users and all(_decompression(user) for user in node.users):
            continue  # a part of a compressed weight: listed with it below
        stored = walker.stored(node)
        assert stored is not None
        weights.append(WeightInfo(spec.target, stored.shape, stored.encoding, stored.nbytes, kind))
        if kind == "parameter":
            parameters += math.prod(stored.shape)
    for node in program.graph.nodes:
        if not _decompression(node) or all(_decompression(user) for user in node.users):
            continue
        stored = walker.stored(node)
        if stored is None:
            continue
        compressed = True
        weights.append(
            WeightInfo(walker.weight_name(node), stored.shape, stored.encoding, stored.nbytes, "compressed")
        )
        parameters += math.prod(stored.shape)
    notes = (
        ("sub-byte codes are held one per byte in a .pt2; bytes are as converted (packed)",)
        if compressed
        else ()
    )
    return ModelReport(
        path=str(path),
        format="pt2",
        inputs=user_inputs,
        outputs=outputs,
        ops=dict(ops.most_common()),
        weights=tuple(weights),
        parameters=parameters,
        notes=notes,
    )


_KINDS = {"PARAMETER": "parameter", "BUFFER": "buffer", "CONSTANT_TENSOR": "constant"}


def _decompression(node: Node) -> bool:
    from coreai_opt._export._ops import is_decompression

    return is_decompression(node)


def _arg(node: Node, index: int, name: str) -> Any:
    """A call's argument by position (as torch.export writes it) or keyword."""
    return node.args[index] if len(node.args) > index else node.kwargs.get(name)


class _Walker:
    """The stored form of every state tensor and every decompression call over them."""

    def __init__(self, program: ExportedProgram) -> None:
        self.program = program
        self.targets = {s.arg.name: s.target for s in program.graph_signature.input_specs if s.target}
        self.memo: dict[Node, Stored | None] = {}

    def tensor(self, node: Node) -> torch.Tensor | None:
        import torch

        target = self.targets.get(node.name) if node.op == "placeholder" else None
        if target is None:
            return None
        value = self.program.state_dict.get(target)
        if value is None:
            value = self.program.constants.get(target)
        return value if isinstance(value, torch.Tensor) else None

    def stored(self, node: Node) -> Stored | None:
        if node not in self.memo:
            self.memo[node] = self._stored(node)
        return self.memo[node]

    def weight_name(self, node: Node) -> str:
        """The compressed weight's name: its buffers are `<weight>_compressed.<part>`."""
        for leaf in _leaves(node):
            module = self.targets.get(leaf.name, "").rpartition(".")[0]
            if module.endswith("_compressed"):
                return module.removesuffix("_compressed")
        return node.name

    def _stored(self, node: Node) -> Stored | None:
        from coreai_opt._export import _ops

        tensor = self.tensor(node)
        if tensor is not None:
            return self._plain(node, tensor)
        name = _ops.op_name(node)
        if name is None:
            return None
        if name == _ops.LUT_TO_DENSE:
            indices, table = self.stored(node.args[0]), self.stored(node.args[1])  # type: ignore[arg-type]
            if indices is None or table is None:
                return None
            shape = tuple(int(d) for d in node.meta["val"].shape)
            return Stored(describe.lut(indices, table), indices.nbytes + table.nbytes, table.element, shape)
        if name == _ops.SHIFT_SCALE:
            data, scale = self.stored(node.args[0]), self.stored(node.args[1])  # type: ignore[arg-type]
            zero = _arg(node, 2, "zero_point")
            zero_point = self.stored(zero) if zero is not None else None
            if data is None or scale is None:
                return None
            nbytes = data.nbytes + scale.nbytes + (zero_point.nbytes if zero_point else 0)
            text = describe.shift_scale(data, scale, zero_point is not None, False)
            return Stored(text, nbytes, torch_dtype_name(node.meta["val"].dtype), data.shape)
        values, mask = self.stored(node.args[0]), self.stored(node.args[1])  # type: ignore[arg-type]
        if values is None or mask is None:
            return None
        return Stored(describe.sparse(values, mask), values.nbytes + mask.nbytes, values.element, mask.shape)

    def _bits(self, call: Node) -> int | None:
        """The integer width of a shift-scale's data, where its buffers say it
        (`quantization_n_bits` beside the data, as coreai-torch reads it)."""
        data = call.args[0]
        target = self.targets.get(getattr(data, "name", ""))
        if target is None:
            return None
        value = self.program.state_dict.get(target.rpartition(".")[0] + ".quantization_n_bits")
        return int(value) if value is not None else None

    def _plain(self, node: Node, tensor: torch.Tensor) -> Stored:
        """A state tensor as Core AI will store it: sub-byte codes by the width the reading op gives."""
        from coreai_opt._export import _ops
        from coreai_opt._export._ops import is_packed_fp4

        shape = tuple(int(d) for d in tensor.shape)
        element, nbytes = torch_dtype_name(tensor.dtype), tensor.numel() * tensor.element_size()
        for user in node.users:
            name = _ops.op_name(user)
            if name == _ops.LUT_TO_DENSE and user.args[0] is node:
                entries = int(user.args[1].meta["val"].shape[-2])  # type: ignore[union-attr]
                element = f"ui{entries.bit_length() - 1}"
            elif name == _ops.SHIFT_SCALE and node in (user.args[0], _arg(user, 2, "zero_point")):
                scale = user.args[1].meta["val"]  # type: ignore[union-attr]
                bits = self._bits(user)
                if bits is not None:
                    element = f"{'si' if tensor.dtype.is_signed else 'ui'}{bits}"
                elif is_packed_fp4(tensor, scale):
                    element, shape = "f4E2M1FN", (*shape[:-1], shape[-1] * 2)
            elif name == _ops.SPARSE_TO_DENSE and user.args[1] is node:
                element = "ui1"
        bits = ELEMENTS[element].bits if element in ELEMENTS else 8 * tensor.element_size()
        if bits < 8:
            nbytes = math.ceil(math.prod(shape) * bits / 8)
        return Stored(element, nbytes, element, shape)


def _leaves(node: Node) -> list[Node]:
    found: list[Node] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if current.op == "placeholder":
            found.append(current)
        stack.extend(a for a in current.all_input_nodes)
    return found


def stored_form(program: ExportedProgram, node: Node) -> Stored:
    """How the weight `node` decodes is stored ("ui4 LUT(16 x f16)") and its packed bytes, as
    inspect reads it back."""
    stored = _Walker(program).stored(node)
    if stored is None:
        raise ValueError(f"{node.name} is not computed from stored tensors")
    return stored
