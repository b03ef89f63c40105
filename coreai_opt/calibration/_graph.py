"""Facts of an exported program's graph that more than one pass over it needs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.fx import Node


def state_only(graph: Any) -> set[Node]:
    """Nodes computed from weights and constants alone (no input reaches them)."""
    state: set[Node] = set()
    for node in graph.nodes:
        if node.op == "get_attr" or (
            node.op in ("call_function", "call_method")
            and node.all_input_nodes
            and all(n in state for n in node.all_input_nodes)
        ):
            state.add(node)
    return state
