"""The parts of an ExportedProgram the passes read and write: inputs, state, outputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx import Node

from coreai_opt.inputs import user_input_nodes as user_inputs  # noqa: F401  (the passes' name)


@dataclass(frozen=True)
class StateSlot:
    """A parameter, buffer or lifted constant and where its tensor lives."""

    node: Node
    name: str  # the state_dict / constants key (e.g. "fc.weight")
    kind: str  # parameter, buffer, constant
    in_state_dict: bool


def placeholders(ep: ExportedProgram) -> dict[str, Node]:
    return {node.name: node for node in ep.graph.nodes if node.op == "placeholder"}


def user_outputs(ep: ExportedProgram) -> list[Node | None]:
    """The graph's user outputs in order (None for non-tensor outputs)."""
    output = next(node for node in ep.graph.nodes if node.op == "output")
    values = output.args[0]
    specs = ep.graph_signature.output_specs
    result: list[Node | None] = []
    for spec, value in zip(specs, values, strict=False):  # type: ignore[arg-type]
        if spec.kind.name == "USER_OUTPUT":
            result.append(value if isinstance(value, Node) else None)
    return result


def state_slots(ep: ExportedProgram) -> list[StateSlot]:
    by_name = placeholders(ep)
    slots = []
    for spec in ep.graph_signature.input_specs:
        node = by_name.get(spec.arg.name)
        if node is None or spec.target is None:
            continue
        if spec.kind == InputKind.PARAMETER:
            slots.append(StateSlot(node, spec.target, "parameter", True))
        elif spec.kind == InputKind.BUFFER:
            slots.append(StateSlot(node, spec.target, "buffer", spec.target in ep.state_dict))
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            slots.append(StateSlot(node, spec.target, "constant", False))
    return slots


def read_state(ep: ExportedProgram, slot: StateSlot) -> torch.Tensor | None:
    store = ep.state_dict if slot.in_state_dict else ep.constants
    value = store.get(slot.name)
    return value if isinstance(value, torch.Tensor) else None


def write_state(ep: ExportedProgram, slot: StateSlot, old: torch.Tensor, new: torch.Tensor) -> None:
    store = ep.state_dict if slot.in_state_dict else ep.constants
    if isinstance(old, torch.nn.Parameter):
        new = torch.nn.Parameter(new, requires_grad=old.requires_grad)
    store[slot.name] = new


def sync_output_names(ep: ExportedProgram) -> None:
    """Output specs (and the output's meta) name the node each output reads; inserted casts move them."""
    from torch.export.graph_signature import TensorArgument

    output = next(node for node in ep.graph.nodes if node.op == "output")
    if "val" in output.meta:
        output.meta["val"] = type(output.args[0])(  # type: ignore[call-arg]
            v.meta.get("val") if isinstance(v, Node) else v
            for v in output.args[0]  # type: ignore[union-attr]
        )
    for spec, value in zip(ep.graph_signature.output_specs, output.args[0], strict=False):  # type: ignore[arg-type]
        if isinstance(value, Node) and isinstance(spec.arg, TensorArgument) and spec.arg.name != value.name:
            spec.arg = TensorArgument(name=value.name)
