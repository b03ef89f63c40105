"""The program a block at a time: each block's output from the compressed program's values at its
start, against the program as given (the tuning's first stage, `compression._block_tuning`).

The graph is cut where the Fisher pass cuts it (`_fisher`: the least data that depends on the named
weights crosses - in a decoder, the residual stream after each attention and each MLP), at every
such gap that closes a piece reading one of the weights: a block is half a decoder layer. Two
streams of values run through the blocks, held for every sample at the cuts only: the program as
given (its weights as given: the targets) and as compressed (every weight as replaced so far: the
inputs). A block's loss is its outputs' squared error from the targets relative to theirs, so a
block learns to undo what the blocks before it lost, not only to copy its own float form (the
target is the float program's value there, not the float block's on the compressed input).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from coreai_opt._aten import state_only

from ._fisher import _crossing_bytes, _differentiable, _joined, _Segment, _segments, _spans, _weight_reads
from ._graph import attribute, call, state_value

if TYPE_CHECKING:
    import torch
    from torch.fx import Node

    from ._capture import ProgramCalibration

_CUT_SLACK = 1.001  # a gap is a cut where at most this much over the least data crosses


class Block:
    """One block of the program (see the module): the named weights only it reads, and its loss on
    a sample with given values of them."""

    def __init__(self, owner: BlockByBlock, segment: _Segment, weights: list[str]) -> None:
        self._owner, self._segment = owner, segment
        self.weights = weights

    def given(self, name: str) -> torch.Tensor:
        """The weight `name` as the program was given it."""
        return self._owner.calibration.state[name]

    def placed(self, leaves: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`leaves` where and as the program computes with them (its device, each weight's dtype):
        placed once, they are used as they are by every sample's `loss`."""
        owner = self._owner
        return {name: value.to(owner.calibration.device, attribute(owner.gm, name).dtype)
                for name, value in leaves.items()}  # fmt: skip

    def loss(self, leaves: Mapping[str, torch.Tensor], sample: int) -> torch.Tensor:
        """The block's relative squared error on calibration sample `sample`: its outputs, from
        the compressed program's values at its start with `leaves` (by name, differentiable) for
        its weights, against the program's as given."""
        owner = self._owner
        env = owner.evaluate(self._segment, owner.compressed, sample, self.placed(leaves))
        error = total = None
        for node in owner.targets(self._segment):
            # in float32 at least: a 16-bit residual stream's sum of squares passes float16's range
            target, value = owner.given[node][sample].float(), env[node].float()
            part, scale = (value - target).square().sum(), target.square().sum()
            error = part if error is None else error + part
            total = scale if total is None else total + scale
        assert error is not None and total is not None
        return error / total.clamp_min(1e-30)


