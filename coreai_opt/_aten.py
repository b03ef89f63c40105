"""The one table of ATen facts every reader of an exported graph shares.

Which ops read a weight, at which operand and with which layout, and which of their other
operands are activations (the compression container, W8A8 and calibration); which ops only
move, select or re-type data (views, transposes, casts: a weight read through them is still the
weight); which arguments are indices (the INT16 pass must never narrow them, the input policy
draws them from the table they index). One place, so a new op is taught to every reader at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

from coreai_opt.weights import Consumer

aten = torch.ops.aten


@dataclass(frozen=True)
class WeightOp:
    """An op that reads a weight: how (its layout), at which operand, and which of its other
    float operands are activations (what W8A8 quantizes and calibration measures)."""

    consumer: Consumer
    weight: int
    activations: tuple[int, ...]


WEIGHT_OPS: dict[Any, WeightOp] = {
    aten.linear: WeightOp(Consumer.LINEAR, 1, (0,)),
    aten.convolution: WeightOp(Consumer.CONV, 1, (0,)),
    aten.conv1d: WeightOp(Consumer.CONV, 1, (0,)),
    aten.conv2d: WeightOp(Consumer.CONV, 1, (0,)),
    aten.conv3d: WeightOp(Consumer.CONV, 1, (0,)),
    aten.embedding: WeightOp(Consumer.GATHER, 0, ()),
    aten.mm: WeightOp(Consumer.MATMUL, 1, (0, 1)),
    aten.bmm: WeightOp(Consumer.MATMUL, 1, (0, 1)),
    aten.matmul: WeightOp(Consumer.MATMUL, 1, (0, 1)),
    aten.addmm: WeightOp(Consumer.MATMUL, 2, (1, 2)),
    aten.baddbmm: WeightOp(Consumer.MATMUL, 2, (1, 2)),
}

# op packet -> positions of its index arguments (each an int tensor or a list of them)
INDEX_ARGS: dict[object, tuple[int, ...]] = {
    aten.embedding: (1,),
    aten.gather: (2,),
    aten.index_select: (2,),
    aten.scatter: (2,),
    aten.scatter_add: (2,),
    aten.scatter_reduce: (2,),
    aten.index: (1,),
    aten.index_put: (1,),
    aten._unsafe_index: (1,),
    aten._unsafe_index_put: (1,),
    aten.index_add: (2,),
    aten.index_copy: (2,),
    aten.index_fill: (2,),
    aten.take_along_dim: (1,),
    aten.take: (1,),
}

# Pure dtype conversions as they appear in exported (and decomposed) programs.
CAST_PACKETS = frozenset({aten._to_copy, aten.to, torch.ops.prims.convert_element_type})

# Ops that only move, select or broadcast elements.
VIEW_PACKETS = frozenset(
    {
        aten.view,
        aten.reshape,
        aten._unsafe_view,
        aten.permute,
        aten.transpose,
        aten.t,
        aten.slice,
        aten.select,
        aten.squeeze,
        aten.unsqueeze,
        aten.expand,
        aten.flatten,
        aten.unflatten,
        aten.narrow,
        aten.alias,
    }
)

ARITHMETIC = frozenset({aten.add, aten.mul, aten.sub})

# Ops a weight can pass through on its way to the op that reads it and still be that weight
# (W8A8 and calibration look through them to find the parameter).
PASS_THROUGH = VIEW_PACKETS | CAST_PACKETS | frozenset({aten.t, aten.clone, aten.contiguous})


def permutation(node: Node, rank: int) -> tuple[int, ...] | None:
    """The permutation a transposing view applies to its first operand (None if `node` is not one)."""
    kind = packet(node)
    if kind is aten.permute:
        return tuple(int(d) % rank for d in node.args[1])  # type: ignore[union-attr]
    if kind is aten.t or kind is aten.numpy_T:
        return tuple(reversed(range(rank)))
    if kind is aten.transpose:
        a, b = int(node.args[1]) % rank, int(node.args[2]) % rank  # type: ignore[arg-type]
        order = list(range(rank))
        order[a], order[b] = order[b], order[a]
        return tuple(order)
    return None


def module_path(node: Node) -> str:
    """The qualified name of the module a node ran in (`layers.0.mlp`), from torch.export's
    `nn_module_stack`; empty at the top level."""
    stack = node.meta.get("nn_module_stack") or {}
    return str(list(stack.values())[-1][0]) if stack else ""


def packet(node: Node) -> Any:
    return getattr(node.target, "overloadpacket", node.target)


def index_arguments(node: Node) -> list[Node]:
    """The nodes `node` uses as indices (empty for ops that take none)."""
    positions = INDEX_ARGS.get(packet(node))
    if not positions:
        return []
    found: list[Node] = []
    for position in positions:
        if position < len(node.args):
            torch.fx.node.map_arg(node.args[position], found.append)
    for key in ("index", "indices"):
        if key in node.kwargs:
            torch.fx.node.map_arg(node.kwargs[key], found.append)
    return found


def indexed_rows(node: Node) -> int | None:
    """How many rows the data operand of an index op has along the indexed axis, when known."""
    data = node.args[0] if node.args else None
    if packet(node) is aten.embedding:
        data = node.args[0]
        axis = 0
    elif packet(node) in (aten.gather, aten.index_select, aten.scatter, aten.scatter_add, aten.index_add):
        axis = node.args[1] if len(node.args) > 1 and isinstance(node.args[1], int) else 0
    else:
        axis = 0
    value = data.meta.get("val") if isinstance(data, Node) else None
    shape = getattr(value, "shape", None)
    if shape is None or not len(shape):
        return None
    try:
        return int(shape[axis])
    except (IndexError, TypeError, ValueError):
        return None


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
