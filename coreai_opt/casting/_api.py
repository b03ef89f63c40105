"""The public passes: they rewrite an ExportedProgram in place and can say what they changed."""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from . import _graph as g
from ._cleanup import cleanup
from ._fp16 import FP16Pass
from ._int16 import INT16Pass, anchor_views
from ._program import sync_output_names, user_inputs, user_outputs
from ._report import CastReport, IOChange
from ._target import CastTarget


def _io_dtypes(ep: ExportedProgram) -> list[tuple[str, str, str]]:
    rows = [(n.name, "input", str(g.dtype_of(n)).removeprefix("torch.")) for n in user_inputs(ep)]
    for i, node in enumerate(user_outputs(ep)):
        dtype = g.dtype_of(node) if node is not None else None
        rows.append((f"output {i}" if node is None else f"output {i} ({node.name})", "output",
                     str(dtype).removeprefix("torch.")))  # fmt: skip
    return rows


def _cast_nodes(ep: ExportedProgram) -> set[Node]:
    return {node for node in ep.graph.nodes if g.is_cast(node)}


class MalformedGraphError(RuntimeError):
    """A pass left a graph that FX's lint rejects: a bug in coreopt, never the user's model."""


def _lint(ep: ExportedProgram, stage: str) -> None:
    """Every pass ends here, so a misordered or dangling graph is never returned."""
    try:
        ep.graph.lint()
    except RuntimeError as exc:
        raise MalformedGraphError(f"the {stage} left a malformed graph ({exc}); please report this") from exc


def cast_program(
    exported_program: ExportedProgram, target: CastTarget = CastTarget.BOTH, ignored_ops: g.OpSelector = None
) -> CastReport:
    """Run the passes `target` names on `exported_program` (in place) and report what changed."""
    if not isinstance(exported_program, ExportedProgram):
        raise TypeError(f"expected a torch.export.ExportedProgram, got {type(exported_program).__name__}")
    ignored = g.op_matcher(ignored_ops)
    ep = exported_program
    report = CastReport(nodes_before=len(ep.graph.nodes))
    io_before = _io_dtypes(ep)
    casts_before = _cast_nodes(ep)
    owned: set[Node] = set()
    if target in (CastTarget.FP16, CastTarget.BOTH):
        FP16Pass(ep, owned, report, ignored).run()
        _lint(ep, "fp32->fp16 pass")
        cleanup(ep.graph, owned)
        _lint(ep, "cast cleanup after the fp32->fp16 pass")
        report.passes.append("fp32->fp16")
    if target in (CastTarget.INT16, CastTarget.BOTH):
        INT16Pass(ep, owned, report, ignored).run()
        _lint(ep, "int32/int64->int16 pass")
        cleanup(ep.graph, owned)
        anchor_views(ep.graph, owned)
        _lint(ep, "cast cleanup after the int32/int64->int16 pass")
        report.passes.append("int32/int64->int16")
    ep.graph.eliminate_dead_code()
    sync_output_names(ep)
    _lint(ep, "16-bit cast")
    ep.graph_module.recompile()
    casts_after = _cast_nodes(ep)
    report.casts_inserted = len(casts_after - casts_before)
    report.casts_removed = len(casts_before - casts_after)
    report.nodes_after = len(ep.graph.nodes)
    for (name, kind, before), (_, _, after) in zip(io_before, _io_dtypes(ep), strict=True):
        report.io.append(IOChange(name, kind, before, after))
    return report


def cast_fp32_to_fp16(exported_program: ExportedProgram, ignored_ops: g.OpSelector = None) -> ExportedProgram:
    """FP32 -> FP16 in place: state, inputs, creation ops and op outputs; overflow-prone ops stay fp32.

    `ignored_ops` (op overloads, overload packets, a collection of them, or a predicate on FX
    nodes) run in fp32 - for fp16-unsafe activations such as exp, softplus or logsumexp.
    """
    cast_program(exported_program, CastTarget.FP16, ignored_ops)
    return exported_program


def cast_int32_to_int16(exported_program: ExportedProgram) -> ExportedProgram:
    """INT32/INT64 -> INT16 in place, only for integer arithmetic on user data that never indexes."""
    cast_program(exported_program, CastTarget.INT16)
    return exported_program


def cast_to_16_bit_precision(
    exported_program: ExportedProgram, ignored_ops: g.OpSelector = None
) -> ExportedProgram:
    """Both passes in place: FP32 -> FP16, then INT32/INT64 -> INT16."""
    cast_program(exported_program, CastTarget.BOTH, ignored_ops)
    return exported_program


def new_input_dtypes(ep: ExportedProgram) -> list[torch.dtype | None]:
    """The dtypes the (cast) program now expects for its user inputs, in order."""
    return [g.dtype_of(node) for node in user_inputs(ep)]
