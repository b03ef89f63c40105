"""The Fisher information's diagonal, E[(dL/dw)^2] per weight element, from a backward pass taken a
segment of the program at a time.

A backward pass of the whole program holds every activation autograd saves for it, and squares
summed for every weight at once are 4-8 bytes a parameter beside the model: more than a billion-
parameter model's fp16 bytes. So the graph is cut where the least differentiable data crosses
(between a decoder's blocks: the residual stream). A forward pass per sample keeps only the values
that cross a cut; then the backward runs segment by segment from the output: each segment is
evaluated again, sample by sample, from the values kept at its start, with its weights as leaves,
and the cotangents of its outputs are pulled back to its inputs and its weights. A weight's
squares are complete once its segment is done (a weight read in several segments joins them into
one), so each is handed over then, and the segment's memory goes back before the next.

The chain rule and its operands are those of one whole backward pass (with exact gradients; fast
ones round product operands to bfloat16, below); only the order in which two segments' cotangents
of one value add up can differ. A program with a single segment (one small enough that cutting
saves nothing it needs, or nothing to cut) is one whole backward pass. On the CPU, 16-bit products
are taken in float32 (`_products`: PyTorch's fp16 kernels are 25-50x slower for a gradient) - or,
with fast gradients (a CPU with bfloat16 instructions, exact ones not asked for), the weights read
only as a product's matrix are held in bfloat16 for the pass and their products taken there
(`_products._Narrowed`, 3-5x float32's speed; each weight's squares within about 1% of the exact
ones in norm on the test models) - and a segment's weights, mapped from the model file, leave the
resident set once the pass is done with them for now (`_memory.page_out_mapped`), as the
layer-by-layer passes that read each weight once never hold them.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from coreai_opt._aten import state_only
from coreai_opt._memory import page_out_mapped, release_clean_mapped, trim_heap
from coreai_opt.weights import Statistics

from ._graph import attribute, call, state_value

if TYPE_CHECKING:
    import torch
    from torch.fx import GraphModule, Node

Loss = Callable[[Any, tuple[Any, ...]], tuple["torch.Tensor", int]]

# a cut is placed where the differentiable bytes crossing it are at most this much over the least
_CUT_SLACK = 1.001
# a pass whose squares and one sample's values come to no more than this is one segment: cutting
# saves memory it does not need, at the price of a second forward pass (a third more time). The
# room a large model's pass has beside its weights (issue 41: fp16 bytes + 2 GiB at 1.1B).
WHOLE_PASS_BYTES = 2 << 30


@dataclass
class _Segment:
    nodes: list[Node]  # the computing nodes, in graph order
    inputs: list[Node] = field(default_factory=list)  # kept values from earlier segments it reads
    outputs: list[Node] = field(default_factory=list)  # its values that later segments read
    leaves: list[str] = field(default_factory=list)  # weights it reads whole: their gradients here
    lookups: list[tuple[str, Node]] = field(default_factory=list)  # row lookups whose rows it adds
    weights: list[str] = field(default_factory=list)  # the weights complete once it is done


@dataclass
class _Sample:
    """One sample's run through a segment: its values, and the tensors gradients are asked of."""

    env: dict[Node, Any]
    pulled: list[Node]  # differentiable inputs from earlier segments (made leaves)
    looked: list[tuple[str, Node]]  # row lookups whose outputs were made leaves
    counted: int = 0  # the rows the loss counted (the last segment)


