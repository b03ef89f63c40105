"""How a `torch.export` program stores each weight it computes from state: its encoding, in the
words every container uses (`weights.describe`), and its bytes as Core AI will pack them.

`ExportWeights` reports what it wrote with it, and inspect reads every weight back with it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from coreai_opt._elements import ELEMENTS, core_ai_name, packed_element
from coreai_opt.weights import Described
from coreai_opt.weights import describe as words

from . import _ops

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram
    from torch.fx import Node


def _arg(node: Node, index: int, name: str) -> Any:
    """A call's argument by position (as torch.export writes it) or keyword."""
    return node.args[index] if len(node.args) > index else node.kwargs.get(name)


class StateWalker:
    """The stored form of every state tensor and every decompression call over them."""

    def __init__(self, program: ExportedProgram) -> None:
        self.program = program
        self.targets = {s.arg.name: s.target for s in program.graph_signature.input_specs if s.target}
        self.memo: dict[Node, Described | None] = {}

    def tensor(self, node: Node) -> torch.Tensor | None:
        import torch

        target = self.targets.get(node.name) if node.op == "placeholder" else None
        if target is None:
            return None
        value = self.program.state_dict.get(target)
        if value is None:
            value = self.program.constants.get(target)
        return value if isinstance(value, torch.Tensor) else None

    def stored(self, node: Node) -> Described | None:
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

    def _stored(self, node: Node) -> Described | None:
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
            return Described(words.lut(indices, table), indices.nbytes + table.nbytes, table.element, shape)
        if name == _ops.SHIFT_SCALE:
            data, scale = self.stored(node.args[0]), self.stored(node.args[1])  # type: ignore[arg-type]
            zero = _arg(node, 2, "zero_point")
            zero_point = self.stored(zero) if zero is not None else None
            if data is None or scale is None:
                return None
            nbytes = data.nbytes + scale.nbytes + (zero_point.nbytes if zero_point else 0)
            text = words.shift_scale(data, scale, zero_point is not None, False)
            return Described(text, nbytes, core_ai_name(node.meta["val"].dtype), data.shape)
        values, mask = self.stored(node.args[0]), self.stored(node.args[1])  # type: ignore[arg-type]
        if values is None or mask is None:
            return None
        return Described(words.sparse(values, mask), values.nbytes + mask.nbytes, values.element, mask.shape)

    def _bits(self, call: Node) -> int | None:
        """The integer width of a shift-scale's data, where its buffers say it
        (`quantization_n_bits` beside the data, as coreai-torch reads it)."""
        data = call.args[0]
        target = self.targets.get(getattr(data, "name", ""))
        if target is None:
            return None
        value = self.program.state_dict.get(target.rpartition(".")[0] + ".quantization_n_bits")
        return int(value) if value is not None else None

    def _plain(self, node: Node, tensor: torch.Tensor) -> Described:
        """A state tensor as Core AI will store it: sub-byte codes by the width the reading op gives."""
        shape = tuple(int(d) for d in tensor.shape)
        element, nbytes = core_ai_name(tensor.dtype), tensor.numel() * tensor.element_size()
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
                elif (packed := packed_element(tensor.dtype, scale.dtype)) is not None:
                    element, shape = packed.name, (*shape[:-1], shape[-1] * packed.codes_per_byte)
            elif name == _ops.SPARSE_TO_DENSE and user.args[1] is node:
                element = "ui1"
        bits = ELEMENTS[element].bits if element in ELEMENTS else 8 * tensor.element_size()
        if bits < 8:
            nbytes = math.ceil(math.prod(shape) * bits / 8)
        return Described(element, nbytes, element, shape)


def _leaves(node: Node) -> list[Node]:
    found: list[Node] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if current.op == "placeholder":
            found.append(current)
        stack.extend(a for a in current.all_input_nodes)
    return found


def stored_form(program: ExportedProgram, node: Node) -> Described:
    """How the weight `node` decodes is stored ("ui4 LUT(16 x f16)") and its packed bytes, as
    inspect reads it back."""
    stored = StateWalker(program).stored(node)
    if stored is None:
        raise ValueError(f"{node.name} is not computed from stored tensors")
    return stored
