"""Adding state and op calls to a `torch.export` program in place, with the metadata torch needs.

A new buffer is a placeholder before the user inputs, an input spec and a state-dict entry; a new
call carries the fake value its op computes, so the program validates, saves and unlifts as if
torch had exported it. The weight container and W8A8's activation quantization both edit
programs so - never by exporting them again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram
    from torch.fx import Node


class ProgramEdit:
    """Buffers and calls added to one program (sharing its fake-tensor mode)."""

    def __init__(self, ep: ExportedProgram) -> None:
        self.ep = ep
        self._fake_mode = next(
            (
                n.meta["val"].fake_mode
                for n in ep.graph.nodes
                if n.op == "placeholder" and getattr(n.meta.get("val"), "fake_mode", None) is not None
            ),
            None,
        )

    def buffer(self, placeholder: str, target: str, tensor: torch.Tensor) -> Node:
        """A new persistent buffer `target` read through a placeholder named `placeholder`, placed
        before the user inputs (where torch.export puts state); its values parked in the spill of a
        `_memory.spilling` block around, if any (a compressed program's codes wait for the save)."""
        from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

        from coreai_opt._memory import parked

        tensor = parked(tensor)

        graph = self.ep.graph
        specs = self.ep.graph_signature.input_specs
        position = next((i for i, s in enumerate(specs) if s.kind == InputKind.USER_INPUT), len(specs))
        placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
        anchor = (
            placeholders[specs[position].arg.name]
            if position < len(specs)
            else next(n for n in graph.nodes if n.op != "placeholder")
        )
        with graph.inserting_before(anchor):
            node = graph.placeholder(placeholder)
        node.meta["val"] = self.fake(tensor)
        specs.insert(position, InputSpec(InputKind.BUFFER, TensorArgument(node.name), target, True))
        self.ep.state_dict[target] = tensor
        return node

    def fake(self, tensor: torch.Tensor) -> Any:
        if self._fake_mode is None:
            from torch._subclasses.fake_tensor import FakeTensorMode

            self._fake_mode = FakeTensorMode()
        return self._fake_mode.from_tensor(tensor, static_shapes=True)

    def call(self, op: Any, *args: Any) -> Node:
        """A call of `op` with positional `args` (as torch.export writes calls: coreai-torch's
        converter reads arguments by position), at the graph's insertion point."""
        from torch.fx.node import map_arg

        node = self.ep.graph.call_function(op, tuple(args))
        if self._fake_mode is None:
            self.fake(_empty())
        with self._fake_mode:  # nodes inside lists (a view's sizes read by sym_size) by their values too
            node.meta["val"] = op(*map_arg(tuple(args), lambda a: a.meta["val"]))
        return node


def _empty() -> torch.Tensor:
    import torch

    return torch.zeros(())