class SegmentedBackward:
    """One Fisher pass over `gm` for the weights `names` (see the module).

    A weight looked up by row (an embedding) is never differentiated through its lookup: that
    gradient lies on the rows of the sample's ids, so it is taken on those rows alone (a dense
    gradient of a 49k-row vocabulary per sample was a third of a small model's pass). Where the
    weight is also read whole (the output head it is tied to), the whole read's gradient on those
    rows is kept apart, and the lookup's step - in the same segment or an earlier one - adds the
    two there before squaring."""

    def __init__(
        self, gm: GraphModule, names: Sequence[str], *, fast: bool = False, progress: Any = None
    ) -> None:
        graph = gm.graph
        self.gm, self.progress = gm, progress  # progress(done, total, label): a sample, in one segment
        self.state = state_only(graph)
        nodes = list(graph.nodes)
        self.output = next(n for n in nodes if n.op == "output")
        self.placeholders = [n for n in nodes if n.op == "placeholder"]
        compute = [n for n in nodes if n.op not in ("placeholder", "output") and n not in self.state]
        position = {node: index for index, node in enumerate(compute)}
        reads, lookups = _weight_reads(nodes, self.state, set(names), position)
        self.unread = [name for name in names if name not in reads and name not in lookups]
        self.differentiable = _differentiable(nodes, set(reads) | set(lookups))
        cost = _crossing_bytes(self.placeholders + compute, position, self.differentiable, self.output)
        sizes = {name: self._weight(name).numel() for name in {*reads, *lookups}}
        every = {name: sorted({*reads.get(name, ()), *(position[n] for n in lookups.get(name, ()))})
                 for name in sizes}  # fmt: skip
        whole = 4 * sum(sizes.values()) + sum(_bytes(node) or 0 for node in compute)
        cuts = (
            []
            if whole <= WHOLE_PASS_BYTES
            else _joined(_cuts(cost, every, sizes), _spans(reads, lookups, position))
        )
        self.segments, self.lookup_nodes = _segments(
            compute, position, cuts, reads, lookups, self.placeholders, self.output
        )
        self.split = {name for name in self.lookup_nodes if name in reads}  # read whole and looked up apart
        # fast: weights read whole only as a matrix of mm / addmm (through views) held in bfloat16
        looked_up = {node for found in lookups.values() for node in found}  # they read the weight as it is
        self.narrowed = _narrowable(nodes, self.state, set(reads), looked_up, gm) if fast else set()

    def run(self, samples: Sequence[tuple[Any, ...]], loss: Loss) -> Iterator[tuple[str, Statistics]]:
        """Each weight's mean squared gradient over `samples`, a segment's weights at a time from
        the output back; `loss(output, inputs)` gives a sample's loss and the rows it counts."""
        import torch

        cut = len(self.segments) > 1  # a large program: its memory is what the segments are for
        kept = self._forward(samples) if cut else {}
        cotangents: dict[Node, dict[int, Any]] = {}
        totals: dict[str, torch.Tensor] = {}
        rows_of: dict[str, dict[int, torch.Tensor]] = {}  # a split weight's whole-read gradient on its rows
        rows = 0
        for index in reversed(range(len(self.segments))):
            segment = self.segments[index]
            for node in segment.outputs:  # every segment that read them is done
                kept.pop(node, None)
            for name in [*segment.leaves, *(name for name, _ in segment.lookups)]:
                if name not in totals:
                    weight = self._weight(name)
                    totals[name] = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            at: list[Any] = [0, ()]  # the sample the backward pass is on: its index and inputs
            leaves = {name: self._leaf(name, at, totals, rows_of) for name in segment.leaves}
            self._release_narrowed(segment)
            last = index == len(self.segments) - 1
            for k, inputs in enumerate(samples):  # one sample's values at a time, gone after it
                if self.progress is not None and not cut:  # cut: each segment's weights report as they finish
                    self.progress(k + 1, len(samples), "gradients")
                at[:] = [k, inputs]
                done = self._recompute(segment, last, k, inputs, kept, leaves, loss)
                self._pull_back(segment, done, k, inputs, cotangents, leaves, totals, rows_of)
                rows += done.counted
                del done
                if cut:  # its freed values back to the system: the heap would keep its high-water mark
                    trim_heap()
            for node in segment.outputs:
                cotangents.pop(node, None)
            del leaves
            if cut:
                self._page_out()  # this segment's weights: read again by nothing but a later pass
            for name in segment.weights:
                yield name, Statistics(rows, gradient_squares=totals.pop(name).div_(len(samples)))
        for name in self.unread:
            weight = self._weight(name)
            yield name, Statistics(rows, gradient_squares=torch.zeros(weight.shape, device=weight.device))

    def _forward(self, samples: Sequence[tuple[Any, ...]]) -> dict[Node, list[Any]]:
        """Every sample's values that a later segment reads (the last segment is not run), a
        segment at a time: its weights' file pages leave the resident set once all samples went
        through it (`_memory.page_out_mapped`), to be read again by its own backward step only."""
        import torch

        kept: dict[Node, list[Any]] = {node: [] for s in self.segments[:-1] for node in s.outputs}
        with torch.no_grad():
            for segment in self.segments[:-1]:
                fixed: dict[Node, Any] = {}
                for k, inputs in enumerate(samples):
                    env = {node: self._input(node, k, inputs, kept) for node in segment.inputs}
                    for node in segment.nodes:
                        env[node] = self._evaluate(node, env, fixed, {})
                    for node in segment.outputs:
                        kept[node].append(env[node])
                    del env
                    trim_heap()
                del fixed
                self._page_out()
        return kept

    def _release_narrowed(self, segment: _Segment) -> None:
        """The file pages of the segment's weights held in bfloat16 for the pass: until a later
        step reads them again, nothing reads their own values (a row lookup reads a few pages back
        from the page cache), so they leave the resident set (SmolLM2-135M's 0.5 GB)."""
        narrowed = [self._weight(name) for name in segment.leaves if name in self.narrowed]
        release_clean_mapped([t.data_ptr() for t in narrowed if t.device.type == "cpu" and t.numel()])

    def _input(self, node: Node, k: int, inputs: tuple[Any, ...], kept: dict[Node, list[Any]]) -> Any:
        return self._placeholder(node, inputs) if node.op == "placeholder" else kept[node][k]

    def _page_out(self) -> None:
        page_out_mapped([t.data_ptr() for t in (*self.gm.parameters(), *self.gm.buffers()) if t.numel()])

    def _recompute(
        self, segment: _Segment, last: bool, k: int, inputs: tuple[Any, ...], kept: dict[Node, list[Any]],
        leaves: dict[str, Any], loss: Loss,
    ) -> _Sample:  # fmt: skip
        """Sample `k` through `segment` again, recording what gradients flow to: its differentiable
        inputs, its whole-read weights (`leaves`), its lookups' outputs; for the last, the loss."""
        import torch
        from torch.fx.node import map_arg

        done = _Sample({}, [], [])
        for node in segment.inputs:
            value = self._input(node, k, inputs, kept)
            if node in self.differentiable and isinstance(value, torch.Tensor) and value.is_floating_point():
                value = value.detach().requires_grad_(True)
                done.pulled.append(node)
            done.env[node] = value
        looked = dict((node, name) for name, node in segment.lookups)
        fixed: dict[Node, Any] = {}
        with torch.enable_grad():
            for node in segment.nodes:
                if node in looked:  # from the weight as it is (not its leaf): its rows' gradient apart
                    value = self._evaluate(node, done.env, {}, {}).detach().requires_grad_(True)
                    done.looked.append((looked[node], node))
                else:
                    value = self._evaluate(node, done.env, fixed, leaves)
                done.env[node] = value
            if last:
                output = map_arg(self.output.args[0], lambda n: self._value(n, done.env, fixed, leaves))
                root, done.counted = loss(output, inputs)
                done.env[self.output] = root
        return done

    def _leaf(
        self, name: str, at: list[Any], totals: dict[str, Any], rows_of: dict[str, dict[int, Any]]
    ) -> torch.Tensor:
        """The weight as a leaf whose gradient is squared into `totals` the moment the backward
        pass has it, and dropped: a segment's gradients never all live at once."""
        import torch

        leaf = self._weight(name).detach()
        if name in self.narrowed:
            leaf = leaf.to(torch.bfloat16)
        leaf.requires_grad_(True)

        def squared(tensor: torch.Tensor) -> None:
            grad, tensor.grad = tensor.grad, None
            if grad is None:
                return
            if name in self.split:  # its lookup's rows are squared once that gradient is added
                k, inputs = at
                rows = self._rows(name, inputs)
                rows_of.setdefault(name, {})[k] = grad[rows].float()
                grad[rows] = 0
            _add_squares(totals[name], grad)

        leaf.register_post_accumulate_grad_hook(squared)
        return leaf

    def _pull_back(
        self, segment: _Segment, done: _Sample, k: int, inputs: tuple[Any, ...],
        cotangents: dict[Node, dict[int, Any]], leaves: dict[str, Any], totals: dict[str, Any],
        rows_of: dict[str, dict[int, Any]],
    ) -> None:  # fmt: skip
        """The cotangents of the sample's segment outputs (the loss, for the last) pulled back: to
        its inputs (added up there for the segments before), to its weights (squared into
        `totals` by their leaves' hooks), and through its lookups onto their rows."""
        import torch

        if self.output in done.env:
            pairs = [(done.env[self.output], None)]
        else:
            pairs = [(done.env[node], cotangents[node][k]) for node in segment.outputs
                     if k in cotangents.get(node, {})]  # fmt: skip
        pairs = [(root, grad) for root, grad in pairs if root.requires_grad]
        ends = [done.env[node] for node in done.pulled] + [done.env[node] for _, node in done.looked]
        if pairs:  # else no gradient reaches this sample here: its whole-read rows are still squared
            torch.autograd.backward(
                [r for r, _ in pairs], [g for _, g in pairs], inputs=ends + list(leaves.values())
            )
        grads = [end.grad for end in ends]
        for node in done.pulled:
            grad = grads.pop(0)
            if grad is not None:
                held = cotangents.setdefault(node, {})
                held[k] = grad if k not in held else held[k] + grad
        self._square_lookups(done, grads, inputs, k, totals, rows_of)

    def _square_lookups(
        self, done: _Sample, grads: list[Any], inputs: tuple[Any, ...], k: int, totals: dict[str, Any],
        rows_of: dict[str, dict[int, Any]],
    ) -> None:  # fmt: skip
        """Each looked-up weight's gradient on the rows of the sample's ids (the lookup's backward:
        each position's cotangent added to its id's row, none to a padding row), plus what its
        whole read left on those rows, squared into `totals`."""
        import torch

        for name in dict.fromkeys(name for name, _ in done.looked):
            pieces = [(node, grad) for (looked, node), grad in zip(done.looked, grads, strict=True)
                      if looked == name and grad is not None]  # fmt: skip
            if not pieces and name not in rows_of:
                continue
            rows, inverse = torch.unique(self._ids(name, inputs), return_inverse=True)
            summed = torch.zeros(
                rows.numel(), totals[name].shape[-1], dtype=torch.float32, device=rows.device
            )
            start = 0
            for node in self.lookup_nodes[name]:
                count = self._placeholder(node.args[1], inputs).numel()
                grad = next((g for n, g in pieces if n is node), None)
                if grad is not None:
                    grad = grad.reshape(count, -1).float()
                    padding = node.args[2] if len(node.args) > 2 else -1
                    if isinstance(padding, int) and padding >= 0:
                        ids = self._placeholder(node.args[1], inputs).reshape(-1, 1)
                        grad = grad.masked_fill(ids == padding, 0)
                    summed.index_add_(0, inverse[start : start + count], grad)
                start += count
            whole = rows_of.get(name, {}).pop(k, None)
            if whole is not None:
                summed += whole
            totals[name][rows] += summed.square()

    def _placeholder(self, node: Node, inputs: tuple[Any, ...]) -> Any:
        return inputs[self.placeholders.index(node)]

    def _ids(self, name: str, inputs: tuple[Any, ...]) -> torch.Tensor:
        """The ids every lookup of `name` reads for this sample, flattened in lookup order."""
        import torch

        return torch.cat(
            [self._placeholder(node.args[1], inputs).reshape(-1) for node in self.lookup_nodes[name]]
        )

    def _rows(self, name: str, inputs: tuple[Any, ...]) -> torch.Tensor:
        import torch

        return torch.unique(self._ids(name, inputs))

    def _weight(self, name: str) -> torch.Tensor:
        return attribute(self.gm, name)  # type: ignore[no-any-return]

    def _value(self, node: Node, env: dict[Node, Any], fixed: dict[Node, Any], leaves: dict[str, Any]) -> Any:
        return env[node] if node in env else state_value(self.gm, node, fixed, leaves)

    def _evaluate(
        self, node: Node, env: dict[Node, Any], fixed: dict[Node, Any], leaves: dict[str, Any]
    ) -> Any:
        from torch.fx.node import map_arg

        args = map_arg(node.args, lambda n: self._value(n, env, fixed, leaves))
        kwargs = map_arg(node.kwargs, lambda n: self._value(n, env, fixed, leaves))
        return call(self.gm, node, args, kwargs, "a segment at a time")


