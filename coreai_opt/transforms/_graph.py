"""What the transforms read off an exported graph: which placeholders are stored state, and
which stored tensor an operand is read from (through transposes and casts)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coreai_opt._aten import PASS_THROUGH, VIEW_PACKETS, aten, packet, permutation

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.fx import Node


def parameters(program: ExportedProgram) -> dict[str, str]:
    """Placeholder name -> state-dict name of every parameter and buffer."""
    return {
        spec.arg.name: spec.target
        for spec in program.graph_signature.input_specs
        if spec.kind.name in ("PARAMETER", "BUFFER") and spec.target is not None
    }


def source(value: Any) -> tuple[Node | None, tuple[int, ...] | None]:
    """The placeholder a weight operand is read from through transposes and casts, and the
    permutation between them (None: no transpose)."""
    perm: tuple[int, ...] | None = None
    node = value
    while getattr(node, "op", None) == "call_function" and packet(node) in PASS_THROUGH:
        step = permutation(node, node.meta["val"].dim())
        if step is None and packet(node) in VIEW_PACKETS:
            return None, None  # a reshape of the weight: its axes are not the stored ones
        if step is not None:
            perm = step if perm is None else tuple(step[p] for p in perm)
        node = node.args[0]
    return (node, perm) if getattr(node, "op", None) == "placeholder" else (None, None)


def bias_operand(op: Node) -> Any:
    """The bias operand of a linear or addmm (None for other ops, or where it has none)."""
    position = {aten.linear: 2, aten.addmm: 0}.get(packet(op))
    return op.args[position] if position is not None and position < len(op.args) else None


def cuts_last_axis(node: Node) -> bool:
    """A slice, select or narrow along its operand's last axis."""
    if packet(node) not in (aten.slice, aten.select, aten.narrow):
        return False
    rank = node.args[0].meta["val"].dim()
    dim = node.args[1] if len(node.args) > 1 else 0
    return int(dim) % rank == rank - 1


def first_output(node: Node) -> Node | None:
    """The one `getitem(node, 0)` of a multi-output op, or None."""
    import operator

    users = [u for u in node.users if u.target is operator.getitem and u.args[1] == 0]
    return users[0] if len(users) == 1 else None


def readers_of(placeholder: Node) -> set[Node]:
    """The ops that read a stored tensor, looking through the transposes and casts it passes."""
    found: set[Node] = set()
    stack = [(placeholder, user) for user in placeholder.users]
    while stack:
        value, user = stack.pop()
        if packet(user) in PASS_THROUGH and user.args and user.args[0] is value:
            stack.extend((user, after) for after in user.users)
        else:
            found.add(user)
    return found


class Snapshot:
    """A program's graph, input specs and state as they were, to put back when a transform
    fails: the graph is copied (node names and metadata kept), tensors are held, not copied -
    transforms replace them, never write into them."""

    def __init__(self, program: ExportedProgram) -> None:
        import torch.fx

        self.program = program
        self.graph = torch.fx.Graph(owning_module=program.graph_module)
        output = self.graph.graph_copy(program.graph, {})
        self.graph.output(output)
        self.specs = list(program.graph_signature.input_specs)
        self.state = dict(program.state_dict)

    def restore(self) -> None:
        program = self.program
        program.graph_module.graph = self.graph
        program.graph_module.recompile()
        program.graph_signature.input_specs[:] = self.specs
        program.state_dict.clear()
        program.state_dict.update(self.state)
