"""What a `torch.export` program does with each user input (the Core AI side is `_coreai.input_usage`)."""

from __future__ import annotations

import operator
from collections import deque
from typing import TYPE_CHECKING, Any

from ._policy import InputRule, InputSpec, Kind, Usage

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram
    from torch.fx import Node


def _shape_reads() -> frozenset[Any]:
    import torch

    aten = torch.ops.aten
    return frozenset({aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int})


def user_input_nodes(ep: ExportedProgram) -> list[Node]:
    """The placeholders of the program's user inputs, in input order."""
    names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    by_name = {node.name: node for node in ep.graph.nodes if node.op == "placeholder"}
    return [by_name[name] for name in names if name in by_name]


def _concrete(dim: Any) -> int:
    import torch

    return int(dim.node.hint) if isinstance(dim, torch.SymInt) else int(dim)


def exported_program_specs(ep: ExportedProgram) -> list[InputSpec]:
    """The user inputs in order: name, kind and (concrete) shape."""
    specs = []
    for node in user_input_nodes(ep):
        value = node.meta["val"]
        specs.append(InputSpec(node.name, Kind.of(value.dtype), tuple(_concrete(d) for d in value.shape)))
    return specs


def exported_program_usage(ep: ExportedProgram) -> dict[str, Usage]:
    """Per user input: the smallest table it indexes, and whether arithmetic comes first."""
    from coreai_opt._aten import CAST_PACKETS, VIEW_PACKETS, index_arguments, indexed_rows, packet

    usage = {}
    shape_reads = _shape_reads()
    for start in user_input_nodes(ep):
        rows: list[int] = []
        arithmetic = False
        seen = {(start, False)}
        queue: deque[tuple[Node, bool]] = deque([(start, False)])
        while queue:
            node, changed = queue.popleft()
            for user in node.users:
                if user.op != "call_function" or user.target in shape_reads:
                    continue  # a tensor's size is not its values (a stateful decoder's token count)
                if node in index_arguments(user):
                    found = indexed_rows(user)
                    if found is not None:
                        rows.append(found)
                        arithmetic |= changed
                    continue
                passes = packet(user) in VIEW_PACKETS or packet(user) in CAST_PACKETS
                passes = passes or user.target is operator.getitem
                state = (user, changed or not passes)
                if state not in seen:
                    seen.add(state)
                    queue.append(state)
        usage[start.name] = Usage(min(rows) if rows else None, arithmetic)
    return usage


def drawn_inputs(ep: ExportedProgram, seed: int = 0) -> tuple[list[torch.Tensor], list[InputRule]]:
    """The program's user inputs drawn by the input policy with `seed`, in input order and in the
    program's dtypes, and how each was drawn."""
    import torch

    from ._policy import draw_inputs, input_rules

    specs = exported_program_specs(ep)
    rules = input_rules(specs, exported_program_usage(ep))
    drawn = draw_inputs(specs, rules, seed)
    dtypes = [node.meta["val"].dtype for node in user_input_nodes(ep)]
    return [torch.from_numpy(drawn[s.name]).to(d) for s, d in zip(specs, dtypes, strict=True)], rules