class BlockByBlock:
    """The blocks of `calibration`'s program that read the weights `names` (see the module)."""

    def __init__(self, calibration: ProgramCalibration, names: Sequence[str]) -> None:
        self.calibration = calibration
        gm = calibration.gm
        self.gm = gm
        nodes = list(gm.graph.nodes)
        self.state = state_only(gm.graph)
        output = next(n for n in nodes if n.op == "output")
        self.placeholders = [n for n in nodes if n.op == "placeholder"]
        compute = [n for n in nodes if n.op not in ("placeholder", "output") and n not in self.state]
        position = {node: index for index, node in enumerate(compute)}
        every, looked_up = _weight_reads(nodes, self.state, set(calibration.state) | set(names), position)
        # a weight looked up by row (an embedding, a head tied to it) is left to the end-to-end stage
        whole = {name: every[name] for name in names if name in every and name not in looked_up}
        # what any weight reaches: the residual stream from the embedding on, not a rotary table
        self.differentiable = _differentiable(nodes, {*every, *looked_up})
        cost = _crossing_bytes(self.placeholders + compute, position, self.differentiable, output)
        cuts = _joined(_block_cuts(cost, whole), _spans(whole, {}, position))
        self.segments, _ = _segments(compute, position, cuts, whole, {}, self.placeholders, output)
        self.given: dict[Node, list[Any]] = {}  # every sample's values at the cut, weights as given
        self.compressed: dict[Node, list[Any]] = {}  # and as replaced so far
        for position_, node in enumerate(self.placeholders):
            values = [inputs[position_] for inputs in calibration.inputs]
            self.given[node] = self.compressed[node] = values

    def blocks(self) -> Iterator[Block]:
        """Each block that reads some of the weights, in graph order; both streams are carried past
        a block once the caller takes the next (with the block's weights as replaced by then)."""
        import torch

        # the last piece (the head) has no outputs to compare: its weights are left to the end-to-end stage
        tuned = [bool(s.leaves and self.targets(s)) for s in self.segments]
        remaining = sum(tuned)
        if not remaining:
            return
        for index, segment in enumerate(self.segments):
            with torch.no_grad():
                self._carry(segment, self.given, self._originals(segment))
            self._drop(index, self.given)  # its values at the block's start: no longer needed
            if tuned[index]:
                yield Block(self, segment, list(segment.leaves))
                remaining -= 1
            if not remaining:
                return  # nothing after the last block with weights is needed
            with torch.no_grad():
                self._carry(segment, self.compressed, {})
            self._drop(index, self.compressed)

    def targets(self, segment: _Segment) -> list[Node]:
        """The block's outputs a gradient can reach: float tensors that depend on the weights."""
        return [node for node in segment.outputs if node in self.differentiable]

    def evaluate(
        self, segment: _Segment, stream: dict[Node, list[Any]], sample: int, leaves: dict[str, Any]
    ) -> dict[Node, Any]:
        """Sample `sample` through `segment` from `stream`'s values at its start, `leaves` (by
        name) in place of those weights: every node's value."""
        from torch.fx.node import map_arg

        env: dict[Node, Any] = {node: stream[node][sample] for node in segment.inputs}
        fixed: dict[Node, Any] = {}

        def value(n: Node) -> Any:
            return env[n] if n in env else state_value(self.gm, n, fixed, leaves)

        for node in segment.nodes:
            env[node] = call(
                self.gm, node, map_arg(node.args, value), map_arg(node.kwargs, value), "a block at a time"
            )
        return env

    def _carry(self, segment: _Segment, stream: dict[Node, list[Any]], leaves: dict[str, Any]) -> None:
        """`stream` carried past `segment`: every sample's values of its outputs added."""
        outputs: dict[Node, list[Any]] = {node: [] for node in segment.outputs}
        for k in range(len(self.calibration.inputs)):
            env = self.evaluate(segment, stream, k, leaves)
            for node, kept in outputs.items():
                kept.append(env[node])
        stream.update(outputs)

    def _originals(self, segment: _Segment) -> dict[str, Any]:
        """The weights as given of every replaced weight the segment reads (the float stream)."""
        calibration = self.calibration
        read = {str(n.target) for node in segment.nodes for n in _state_inputs(node, self.state)}
        missing = sorted(name for name in read if name in calibration.released)
        if missing:
            raise RuntimeError(f"{missing[0]} was replaced without keeping the weight as given")
        return {name: calibration.state[name].to(calibration.device) for name in read
                if name in calibration.replaced and name in calibration.state}  # fmt: skip

    def _drop(self, index: int, stream: dict[Node, list[Any]]) -> None:
        """Let go of `stream`'s values that no block after `index` reads."""
        later = {node for segment in self.segments[index + 1 :] for node in segment.inputs}
        for node in [n for n in stream if n not in later]:
            del stream[node]


def _state_inputs(node: Node, state: set[Node]) -> Iterator[Node]:
    """The weights (get_attr nodes) a computing node reads, through weight-only nodes."""
    frontier = [n for n in node.all_input_nodes if n in state]
    while frontier:
        here = frontier.pop()
        if here.op == "get_attr":
            yield here
        frontier.extend(n for n in here.all_input_nodes if n in state)


def _block_cuts(cost: list[float], reads: dict[str, list[int]]) -> list[int]:
    """The gaps where the least data depending on the weights crosses, each one closing a piece
    that reads some weight first."""
    crossing = [c for c in cost if c > 0]
    if not crossing:
        return []
    least = min(crossing) * _CUT_SLACK
    firsts = sorted(found[0] for found in reads.values())
    cuts: list[int] = []
    next_read, read = 0, False
    for gap, bytes_across in enumerate(cost):
        while next_read < len(firsts) and firsts[next_read] <= gap:
            read, next_read = True, next_read + 1
        if read and 0 < bytes_across <= least:
            cuts.append(gap)
            read = False
    return cuts
