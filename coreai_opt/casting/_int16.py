"""INT32/INT64 -> INT16, conservatively: only integer arithmetic on user data, never indices."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from coreai_opt._aten import ARITHMETIC, VIEW_PACKETS, index_arguments

from . import _dtypes as dt
from . import _graph as g
from ._program import user_inputs
from ._report import CastReport, OpChange, OpOutcome

aten = torch.ops.aten


def _is_int_node(node: Node) -> bool:
    return dt.is_int(g.dtype_of(node))


class INT16Pass:
    """Narrows int32/int64 integer arithmetic on user data to int16, and nothing it cannot prove safe.

    Algorithm:
    1. Mark the nodes reachable from a user input (the rest folds to constants on conversion).
    2. Mark as unsafe every integer node whose value flows into an index argument (gather,
       embedding, index, scatter...): narrowing those could wrap an index.
    3. Seed with add/sub/mul of two integer tensors on user data, off index paths, and grow the
       castable set along integer edges (inputs, and users of integer nodes) through allowed nodes.
    4. Rewrite: castable wide-int user inputs become int16; each castable op takes int16 operands
       (a cast in front of wide ones), is re-run on fake tensors for its exact output dtype, and
       an int16 result is followed by a cast to int32 for the ops that read it. Integer ops left
       wide are reported as kept for index safety or as constant-foldable.
    """

    def __init__(
        self, ep: ExportedProgram, owned: set[Node], report: CastReport, ignored: Callable[[Node], bool]
    ) -> None:
        self.ep = ep
        self.graph = ep.graph
        self.owned = owned
        self.report = report
        self.ignored = ignored
        self.inputs = user_inputs(ep)
        self.reachable = self._user_reachable()
        self.unsafe = self._leads_to_index()
        self.castable = self._castable()
        self.casts = g.CastInserter(self.graph, owned)

    # ----- analysis ----------------------------------------------------------------------------

    def _user_reachable(self) -> set[Node]:
        """Nodes that depend on a user input; the rest folds to constants in the converter."""
        seen: set[Node] = set(self.inputs)
        queue = deque(self.inputs)
        while queue:
            for user in queue.popleft().users:
                if user not in seen:
                    seen.add(user)
                    queue.append(user)
        return seen

    def _leads_to_index(self) -> set[Node]:
        """Integer nodes whose values end up as an index argument (narrowing them could wrap)."""
        unsafe: set[Node] = set()
        queue: deque[Node] = deque()
        for node in self.graph.nodes:
            if node.op == "call_function":
                queue.extend(a for a in index_arguments(node) if _is_int_node(a))
        while queue:
            node = queue.popleft()
            if node in unsafe:
                continue
            unsafe.add(node)
            queue.extend(a for a in node.all_input_nodes if _is_int_node(a) and a not in unsafe)
        return unsafe

    def _castable(self) -> set[Node]:
        """Nodes joined by integer edges to an add/mul/sub of two tensors, on user data, off index paths."""

        def allowed(node: Node) -> bool:
            return (
                node in self.reachable
                and node not in self.unsafe
                and not (node.op == "call_function" and self.ignored(node))
                and node.op in ("placeholder", "call_function")
            )

        castable: set[Node] = set()
        seeds = [
            node
            for node in self.graph.nodes
            if node.op == "call_function"
            and g.packet(node) in ARITHMETIC
            and sum(isinstance(a, Node) and _is_int_node(a) for a in node.args[:2]) == 2
            and g.dtype_of(node) in (*dt.WIDE_INTS, torch.int16)
            and allowed(node)
        ]
        queue = deque(seeds)
        castable.update(seeds)
        while queue:
            node = queue.popleft()
            neighbours = [a for a in node.all_input_nodes if _is_int_node(a)]
            if _is_int_node(node):
                neighbours += list(node.users)
            for other in neighbours:
                if other not in castable and allowed(other) and not g.is_getitem(other):
                    castable.add(other)
                    queue.append(other)
        return castable

    # ----- rewrite ------------------------------------------------------------------------------

    def run(self) -> None:
        for node in self.inputs:
            if node in self.castable and g.dtype_of(node) in dt.WIDE_INTS:
                node.meta["val"] = g.retyped(node.meta["val"], torch.int16)
        for node in list(self.graph.nodes):
            if node.op != "call_function":
                continue
            if node.target == g.ASSERT_METADATA:
                g.refresh_assert(node)
            elif g.is_getitem(node):
                g.refresh_getitem(node)
            elif g.is_cast(node):
                continue
            elif node in self.castable:
                self._narrow(node)
            elif _is_int_node(node) and any(_is_int_node(a) for a in node.all_input_nodes):
                if node in self.unsafe:
                    self._record(node, OpOutcome.KEPT_INDEX_SAFETY)
                elif node not in self.reachable:
                    self._record(node, OpOutcome.CONSTANT_FOLDABLE)

    def _narrow(self, node: Node) -> None:
        def downcast(arg: Node) -> Node:
            if g.dtype_of(arg) not in dt.WIDE_INTS or arg in self.unsafe:
                return arg
            if arg.op == "placeholder" and arg not in self.castable:
                return arg
            return self.casts.before(arg, torch.int16, node)

        g.map_node_args(node, downcast)
        if not any(g.dtype_of(a) == torch.int16 for a in node.all_input_nodes):
            return
        node.meta["val"] = g.fake_run(node)  # exact: e.g. sum of int16 gives int64
        if g.dtype_of(node) == torch.int16:
            self.casts.after(node, torch.int32)
            self._record(node, OpOutcome.INT16)

    def _record(self, node: Node, outcome: OpOutcome) -> None:
        self.report.ops.append(OpChange.of(node, outcome))


def anchor_views(graph: torch.fx.Graph, owned: set[Node]) -> None:
    """An explicit int16 cast in front of view-like ops on int16 data, so converters keep the dtype."""
    for node in list(graph.nodes):
        if node.op != "call_function" or g.packet(node) not in VIEW_PACKETS:
            continue
        if g.dtype_of(node) != torch.int16 or not node.args or not isinstance(node.args[0], Node):
            continue
        source = node.args[0]
        if g.dtype_of(source) != torch.int16 or (
            g.is_cast(source) and g.cast_target_dtype(source) == torch.int16
        ):
            continue
        anchor = g.insert_cast(graph, source, torch.int16, before=node)
        owned.add(anchor)
        node.replace_input_with(source, anchor)
