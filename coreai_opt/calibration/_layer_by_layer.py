"""Layer-by-layer statistics: the program run in segments that end at weight readers, with each
weight replaced by its compressed form once its statistics are taken.

A method that compresses weight by weight (GPTQ, SparseGPT) learns each weight from the
activations the compressed weights before it produce. So the graph is evaluated in segments
between the chosen readers (`_readers`), sample by sample within a segment, pausing at each reader
with its activation for every sample: the weight's statistics are summed there (`_sums`) and handed
to the caller, which may swap the weight for its compressed form (`ProgramCalibration.replace`)
before the run goes on from there. A final pass also lets go of each replaced weight once the
graph has read it for the last time (`_last_reads`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from coreai_opt._aten import state_only
from coreai_opt.weights import Needs, Statistics

from ._graph import call, state_value
from ._readers import Reader, first_readers
from ._sums import Sums, rows_key

if TYPE_CHECKING:
    from torch.fx import Node

    from ._capture import ProgramCalibration


class LayerByLayer:
    """The program evaluated in segments that end at weight readers, pausing at each: the caller
    takes the statistics, replaces the weight, and the run goes on with it. Within a segment the
    samples go one at a time through all of its nodes, so only values that outlive the segment
    (a reader's activation, the residual stream) are held for every sample at once - never an
    attention score matrix per sample (~4 GiB at 1.1B on 128 x 512 tokens). Each op sees the
    same operands as in a node-by-node run, so the statistics are the same bit for bit - but for
    16-bit matrix products on the CPU, taken in float32 (`_products`: the same values up to the
    order of their sums, 3-18x faster than PyTorch's fp16 kernels there)."""

    def __init__(
        self, calibration: ProgramCalibration, names: Sequence[str], needs: Needs, final: bool = False
    ) -> None:
        self.calibration = calibration
        self.gm = calibration.gm
        self.needs = needs
        self.final = final
        self.chosen = first_readers(self.gm, names, needs, calibration.state)
        self.pending: dict[Node, list[Reader]] = {}
        for reader in self.chosen.values():
            self.pending.setdefault(reader.node, []).append(reader)
        missing = [name for name in names if name not in self.chosen]
        self.unread = missing  # weights no op reads: their statistics are empty
        self.held: dict[Node, list[Any]] = {}

    def run(self) -> Iterator[tuple[str, Statistics]]:
        import torch

        graph = self.gm.graph
        state = state_only(graph)
        order = {node: index for index, node in enumerate(graph.nodes)}
        last_use: dict[Node, int] = {}
        for node in graph.nodes:
            for used in node.all_input_nodes:
                last_use[used] = order[node]
        values = self.held  # every sample's value of each node read after the segment run last
        fixed: dict[Node, Any] = {}  # state-only nodes: one value, recomputed after a replace
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        for position, node in enumerate(placeholders):
            values[node] = [inputs[position] for inputs in self.calibration.inputs]
        for name in self.unread:
            yield name, Statistics(0)
        passing = _last_reads(graph, state, order) if self.final else []
        segment: list[Node] = []
        last: tuple[object, Statistics] | None = None  # the rows summed last, and their statistics
        with torch.no_grad():
            for node in graph.nodes:
                if node.op in ("placeholder", "output") or node in state:
                    continue  # state: computed on demand from the weights as they are now
                if node in self.pending:
                    self._run_segment(segment, order[node], values, fixed, state, last_use, order)
                    segment = []
                    fixed.clear()  # views of weights the segment read: recomputed where needed
                    while passing and passing[-1][0] < order[node]:  # read for the last time: let go
                        name = passing.pop()[1]
                        if name in self.calibration.released and name in self.calibration.replaced:
                            self.calibration._let_go(name)
                    for reader in self.pending.pop(node):
                        last = self._statistics(reader, node, (values, fixed, state), last)
                        yield reader.name, last[1]
                        fixed.clear()  # the caller replaced the weight: views of it are stale
                    if not self.pending:
                        return  # every weight has its statistics: the rest of the program is not needed
                segment.append(node)

    def _statistics(
        self, reader: Reader, node: Node, operands: tuple[dict[Node, list[Any]], dict[Node, Any], set[Node]],
        last: tuple[object, Statistics] | None,
    ) -> tuple[object, Statistics]:  # fmt: skip
        """The rows `reader` adds (`rows_key`) and their statistics: those of the reader before it
        where it read the same rows of a computed value (a layer's q, k and v: computed before the
        first of them paused, never again, so no replacement since has changed them), else summed
        now. Rows computed from weights alone are recomputed after a replacement: never shared."""
        _, _, state = operands
        key = rows_key(reader)
        if last is not None and last[0] == key and key[0] == "rows" and key[1] not in state:
            return last
        sums = Sums()
        if reader.activation is not None:
            for activation in self._operand(node.args[reader.activation], *operands):
                sums.add(activation, reader, self.needs)
        return key, sums.mean()

    def _run_segment(
        self, segment: list[Node], pause: int, values: dict[Node, list[Any]], fixed: dict[Node, Any],
        state: set[Node], last_use: dict[Node, int], order: dict[Node, int],
    ) -> None:  # fmt: skip
        """Evaluate `segment` sample by sample, keeping for every sample the values read at or after
        the node at index `pause`, and dropping held values the segment read for the last time."""
        kept = [node for node in segment if last_use.get(node, -1) >= pause]
        outside = {used for node in segment for used in node.all_input_nodes if used in values}
        for node in kept:
            values[node] = []
        for k in range(len(self.calibration.inputs)):
            local: dict[Node, Any] = {}
            for node in segment:
                local[node] = self._evaluate(node, k, values, local, fixed, state)
                for used in node.all_input_nodes:
                    if used in local and last_use.get(used) == order[node] and used not in kept:
                        del local[used]
            for node in kept:
                values[node].append(local[node])
        for used in outside:
            if last_use.get(used, -1) < pause:
                del values[used]

    def _operand(
        self, arg: Any, values: dict[Node, list[Any]], fixed: dict[Node, Any], state: set[Node]
    ) -> list[Any]:
        from torch.fx import Node as FxNode

        if isinstance(arg, FxNode):
            if arg in state:
                return [state_value(self.gm, arg, fixed)] * len(self.calibration.inputs)
            return values[arg]
        return [arg] * len(self.calibration.inputs)

    def _evaluate(
        self, node: Node, k: int, values: dict[Node, list[Any]], local: dict[Node, Any], fixed: dict[Node, Any],
        state: set[Node],
    ) -> Any:  # fmt: skip
        """`node` on sample `k`: operands from this sample's segment, the held values, or state."""
        from torch.fx.node import map_arg

        def pick(n: Node) -> Any:
            if n in local:
                return local[n]
            return state_value(self.gm, n, fixed) if n in state else values[n][k]

        return call(self.gm, node, map_arg(node.args, pick), map_arg(node.kwargs, pick), "layer by layer")


def _last_reads(graph: Any, state: set[Node], order: dict[Node, int]) -> list[tuple[int, str]]:
    """(index of the last node that reads it, through weight-only nodes such as a transpose,
    name) of every weight the graph gets, the last read first (a list to pop from the end)."""
    last: dict[str, int] = {}
    for node in graph.nodes:
        if node.op != "get_attr":
            continue
        reached, frontier = -1, [node]
        while frontier:
            for user in frontier.pop().users:
                if user in state:
                    frontier.append(user)
                else:
                    reached = max(reached, order[user])
        name = str(node.target)
        last[name] = max(last.get(name, -1), reached)
    return sorted(((index, name) for name, index in last.items()), reverse=True)
