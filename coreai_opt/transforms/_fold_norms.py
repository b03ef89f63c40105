"""Fold each normalization's elementwise scale g (and a LayerNorm's shift b) into the linear
layers that read the normalized value: W(g * x + b) + c = (W diag g) x + (W b + c), so each
reader's weight takes g along its input axis, its bias takes W b, and the norm is left with
scale 1 and shift 0 - the same function, the same ops.

A norm is folded only where every use of its output is the activation of a weight-reading op
(through views that keep the last axis), each weight is a float parameter read by that op alone
(a tied embedding and head stay as they are), and a shift has a bias to go to; otherwise it is
left, and the report says why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coreai_opt._aten import PASS_THROUGH, VIEW_PACKETS, WEIGHT_OPS, packet
from coreai_opt.weights import Use

from ._graph import bias_operand, first_output, parameters, source

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram
    from torch.fx import Node


@dataclass(frozen=True)
class Reader:
    """A weight-reading op fed by the norm: its weight's name and input axis, its bias's name."""

    weight: str
    input_axis: int
    bias: str | None


@dataclass(frozen=True)
class NormGroup:
    """A norm's scale and shift (state-dict names) and the linears reading its output - or why
    its output reaches something else (`problem`)."""

    scale: str
    shift: str | None
    readers: tuple[Reader, ...] = ()
    problem: str | None = None


def norm_groups(program: ExportedProgram) -> list[NormGroup]:
    """Every norm with a stored scale, in graph order, with the linears that read it."""
    names = parameters(program)
    groups = []
    for node in program.graph.nodes:
        norm = _norm(node, names)
        if norm is None:
            continue
        scale, shift = names[norm[1]], None if norm[2] is None else names[norm[2]]
        readers = _readers(norm[0], names)
        problem = readers if isinstance(readers, str) else _problem(program, readers, shift)
        groups.append(NormGroup(scale, shift, () if isinstance(readers, str) else tuple(readers), problem))
    return groups


def fold_norms(program: ExportedProgram, config: Any) -> list[str]:
    """Fold every norm it can (in graph order); a line for each norm folded or left."""
    del config  # nothing to choose: tolerance and samples are transform_'s
    lines = []
    for group in norm_groups(program):
        if group.problem is not None:
            lines.append(f"{group.scale}: left ({group.problem})")
            continue
        _fold(program, list(group.readers), group.scale, group.shift)
        lines.append(f"{group.scale}: folded into {', '.join(r.weight for r in group.readers)}")
    return lines


def _norm(node: Node, names: dict[str, str]) -> tuple[Node, str, str | None] | None:
    """(the normalized output, its scale's placeholder, its shift's placeholder or None) where
    `node` applies a norm's parameters: `mul(g, x)` with a 1-D parameter g along the last axis,
    or a LayerNorm's output 0."""
    import torch

    aten = torch.ops.aten
    kind = packet(node)
    if kind is aten.mul and len(node.args) == 2:
        for g, x in (node.args, node.args[::-1]):
            if _is_parameter(g, names) and _vector_along_last(g, x):
                return node, g.name, None  # type: ignore[union-attr]
    if kind in (aten.native_layer_norm, aten.layer_norm) and len(node.args) >= 4:
        weight, bias = node.args[2], node.args[3]
        if _is_parameter(weight, names) and (bias is None or _is_parameter(bias, names)):
            output = node if kind is aten.layer_norm else first_output(node)
            if output is not None:
                return output, weight.name, bias.name if bias is not None else None  # type: ignore[union-attr]
    return None


def _is_parameter(value: Any, names: dict[str, str]) -> bool:
    return getattr(value, "op", None) == "placeholder" and value.name in names


def _vector_along_last(g: Node, x: Any) -> bool:
    shape, other = g.meta["val"].shape, getattr(x, "meta", {}).get("val")
    return len(shape) == 1 and other is not None and other.dim() >= 1 and other.shape[-1] == shape[0]