def _add_squares(total: torch.Tensor, grad: torch.Tensor) -> None:
    """total += grad^2 in float32, a piece of rows at a time: a 16-bit gradient widened whole
    would be two float32 copies of the weight (0.5 GB at a 1B model's head)."""
    from coreai_opt._pieces import spans

    flat_total, flat_grad = (
        total.reshape(total.shape[0] if total.dim() else 1, -1),
        grad.reshape(grad.shape[0] if grad.dim() else 1, -1),
    )
    for top, bottom in spans(flat_grad.shape[0], flat_grad.shape[1]):
        piece = flat_grad[top:bottom].float()
        flat_total[top:bottom].addcmul_(piece, piece)


def _weight_reads(
    nodes: list[Node], state: set[Node], wanted: set[str], position: dict[Node, int]
) -> tuple[dict[str, list[int]], dict[str, list[Node]]]:
    """For each wanted weight something reads: the positions of the computing nodes that read it
    whole (through weight-only nodes such as a transpose), and its row lookups - embeddings of the
    weight itself by an input's ids, whose gradient lies on those ids' rows."""
    import torch

    reads: dict[str, set[int]] = {}
    lookups: dict[str, list[Node]] = {}
    for node in nodes:
        if node.op != "get_attr" or str(node.target) not in wanted:
            continue
        name = str(node.target)
        frontier = [node]
        while frontier:
            for user in frontier.pop().users:
                if user in state:
                    frontier.append(user)
                elif user in position:
                    looks_up = (
                        user.target is torch.ops.aten.embedding.default and user.args[0] is node
                        and getattr(user.args[1], "op", None) == "placeholder"
                        and not (len(user.args) > 3 and user.args[3])  # no scale_grad_by_freq
                    )  # fmt: skip
                    if looks_up:
                        lookups.setdefault(name, []).append(user)
                    else:
                        reads.setdefault(name, set()).add(position[user])
    return {name: sorted(found) for name, found in reads.items()}, lookups


