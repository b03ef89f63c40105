"""The residual stream of an exported program, proved op by op: which stored tensors a rotation
Q of the stream must turn (and along which axis), and where it cannot pass.

The stream starts at the embedding lookups and is what adds of the stream and of linear layers'
outputs (the writers) make of it. A rotation x -> x Q of every stream value leaves the program's
function unchanged when every use of the stream is one of:
- a view or cast that keeps the last axis whole (rows move, channels do not);
- a sum of squares over the last axis (pow 2 then mean/sum over it: an RMS norm's statistic,
  which an orthogonal Q keeps), and a product or quotient with a per-row scalar;
- a product with a scalar or a constant vector; a product with a norm's remaining gain g (one
  that could not be folded, as before a tied head) - rewritten as one matmul by Q^T diag(g) Q;
- a linear layer reading it (its weight turns along its input axis: W Q);
- an add of the stream and a linear layer's output (its weight and bias turn along the output
  axis: Q^T W, b Q).
Anything else - a LayerNorm's centring, a slice of channels, the stream as an output - is named,
and nothing is rotated. Every stored tensor the rotation turns must be read only by the ops
proved here (a tied embedding and head are both stream readers along the same axis).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from coreai_opt._aten import CAST_PACKETS, VIEW_PACKETS, WEIGHT_OPS, aten, packet, permutation
from coreai_opt.weights import Use

from ._graph import bias_operand, cuts_last_axis, parameters, readers_of, source

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.fx import Node


@dataclass
class Stream:
    """What a rotation of the stream turns: `axes` (state-dict name -> its axes along the
    stream), `gains` (mul node -> the state-dict name of the norm gain it applies), and the
    counts of readers and writers for the report."""

    width: int = 0
    axes: dict[str, set[int]] = field(default_factory=dict)
    gains: dict[Node, str] = field(default_factory=dict)
    readers: int = 0
    writers: int = 0
    claims: dict[str, set[Node]] = field(default_factory=dict)
    roles: list[tuple[str, int, bool]] = field(default_factory=list)  # (name, axis, True: reads the stream)

    def turn(self, name: str, axis: int, op: Node) -> None:
        self.axes.setdefault(name, set()).add(axis)
        self.claims.setdefault(name, set()).add(op)


class NotAStream(ValueError):
    """Why the program's residual stream cannot be rotated (one line)."""


_KEEPS = VIEW_PACKETS | CAST_PACKETS


def trace_stream(program: ExportedProgram) -> Stream:
    """The residual stream of `program` and what a rotation of it turns; `NotAStream` naming the
    first op it cannot pass."""
    import torch

    names = parameters(program)
    stream, squares, found = set(), set(), Stream()
    for node in program.graph.nodes:
        if node.op == "output":
            if any(n in stream for n in node.all_input_nodes):
                raise NotAStream("the residual stream is an output of the program")
            continue
        if node.op != "call_function":
            continue
        inputs = node.all_input_nodes
        if any(n in squares for n in inputs):
            _reduction(node, found.width)
        elif any(n in stream for n in inputs):
            kind = _step(node, stream, found, names)
            (squares if kind == "square" else stream if kind == "stream" else set()).add(node)
        elif packet(node) is torch.ops.aten.embedding and _seed(node, found, names):
            stream.add(node)
    if not stream:
        raise NotAStream("no embedding lookup of a stored table starts a residual stream")
    _check_claims(program, found, names)
    return found


def _seed(node: Node, found: Stream, names: dict[str, str]) -> bool:
    table, _ = source(node.args[0])
    if table is None or table.name not in names or table.meta["val"].dim() != 2:
        return False
    _width(found, node)
    found.turn(names[table.name], 1, node)
    return True


def _width(found: Stream, node: Node) -> None:
    width = int(node.meta["val"].shape[-1])
    if found.width and width != found.width:
        raise NotAStream(f"{node.name} carries {width} channels where the stream has {found.width}")
    found.width = width


def _step(node: Node, stream: set[Node], found: Stream, names: dict[str, str]) -> str:
    """What `node`, which reads the stream, makes: "stream", "square" or "none" (a linear
    layer's output, a check); NotAStream where the rotation cannot pass it."""
    import torch

    aten, kind = torch.ops.aten, packet(node)
    if kind is aten._assert_tensor_metadata:
        return "none"
    if kind in _KEEPS or kind in (aten.clone, aten.contiguous):
        return _view(node, stream, found)
    if kind in (aten.add, aten.sub):
        return _add(node, stream, found, names)
    if kind in (aten.mul, aten.div):
        return _scaled(node, stream, found, names)
    if kind is aten.pow and len(node.args) == 2 and node.args[1] == 2 and node.args[0] in stream:
        return "square"
    if kind in WEIGHT_OPS:
        _reader(node, stream, found, names)
        return "none"
    if kind in (aten.native_layer_norm, aten.layer_norm):
        raise NotAStream(
            f"the residual stream reaches a LayerNorm ({node.name}), which a rotation does not pass: it "
            "subtracts each token's mean (and a post-norm encoder's, as BERT's, puts its gain and bias on "
            "the stream itself); only RMSNorm streams rotate"
        )
    raise NotAStream(
        f"the residual stream reaches {node.name} ({node.target}), which a rotation does not pass"
    )


