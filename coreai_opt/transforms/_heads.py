"""The value / output pair of each attention layer, proved op by op: an orthogonal R of the head
dimension turns every head's values (v -> v R: the value projection's rows, head by head) and
is undone where the heads are read back (the output projection's input columns, head by head),
since attention mixes values across positions only - softmax(q k^T) v R = (softmax(q k^T) v) R.
One R for every head keeps grouped-query attention's shared heads right (SpinQuant's R2).

From `scaled_dot_product_attention`'s value back to a linear layer's output, and from its
output forward to the linear layer that reads it, only views, transposes that keep the head
dimension last, broadcasts and copies may stand, each used once; the head dimension is split
from (and merged back into) the last axis whole. A layer where anything else stands is left,
and the report says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coreai_opt._aten import CAST_PACKETS, VIEW_PACKETS, WEIGHT_OPS, packet, permutation
from coreai_opt.weights import Use

from ._graph import bias_operand, cuts_last_axis, parameters, source

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.fx import Node


@dataclass(frozen=True)
class HeadPair:
    """What R turns in one attention layer: (state name, axis) pairs, each axis made of heads
    of `head_dim` channels."""

    label: str
    head_dim: int
    turned: tuple[tuple[str, int], ...]  # the value projection's, the output projection's, a bias

    @property
    def output(self) -> str:
        """The output projection's weight: its input axis is the one turned."""
        return self.turned[1][0]


def trace_heads(program: ExportedProgram) -> tuple[list[HeadPair], list[str]]:
    """Every attention layer's value / output pair, and a line for each layer left."""
    import torch

    names, pairs, left = parameters(program), [], []
    for node in program.graph.nodes:
        if node.op != "call_function" or packet(node) is not torch.ops.aten.scaled_dot_product_attention:
            continue
        try:
            pairs.append(_pair(node, names))
        except _Left as why:
            left.append(f"{node.name}: values and outputs left ({why})")
    return pairs, left


class _Left(ValueError):
    pass


_KEEPS = VIEW_PACKETS | CAST_PACKETS


def _keeps_last(node: Node, width: int) -> bool:
    """`node` moves whole rows of `width` channels and keeps them last."""
    import torch

    aten = torch.ops.aten
    if packet(node) not in _KEEPS and packet(node) not in (aten.clone, aten.contiguous):
        return False
    value = node.meta["val"]
    step = permutation(node, value.dim())
    return (
        value.shape[-1] == width
        and node.args[0].meta["val"].shape[-1] == width
        and not cuts_last_axis(node)
        and (step is None or step[-1] == value.dim() - 1)
    )


def _split(node: Node, head_dim: int) -> int | None:
    """Heads where `node` is a view of [..., heads * head_dim] as [..., heads, head_dim]."""
    if packet(node) not in VIEW_PACKETS or permutation(node, node.meta["val"].dim()) is not None:
        return None
    before, after = node.args[0].meta["val"].shape, node.meta["val"].shape
    if (
        len(after) < 2
        or after[-1] != head_dim
        or before[-1] != after[-2] * head_dim
        or before[:-1] != after[:-2]
    ):
        return None
    return int(after[-2])


def _pair(attention: Node, names: dict[str, str]) -> HeadPair:
    value = attention.args[2]
    head_dim = int(value.meta["val"].shape[-1])
    if any(a is value for i, a in enumerate(attention.args) if i != 2):
        raise _Left("the values are also its queries or keys")
    writer, axis_out = _value_writer(value, head_dim, names)
    reader, axis_in = _output_reader(attention, head_dim, names)
    turned = [(names[writer[0].name], axis_out), (names[reader.name], axis_in)]
    if writer[1] is not None:
        turned.append((writer[1], 0))
    return HeadPair(attention.name, head_dim, tuple(turned))


def _value_writer(value: Node, head_dim: int, names: dict[str, str]) -> tuple[tuple[Node, str | None], int]:
    """(the value projection's weight placeholder and bias name, its output axis)."""
    node = value
    while _keeps_last(node, head_dim) and len(node.users) == 1:
        node = node.args[0]
    if _split(node, head_dim) is None or len(node.users) != 1:
        raise _Left(
            f"the values come from {node.name} ({node.target}), not a split of a linear layer's output"
        )
    width = node.args[0].meta["val"].shape[-1]
    node = node.args[0]
    while _keeps_last(node, width) and len(node.users) == 1:
        node = node.args[0]
    facts = WEIGHT_OPS.get(packet(node))
    if facts is None or len(node.users) != 1 or facts.weight >= len(node.args):
        raise _Left(f"the values come from {node.name} ({node.target}), not a linear layer")
    weight, perm = source(node.args[facts.weight])
    if weight is None or weight.name not in names or len(weight.users) != 1:
        raise _Left(f"{node.name} reads no weight of its own")
    out_axis, _ = Use(facts.consumer, node.name, perm).axes(weight.meta["val"].dim())
    return (weight, _bias_name(node, names)), out_axis


def _bias_name(op: Node, names: dict[str, str]) -> str | None:
    operand = bias_operand(op)
    if operand is None:
        return None
    bias, perm = source(operand)
    if bias is None or bias.name not in names or perm is not None:
        raise _Left(f"{op.name}'s bias is not a stored vector")
    return names[bias.name]


def _output_reader(attention: Node, head_dim: int, names: dict[str, str]) -> tuple[Node, int]:
    """(the output projection's weight placeholder, its input axis)."""
    node = _only_user(attention)
    while _keeps_last(node, head_dim) and len(node.users) == 1:
        node = _only_user(node)
    heads = _merge(node, head_dim)
    if heads is None:
        raise _Left(f"the heads reach {node.name} ({node.target}), not a merge into a linear layer's input")
    width = heads * head_dim
    before, node = node, _only_user(node)
    while _keeps_last(node, width) and len(node.users) == 1:
        before, node = node, _only_user(node)
    facts = WEIGHT_OPS.get(packet(node))
    at = [i for i, a in enumerate(node.args) if a is before]
    if (
        facts is None
        or facts.weight >= len(node.args)
        or len(at) != 1
        or at[0] not in facts.activations
        or at[0] == facts.weight
    ):
        raise _Left(f"the heads reach {node.name} ({node.target}), not a linear layer's input")
    weight, perm = source(node.args[facts.weight])
    if weight is None or weight.name not in names or len(weight.users) != 1:
        raise _Left(f"{node.name} reads no weight of its own")
    _, in_axis = Use(facts.consumer, node.name, perm).axes(weight.meta["val"].dim())
    return weight, in_axis


def _only_user(node: Node) -> Any:
    users = list(node.users)
    if len(users) != 1:
        raise _Left(f"{node.name} is used {len(users)} times")
    return users[0]


def _merge(node: Node, head_dim: int) -> int | None:
    """Heads where `node` views [..., heads, head_dim] as [..., heads * head_dim]."""
    if packet(node) not in VIEW_PACKETS or permutation(node, node.meta["val"].dim()) is not None:
        return None
    before, after = node.args[0].meta["val"].shape, node.meta["val"].shape
    if (
        len(before) < 2
        or before[-1] != head_dim
        or after[-1] != before[-2] * head_dim
        or before[:-2] != after[:-1]
    ):
        return None
    return int(before[-2])