_VIEWS = ("t.default", "permute.default", "transpose.int", "view.default", "reshape.default",
          "_unsafe_view.default", "alias.default", "unsqueeze.default", "squeeze.dim", "squeeze.dims")  # fmt: skip


def _narrowable(
    nodes: list[Node], state: set[Node], whole: set[str], lookups: set[Node], gm: GraphModule
) -> set[str]:
    """The float32 and float16 weights read whole (`whole`) only as a matrix of mm or addmm,
    through views alone, besides their row `lookups`: held in bfloat16 (the lookups still read
    them as they are), their products are `_products._Narrowed` and their
    gradients come in bfloat16. Anything else a weight meets (a norm's multiply, a dequantizing
    scale) would compute in bfloat16 too, so such a weight stays as it is."""
    import torch

    products = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
    fits: dict[str, bool] = {}  # every get_attr of a name must fit
    for node in nodes:
        name = str(node.target)
        if node.op != "get_attr" or name not in whole or not fits.get(name, True):
            continue
        frontier, fit = [node], attribute(gm, name).dtype in (torch.float32, torch.float16)
        while frontier and fit:
            here = frontier.pop()
            for user in here.users:
                if user in lookups:
                    continue
                if user in state:
                    view = str(user.target).removeprefix("aten.") in _VIEWS  # not view.dtype: other bits
                    fit = fit and view and user.args[0] is here
                    frontier.append(user)
                else:
                    operands = user.args if user.target is torch.ops.aten.mm.default else user.args[1:3]
                    fit = fit and user.target in products and here in operands and user.kwargs == {}
        fits[name] = fit
    return {name for name, fit in fits.items() if fit}


