"""Which ops make a cast program's outputs non-finite: run both programs node by node and find the
first nodes whose value is finite in the original and not in the cast program."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule, Interpreter, Node

from coreai_opt._aten import module_path

from . import _graph as g


@dataclass(frozen=True)
class Overflow:
    """A node whose fp16 value holds inf or NaN while every value it reads is finite.

    `ignore` are the ops to run in fp32 (`--ignore-op`): the node's own op, or - where the node
    is the cast back to fp16 after an op already kept in fp32 - the ops that read that cast.
    Empty when the value is a program output: no fp32 op inside can make it fit fp16.
    """

    node: str
    op: str  # the op whose value overflows
    ignore: tuple[str, ...]
    output: bool = False  # the value is a program output
    module: str = ""  # the qualified name of the module the op ran in (`layers.3.mlp`)

    def to_dict(self) -> dict[str, object]:
        return {"node": self.node, "op": self.op, "module": self.module, "ignore_ops": list(self.ignore),
                "output": self.output}  # fmt: skip


class _FiniteRecorder(Interpreter):
    """Runs a module and records, per node, whether its floating-point values are all finite."""

    def __init__(self, module: GraphModule) -> None:
        super().__init__(module)
        self.finite: dict[str, bool] = {}

    def run_node(self, n: Node) -> Any:
        value = super().run_node(n)
        tensors = [v for v in torch.utils._pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]
        floats = [t for t in tensors if t.is_floating_point()]
        if floats:
            self.finite[n.name] = all(bool(torch.isfinite(t).all()) for t in floats)
        return value


def _finite_by_node(
    program: ExportedProgram, inputs: list[torch.Tensor]
) -> tuple[dict[str, bool], GraphModule]:
    module = program.module()
    recorder = _FiniteRecorder(module)
    with torch.no_grad():
        recorder.run(*inputs)
    return recorder.finite, module


def _op_name(node: Node) -> str:
    return str(node.target) if node.op == "call_function" else node.name


def first_overflows(
    original: ExportedProgram, cast: ExportedProgram, inputs: list[torch.Tensor], limit: int = 5
) -> list[Overflow]:
    """The first ops (in graph order) where the cast program turns finite values non-finite."""
    before, _ = _finite_by_node(original, inputs)
    new_dtypes = [n.meta["val"].dtype for n in cast.graph.nodes if n.op == "placeholder"][-len(inputs) :]
    after, module = _finite_by_node(cast, [t.to(d) for t, d in zip(inputs, new_dtypes, strict=True)])
    found: list[Overflow] = []
    for node in module.graph.nodes:
        if after.get(node.name) is not False:
            continue
        if not all(after.get(arg.name, True) for arg in node.all_input_nodes):
            continue  # it only carries a non-finite value it was given
        if g.is_cast(node) and node.name not in before and node.all_input_nodes:
            # the cast back to fp16 after an op kept in fp32: that op's value does not fit fp16
            source = node.all_input_nodes[0]
            readers = [u for u in node.users if u.op == "call_function"]
            output = any(u.op == "output" for u in node.users)
            ignore = () if output else tuple(sorted({_op_name(u) for u in readers}))
            overflow = Overflow(node.name, _op_name(source), ignore, output, module_path(source))
        else:
            source = node
            overflow = Overflow(node.name, _op_name(node), (_op_name(node),), module=module_path(node))
        if before.get(source.name, True) is False:
            continue  # the original is non-finite there too
        found.append(overflow)
        if len(found) == limit:
            break
    return found