def _readers(output: Node, names: dict[str, str]) -> list[Reader] | str:
    """The weight-reading ops the norm's output feeds, or why it feeds something else."""
    readers: list[Reader] = []
    stack = list(output.users)
    while stack:
        user = stack.pop()
        if packet(user) in VIEW_PACKETS and user.meta["val"].shape[-1:] == output.meta["val"].shape[-1:]:
            stack.extend(user.users)
            continue
        reader = _reader(user, names)
        if isinstance(reader, str):
            return reader
        readers.append(reader)
    return readers if readers else "its output reaches no linear layer"


def _reader(op: Node, names: dict[str, str]) -> Reader | str:
    """The op as a reader of a weight along the activation's last axis, or why it is not one."""
    facts = WEIGHT_OPS.get(packet(op))
    if facts is None or not facts.activations or facts.weight >= len(op.args):
        return f"its output reaches {op.name} ({op.target}), not only linear layers"
    weight, perm = source(op.args[facts.weight])
    if weight is None or weight.name not in names:
        return f"{op.name} reads no stored weight"
    if not _one_reader(weight, op):
        return f"{names[weight.name]} is read by more than {op.name} (a tied embedding and head stay as they are)"
    rank = weight.meta["val"].dim()
    _, axis = Use(facts.consumer, op.name, perm).axes(rank)
    bias = _bias(op, names)
    return Reader(names[weight.name], axis, bias)


def _one_reader(weight: Node, op: Node) -> bool:
    """Every use of the weight leads to `op` alone (through its transposes)."""
    stack = list(weight.users)
    while stack:
        user = stack.pop()
        if user is op:
            continue
        if packet(user) not in PASS_THROUGH or len(user.users) != 1:
            return False
        stack.extend(user.users)
    return True


def _bias(op: Node, names: dict[str, str]) -> str | None:
    operand = bias_operand(op)
    if operand is None:
        return None
    node, perm = source(operand)
    return names.get(node.name) if node is not None and perm is None else None


def _problem(program: ExportedProgram, readers: list[Reader], shift: str | None) -> str | None:
    state = program.state_dict
    for reader in readers:
        if reader.weight not in state or not state[reader.weight].is_floating_point():
            return f"{reader.weight} is not a float weight this program stores"
    names = [r.weight for r in readers]
    if len(set(names)) != len(names):
        return "a weight is read twice"
    unbiased = any(r.bias is None or r.bias not in state for r in readers)
    if shift is not None and unbiased and bool(state[shift].any()):
        return "its shift has no bias to go to in every reader"
    return None


def _fold(program: ExportedProgram, readers: list[Reader], scale: str, shift: str | None) -> None:
    """g into every weight along its input axis, W b into every bias; g to 1, b to 0 (`scale`,
    `shift`: their state-dict names). Tensors are replaced, never written into (the caller may
    restore the ones it held)."""
    import torch

    state = program.state_dict
    g = state[scale].double()
    b = state[shift].double() if shift is not None else None
    for reader in readers:
        weight = state[reader.weight]
        wide = weight.double()
        shape = [1] * wide.dim()
        shape[reader.input_axis] = -1
        if b is not None and reader.bias is not None:
            moved = wide.movedim(reader.input_axis, -1).reshape(-1, wide.shape[reader.input_axis])
            bias = state[reader.bias]
            replace_tensor(state, reader.bias, bias.double() + (moved @ b).reshape(bias.shape))
        replace_tensor(state, reader.weight, wide * g.reshape(shape))
    replace_tensor(state, scale, torch.ones_like(state[scale]))
    if shift is not None:
        replace_tensor(state, shift, torch.zeros_like(state[shift]))


def replace_tensor(state: dict[str, Any], name: str, value: torch.Tensor) -> None:
    """A new tensor under `name`, in the old one's dtype and kind (a parameter stays one)."""
    import torch

    old = state[name]
    new = value.to(old.dtype).contiguous()
    state[name] = (
        torch.nn.Parameter(new, requires_grad=old.requires_grad)
        if isinstance(old, torch.nn.Parameter)
        else new
    )