def _differentiable(nodes: list[Node], weights: set[str]) -> set[Node]:
    """The nodes a gradient flows through: those that depend on a weight asked for."""
    found: set[Node] = set()
    for node in nodes:
        if (node.op == "get_attr" and str(node.target) in weights) or any(
            n in found for n in node.all_input_nodes
        ):
            found.add(node)
    return found


def _bytes(node: Node) -> int | None:
    """A tensor value's bytes from the graph's metadata; None for anything else (a tuple, or no
    record), which no cut may leave for a later segment: only a tensor's cotangent is pulled."""
    import torch

    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return int(value.numel()) * int(value.element_size())
    except (TypeError, RuntimeError):  # a symbolic size
        return None


def _crossing_bytes(
    values: list[Node], position: dict[Node, int], differentiable: set[Node], output: Node
) -> list[float]:
    """For each gap after computing node j, the bytes of differentiable values made at or before
    j and read after it (infinite where one of them is not a tensor of known size)."""
    count = len(position)
    change = [0] * (count + 1)
    opaque = [0] * (count + 1)
    for node in values:
        if node not in differentiable:
            continue
        made = position.get(node, -1)
        used = max((count if u is output else position.get(u, -1) for u in node.users), default=-1)
        if used > made:
            size = _bytes(node)
            where = opaque if size is None else change
            where[max(made, 0)] += 1 if size is None else size
            where[used] -= 1 if size is None else size
    cost: list[float] = []
    running = blocked = 0
    for j in range(count - 1):
        running += change[j]
        blocked += opaque[j]
        cost.append(float("inf") if blocked else running)
    return cost


