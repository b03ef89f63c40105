"""Cast cleanup to a fixed point: same-dtype casts, foldable chains, sibling casts, dead code.

A chain x -> a -> b folds to x -> b when the middle step loses nothing (its dtype holds x's),
and a round trip x -> a -> x(dtype) disappears when it is widening, or when every cast in it was
made by the pass. A narrowing cast the user wrote rounds values on purpose: it is a barrier.
"""

from __future__ import annotations

import torch
from torch.fx import Graph, Node

from coreai_opt._aten import VIEW_PACKETS

from . import _dtypes as dt
from . import _graph as g


def _source(cast: Node) -> Node:
    source = cast.args[0]
    assert isinstance(source, Node)
    return source


def is_int16_anchor(node: Node) -> bool:
    """int16 -> int16 in front of view-like ops: put there on purpose by the INT pass."""
    return (
        g.cast_target_dtype(node) == torch.int16
        and bool(node.users)
        and all(g.packet(u) in VIEW_PACKETS for u in node.users)
    )


def _drop_same_dtype(graph: Graph, owned: set[Node]) -> bool:
    changed = False
    for node in list(graph.nodes):
        if not (g.is_pure_cast(node) and node.users) or is_int16_anchor(node):
            continue
        if g.dtype_of(_source(node)) == g.cast_target_dtype(node):
            node.replace_all_uses_with(_source(node))
            changed = True
    return changed


def _fold_chains(graph: Graph, owned: set[Node]) -> bool:
    changed = False
    for outer in list(graph.nodes):
        if not (g.is_pure_cast(outer) and outer.users):
            continue
        inner = _source(outer)
        if not g.is_pure_cast(inner):
            continue
        origin = _source(inner)
        start, middle, end = g.dtype_of(origin), g.cast_target_dtype(inner), g.cast_target_dtype(outer)
        if start is None or middle is None or end is None:
            continue
        ours = inner in owned and outer in owned
        if start == end:
            if dt.holds(middle, start) or ours:
                outer.replace_all_uses_with(origin)
                changed = True
        elif dt.holds(middle, start) or ours:
            outer.replace_input_with(inner, origin)  # x -> end directly
            if inner not in owned:
                owned.discard(outer)  # inherits the user's intent: stays a barrier
            changed = True
    return changed


def _share_siblings(graph: Graph, owned: set[Node]) -> bool:
    changed = False
    order = {node: i for i, node in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        seen: dict[torch.dtype, Node] = {}
        for user in list(node.users):
            if not (g.is_pure_cast(user) and user.args[0] is node):
                continue
            dtype = g.cast_target_dtype(user)
            assert dtype is not None
            keeper = seen.get(dtype)
            if keeper is None:
                seen[dtype] = user
                continue
            # the earlier node in graph order dominates both users' positions
            first, second = (keeper, user) if order[keeper] < order[user] else (user, keeper)
            second.replace_all_uses_with(first)
            if second not in owned:
                owned.discard(first)
            seen[dtype] = first
            changed = True
    return changed


def cleanup(graph: Graph, owned: set[Node]) -> None:
    while True:
        changed = _drop_same_dtype(graph, owned)
        changed |= _fold_chains(graph, owned)
        changed |= _share_siblings(graph, owned)
        graph.eliminate_dead_code()
        if not changed:
            break
    owned.intersection_update(set(graph.nodes))