def _view(node: Node, stream: set[Node], found: Stream) -> str:
    value = node.meta["val"]
    rank = value.dim()
    step = permutation(node, rank)
    moved = step is not None and step[-1] != rank - 1
    if (
        node.args[0] not in stream
        or moved
        or rank == 0
        or value.shape[-1] != found.width
        or cuts_last_axis(node)
    ):
        raise NotAStream(f"{node.name} ({node.target}) moves or cuts the stream's channels")
    return "stream"


def _add(node: Node, stream: set[Node], found: Stream, names: dict[str, str]) -> str:
    a, b = node.args[0], node.args[1]
    if a in stream and b in stream:
        return "stream"
    other = b if a in stream else a
    if getattr(other, "op", None) != "call_function":
        raise NotAStream(f"{node.name} adds a constant to the stream, which a rotation does not keep")
    _writer(node, other, found, names)
    return "stream"


def _writer(add: Node, value: Node, found: Stream, names: dict[str, str]) -> None:
    """The linear layer whose output `add` adds to the stream (through views): its weight turns
    along its output axis, its bias (if any) along its only axis."""
    while (
        packet(value) in VIEW_PACKETS
        and len(value.users) == 1
        and permutation(value, value.meta["val"].dim()) is None
    ):
        value = value.args[0]
    facts = WEIGHT_OPS.get(packet(value))
    weight = (
        source(value.args[facts.weight])[0] if facts is not None and facts.weight < len(value.args) else None
    )
    if facts is None or weight is None or weight.name not in names or len(value.users) != 1:
        raise NotAStream(
            f"{add.name} adds {value.name} ({value.target}) to the stream, not a linear layer's output"
        )
    if value.meta["val"].shape[-1] != found.width:
        raise NotAStream(
            f"{value.name} writes {value.meta['val'].shape[-1]} channels into a stream of {found.width}"
        )
    out_axis, _ = Use(facts.consumer, value.name, source(value.args[facts.weight])[1]).axes(
        weight.meta["val"].dim()
    )
    found.turn(names[weight.name], out_axis, value)
    found.roles.append((names[weight.name], out_axis, False))
    bias = bias_operand(value)
    if bias is not None:
        node, perm = source(bias)
        if node is None or node.name not in names or perm is not None or node.meta["val"].dim() != 1:
            raise NotAStream(f"{value.name}'s bias is not a stored vector")
        found.turn(names[node.name], 0, value)
    found.writers += 1


def _scaled(node: Node, stream: set[Node], found: Stream, names: dict[str, str]) -> str:
    """x * s or x / s: a scalar, a per-row value or a constant vector commute with the rotation;
    a norm's gain vector is kept as a matmul (`gains`)."""
    a, b = node.args[0], node.args[1]
    if a in stream and b in stream:
        raise NotAStream(f"{node.name} multiplies the stream by itself")
    x, other = (a, b) if a in stream else (b, a)
    if x is b and packet(node) is not aten.mul:
        raise NotAStream(f"{node.name} divides by the stream")
    if not hasattr(other, "meta") or other.meta["val"].dim() == 0 or other.meta["val"].shape[-1] == 1:
        return "stream"  # a number or a per-row value
    gain, _ = source(other)
    shape = other.meta["val"].shape
    if (
        gain is None
        or gain.name not in names
        or packet(node) is not aten.mul
        or any(s != 1 for s in shape[:-1])
    ):
        raise NotAStream(f"{node.name} scales the stream's channels by {other.name}, not a stored gain")
    found.gains[node] = names[gain.name]
    found.claims.setdefault(names[gain.name], set()).add(node)
    return "stream"


def _reader(node: Node, stream: set[Node], found: Stream, names: dict[str, str]) -> None:
    facts = WEIGHT_OPS[packet(node)]
    operand = node.args[facts.weight] if facts.weight < len(node.args) else None
    weight, perm = source(operand)
    stream_at = [i for i, a in enumerate(node.args) if a in stream]
    if (
        weight is None
        or weight.name not in names
        or any(i not in facts.activations or i == facts.weight for i in stream_at)
    ):
        raise NotAStream(f"{node.name} ({node.target}) reads the stream other than as a linear layer's input")
    _, in_axis = Use(facts.consumer, node.name, perm).axes(weight.meta["val"].dim())
    found.turn(names[weight.name], in_axis, node)
    found.roles.append((names[weight.name], in_axis, True))
    found.readers += 1


def _reduction(node: Node, width: int) -> None:
    """A use of a squared stream value: only a mean or sum over the whole last axis is kept."""
    import torch

    aten = torch.ops.aten
    dims = node.args[1] if len(node.args) > 1 else None
    rank = node.args[0].meta["val"].dim()
    whole = isinstance(dims, (list, tuple)) and [int(d) % rank for d in dims] == [rank - 1]
    if packet(node) not in (aten.mean, aten.sum) or not whole:
        raise NotAStream(f"{node.name} uses the squared stream other than as its mean over the channels")
    del width


def _check_claims(program: ExportedProgram, found: Stream, names: dict[str, str]) -> None:
    """Every tensor the rotation turns is read only where the stream was proved."""
    by_name = {target: name for name, target in names.items()}
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for name, ops in found.claims.items():
        outside = readers_of(placeholders[by_name[name]]) - ops
        if outside:
            op = min(outside, key=lambda n: n.name)
            raise NotAStream(f"{name} is also read by {op.name} ({op.target}), outside the stream")
    state = program.state_dict
    for name in found.axes:
        if name not in state or not state[name].is_floating_point():
            raise NotAStream(f"{name} is not a float tensor the program stores")
