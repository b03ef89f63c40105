"""FP32 -> FP16: state and inputs first, then one topological walk deciding each op's precision."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from . import _dtypes as dt
from . import _graph as g
from ._program import read_state, state_slots, user_inputs, write_state
from ._report import CastReport, OpChange, OpOutcome, StateChange, StateOutcome


class FP16Pass:
    """Casts as much as is safe to fp16; ops that cannot run in fp16 run in fp32 between casts.

    Algorithm:
    1. State (parameters, buffers, constants): each fp32 tensor whose finite values fit fp16 is
       stored as fp16; a tensor with a larger finite value stays fp32 and is reported.
    2. fp32 user inputs become fp16 inputs.
    3. One walk in topological order decides every op once, from its inputs' (already final)
       dtypes: an op whose float inputs are all fp16 and whose float scalars fit fp16 runs in fp16
       (scalars rounded, an fp32 output-dtype argument retargeted); otherwise - an fp32 input, an
       overflowing scalar, an op the caller ignores - it runs in fp32 with its fp16 inputs cast up
       and its output cast back down, so every edge leaving it is fp16 again. Float factories
       (`full`, `arange`, ...) get dtype fp16; floats computed from integers are cast after.
    Casts the pass inserts are recorded in `owned`, so the cleanup may fold them.
    """

    def __init__(
        self, ep: ExportedProgram, owned: set[Node], report: CastReport, ignored: Callable[[Node], bool]
    ) -> None:
        self.ep = ep
        self.graph = ep.graph
        self.owned = owned  # casts the pass made or retargeted: cleanup may fold them freely
        self.report = report
        self.ignored = ignored
        self.kept_fp32: set[Node] = set()
        self.casts = g.CastInserter(self.graph, owned)
        self.norm_statistics = _norm_statistics(self.graph)

    def run(self) -> None:
        self.convert_state()
        for node in user_inputs(self.ep):
            if g.dtype_of(node) == torch.float32:
                node.meta["val"] = g.retyped(node.meta["val"], torch.float16)
        for node in list(self.graph.nodes):
            if node.op == "call_function":
                self.visit(node)

    # ----- state -----------------------------------------------------------------------------

    def convert_state(self) -> None:
        for slot in state_slots(self.ep):
            tensor = read_state(self.ep, slot)
            if tensor is None or tensor.dtype != torch.float32:
                continue
            shape = tuple(tensor.shape)
            nbytes = tensor.numel() * tensor.element_size()
            peak = dt.tensor_max_finite(tensor)
            if peak > dt.FP16_MAX:
                self.report.state.append(
                    StateChange(slot.name, slot.kind, shape, "float32", "float32",
                                StateOutcome.KEPT_FP32_OVERFLOW, peak, nbytes, nbytes)
                )  # fmt: skip
                continue
            write_state(self.ep, slot, tensor, dt.tensor_to_fp16(tensor))
            slot.node.meta["val"] = g.retyped(slot.node.meta.get("val"), torch.float16)
            self.report.state.append(
                StateChange(slot.name, slot.kind, shape, "float32", "float16",
                            StateOutcome.TO_FP16, None, nbytes, nbytes // 2)
            )  # fmt: skip

    # ----- the walk --------------------------------------------------------------------------

    def visit(self, node: Node) -> None:
        if g.is_getitem(node):
            g.refresh_getitem(node)
            container = node.args[0]
            if container in self.kept_fp32 and g.dtype_of(node) == torch.float32:
                self._cast_back(node)
            return
        if node.target == g.ASSERT_METADATA:
            g.refresh_assert(node)
            return
        if g.is_cast(node):
            # a cast from fp16 into fp32 is a deliberate entry to fp32 (e.g. made by an earlier run)
            if g.cast_target_dtype(node) == torch.float32 and g.dtype_of(node.args[0]) != torch.float16:
                g.set_cast_target_dtype(node, torch.float16)
                self.owned.add(node)
            return
        if g.packet(node) in g.CREATION_PACKETS:
            self.visit_creation(node)
            return
        self.visit_compute(node)

    def visit_creation(self, node: Node) -> None:
        if g.dtype_of(node) != torch.float32:
            return
        if self.ignored(node):
            self._record(node, OpOutcome.KEPT_FP32_IGNORED)
            return
        args, kwargs = list(node.args), dict(node.kwargs)
        for container, keys in ((args, range(len(args))), (kwargs, list(kwargs))):
            for key in keys:
                value = container[key]  # type: ignore[index]
                if isinstance(value, float):
                    clamped = dt.scalar_to_fp16(value)
                    if clamped is None:
                        self._record(node, OpOutcome.KEPT_FP32_OVERFLOW, f"scalar {value:g}")
                        return
                    container[key] = clamped  # type: ignore[index]
        node.args = tuple(args)
        node.kwargs = {**kwargs, "dtype": torch.float16}
        g.retype_outputs(node, torch.float16, (torch.float32,))
        self._record(node, OpOutcome.FP16)

    def visit_compute(self, node: Node) -> None:
        float_inputs = [a for a in node.all_input_nodes if dt.is_float(g.dtype_of(a))]
        scalars = [v for v in (*node.args, *node.kwargs.values()) if isinstance(v, float)]
        if not float_inputs:
            if g.dtype_of(node) == torch.float32:  # float from integers: fp32 by torch's default dtype
                self._cast_back(node)
                self._record(node, OpOutcome.FP16, "computed from integers, cast after")
            return
        reason = None
        if self.ignored(node):
            outcome = OpOutcome.KEPT_FP32_IGNORED
        elif node in self.norm_statistics:
            outcome = OpOutcome.KEPT_FP32_NORM
        elif any(g.dtype_of(a) == torch.float32 for a in float_inputs):
            outcome = OpOutcome.KEPT_FP32_INPUT
        elif overflowing := [v for v in scalars if dt.scalar_overflows_fp16(v)]:
            outcome, reason = OpOutcome.KEPT_FP32_OVERFLOW, f"scalar {overflowing[0]:g}"
        else:
            self._to_fp16(node)
            self._record(node, OpOutcome.FP16)
            return
        self._keep_fp32(node)
        self._record(node, outcome, reason or "")

    def _to_fp16(self, node: Node) -> None:
        def update(value: object) -> object:
            if isinstance(value, float):
                return dt.scalar_to_fp16(value)
            if value == torch.float32:
                return torch.float16  # an output-dtype argument follows the inputs
            return value

        node.args = tuple(update(a) for a in node.args)
        node.kwargs = {k: update(v) for k, v in node.kwargs.items()}
        g.retype_outputs(node, torch.float16, (torch.float32,))

    def _keep_fp32(self, node: Node) -> None:
        def upcast(arg: Node) -> Node:
            return self.casts.before(arg, torch.float32, node) if g.dtype_of(arg) == torch.float16 else arg

        g.map_node_args(node, upcast)
        self.kept_fp32.add(node)
        inside = node in self.norm_statistics and all(u in self.norm_statistics for u in node.users)
        if g.dtype_of(node) == torch.float32 and not inside:
            self._cast_back(node)

    def _cast_back(self, node: Node) -> None:
        self.casts.after(node, torch.float16)

    def _record(self, node: Node, outcome: OpOutcome, detail: str = "") -> None:
        self.report.ops.append(OpChange.of(node, outcome, detail))


_SQUARES = ("aten.pow.Tensor_Scalar", "aten.mul.Tensor")
_REDUCTIONS = ("aten.mean.dim", "aten.sum.dim_IntList")
_ROOTS = ("aten.rsqrt.default", "aten.sqrt.default")


def _target(node: Node) -> str:
    return str(node.target) if node.op == "call_function" else ""


def _norm_statistics(graph: torch.fx.Graph) -> set[Node]:
    """The nodes of every RMS-style statistic - x*x (or x**2), its mean or sum, plus a scalar eps,
    a (reciprocal) square root - which run in fp32 as one piece: a sum of squares of activations
    that fit fp16 easily exceeds 65504 (LLaMA-family residual streams reach RMS values in the
    hundreds), while the root that leaves the chain is back in fp16's range."""
    found: set[Node] = set()
    for node in graph.nodes:
        square = _target(node) in _SQUARES and (
            node.args[1] == 2 if _target(node).startswith("aten.pow") else node.args[0] is node.args[1]
        )
        if not square or len(node.users) != 1:
            continue
        chain, current = [node], next(iter(node.users))
        if _target(current) not in _REDUCTIONS:
            continue
        chain.append(current)
        following = next(iter(current.users)) if len(current.users) == 1 else None
        if (
            following is not None
            and _target(following) == "aten.add.Tensor"
            and isinstance(following.args[1], float)
        ):
            chain.append(following)
            following = next(iter(following.users)) if len(following.users) == 1 else None
        if following is not None and _target(following) in _ROOTS:
            found.update((*chain, following))
    return found