def _cuts(cost: list[float], reads: dict[str, list[int]], sizes: dict[str, int]) -> list[int]:
    """The gaps to cut at: among those where the least differentiable data crosses, one as soon as
    the segment it closes reads as many weight elements as the largest weight. The values kept at
    the cuts grow with their number and a segment's squares with its size: this keeps both near
    the largest weight's (a decoder of 22 blocks, head apart: a cut every second block)."""
    crossing = [c for c in cost if c > 0]
    if not crossing:
        return []
    least = min(crossing) * _CUT_SLACK
    largest = max(sizes.values(), default=0)
    firsts = sorted((found[0], sizes.get(name, 0)) for name, found in reads.items())
    cuts: list[int] = []
    gathered, next_read = 0, 0
    for gap, bytes_across in enumerate(cost):
        while next_read < len(firsts) and firsts[next_read][0] <= gap:
            gathered += firsts[next_read][1]
            next_read += 1
        if 0 < bytes_across <= least and gathered and gathered >= largest:
            cuts.append(gap)
            gathered = 0
    return cuts


def _spans(
    reads: dict[str, list[int]], lookups: dict[str, list[Node]], position: dict[Node, int]
) -> list[list[int]]:
    """The reads that one segment must see together: each weight's whole reads (its squares are
    those of the sum of their gradients), its lookups, and both where a lookup comes after a
    whole read (the pass must reach the whole read first to keep its rows apart)."""
    spans = []
    for name in {*reads, *lookups}:
        whole = reads.get(name, [])
        looked = sorted(position[node] for node in lookups.get(name, ()))
        if whole and looked and looked[-1] >= whole[0]:
            spans.append(sorted(whole + looked))
        else:
            spans.extend(span for span in (whole, looked) if span)
    return spans


def _joined(cuts: list[int], spans: list[list[int]]) -> list[int]:
    """The cuts without those inside a span of reads that one segment must see together."""
    changed = True
    while changed:
        changed = False
        for found in spans:
            first, last = bisect_left(cuts, found[0]), bisect_left(cuts, found[-1])
            if first < last:
                del cuts[first:last]
                changed = True
    return cuts


def _segments(
    compute: list[Node], position: dict[Node, int], cuts: list[int], reads: dict[str, list[int]],
    lookups: dict[str, list[Node]], placeholders: list[Node], output: Node,
) -> tuple[list[_Segment], dict[str, list[Node]]]:  # fmt: skip
    """The segments between the cuts, what each reads from earlier ones and keeps for later ones
    and where each weight's gradients are taken; and every weight's lookups, taken on their rows
    (`_spans` puts a lookup after a whole read into the whole read's segment: never later)."""
    bounds = [0, *(gap + 1 for gap in cuts), len(compute)]
    segments = [_Segment(compute[a:b]) for a, b in pairwise(bounds)]
    last = len(segments) - 1

    def segment_of(node: Node) -> int:
        return last if node is output else bisect_left(cuts, position[node])

    apart: dict[str, list[Node]] = {}
    first = {name: min([*reads.get(name, ()), *(position[n] for n in lookups.get(name, ()))])
             for name in {*reads, *lookups}}  # fmt: skip
    for name in sorted(first, key=first.__getitem__):
        whole = bisect_left(cuts, reads[name][0]) if name in reads else None
        looked = segment_of(lookups[name][0]) if name in lookups else None
        if looked is not None:
            apart[name] = lookups[name]
            segments[looked].lookups.extend((name, node) for node in lookups[name])
        if whole is not None:
            segments[whole].leaves.append(name)
        segments[min(s for s in (whole, looked) if s is not None)].weights.append(name)
    for node in placeholders + compute:
        made = segment_of(node) if node in position else -1
        readers = sorted({segment_of(user) for user in node.users if user is output or user in position})
        later = [s for s in readers if s > made]
        for s in later:
            segments[s].inputs.append(node)
        if later and made >= 0:
            segments[made].outputs.append(node)
    return segments, apart
