"""Helpers for the casting tests: export small models the way users do, and watch real dtypes."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Interpreter, Node

from coreai_opt.casting import new_input_dtypes
from coreai_opt.casting._dtypes import holds
from coreai_opt.casting._graph import cast_target_dtype, dtype_of, is_cast, is_pure_cast


def export(model: torch.nn.Module, *inputs: torch.Tensor) -> torch.export.ExportedProgram:
    import coreai_torch

    with torch.no_grad():
        program = torch.export.export(model.eval(), inputs)
    return program.run_decompositions(coreai_torch.get_decomp_table())


def node(ep: torch.export.ExportedProgram, name: str) -> Node:
    return next(n for n in ep.graph.nodes if n.name == name)


def nodes_of(ep: torch.export.ExportedProgram, target: Any) -> list[Node]:
    """call_function nodes of an op overload, or of every overload of a packet."""
    return [
        n
        for n in ep.graph.nodes
        if n.op == "call_function"
        and (n.target == target or getattr(n.target, "overloadpacket", None) is target)
    ]


def run_cast(ep: torch.export.ExportedProgram, *inputs: torch.Tensor) -> Any:
    """Run a cast program on inputs converted to the dtypes it now expects."""
    converted = [t.to(d) for t, d in zip(inputs, new_input_dtypes(ep), strict=True)]
    with torch.no_grad():
        return ep.module()(*converted)


class _DtypeRecorder(Interpreter):
    def __init__(self, module: torch.fx.GraphModule) -> None:
        super().__init__(module)
        self.seen: dict[str, Any] = {}

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            self.seen[n.name] = result.dtype
        elif isinstance(result, (tuple, list)):
            self.seen[n.name] = tuple(getattr(r, "dtype", None) for r in result)
        return result


def meta_mismatches(ep: torch.export.ExportedProgram, *inputs: torch.Tensor) -> list[str]:
    """Nodes whose recorded meta dtype differs from the dtype they really produce when run."""
    state = {**ep.state_dict, **ep.constants}
    converted = [t.to(d) for t, d in zip(inputs, new_input_dtypes(ep), strict=True)]
    by_name = iter(converted)
    args = []
    for spec in ep.graph_signature.input_specs:
        args.append(next(by_name) if spec.kind.name == "USER_INPUT" else state[spec.target])
    recorder = _DtypeRecorder(ep.graph_module)
    with torch.no_grad():
        recorder.run(*args)
    problems = []
    for n in ep.graph.nodes:
        if n.name not in recorder.seen:
            continue
        val = n.meta.get("val")
        expected = (
            val.dtype
            if isinstance(val, torch.Tensor)
            else tuple(getattr(v, "dtype", None) for v in val)
            if isinstance(val, (tuple, list))
            else None
        )
        if expected is not None and expected != recorder.seen[n.name]:
            problems.append(f"{n.name}: meta {expected}, runs as {recorder.seen[n.name]}")
    return problems


def foldable_cast_pairs(ep: torch.export.ExportedProgram) -> list[str]:
    """Consecutive pure casts that a complete cleanup folds: same-dtype casts and widening round trips."""
    found = []
    for n in ep.graph.nodes:
        if not is_pure_cast(n):
            continue
        source = n.args[0]
        target = cast_target_dtype(n)
        if dtype_of(source) == target and target != torch.int16:  # int16 anchors are deliberate
            found.append(f"{n.name}: cast to the dtype it already has")
        if isinstance(source, Node) and is_pure_cast(source):
            start = dtype_of(source.args[0])
            middle = cast_target_dtype(source)
            if start is not None and middle is not None and holds(middle, start):
                found.append(f"{source.name} -> {n.name}: lossless chain")
    return found


def cast_count(ep: torch.export.ExportedProgram) -> int:
    return sum(is_cast(n) for n in ep.graph.nodes)
