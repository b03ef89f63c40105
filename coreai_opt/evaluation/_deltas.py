"""A trial's matrix products as the reference's plus a product of the differences, in bfloat16.

A sensitivity trial swaps one weight; every matrix product after it sees operands that differ a
little from the reference's. Its output is the reference's plus the products of the differences,
a'b' - ab = (a' - a) b' + a (b' - b), and those may be taken in bfloat16: rounding then errs by
~2^-8 of the *change* a product makes, not of its values, so a weight that moves the logits by
1e-3 is measured as finely (relative to itself) as one that moves them by 1 - while the products,
most of a trial's arithmetic, run at 3-5x float32's speed on CPUs with bfloat16 instructions
(`coreai_opt._cpu.native_bfloat16`). Taking the trial's products in bfloat16 outright would
add rounding noise of ~2^-8 of the values themselves, which swamps the least sensitive weights.
Everything but the float32 `mm` / `addmm` products runs as the program has it; a program with
in-place ops is left to exact trials (`applies`): a trial hands the reference's own tensors on
where nothing changed, and an in-place op would write them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from coreai_opt._aten import aten

if TYPE_CHECKING:
    from torch.fx import Graph, Node

_MM, _ADDMM = aten.mm.default, aten.addmm.default
_RESHAPES = frozenset({aten.view, aten.reshape, aten._unsafe_view})  # rows kept in row-major order


class DeltaProducts:
    """The reference's operands and outputs of each float32 product for one batch (`record`),
    then a trial's product read off them (`product`) once `swap` named the trial's weight."""

    def __init__(self, graph: Graph) -> None:
        from coreai_opt._aten import state_only

        nodes = list(graph.nodes)
        self.state = state_only(graph)  # computed from weights alone: the same in every batch
        self.attrs: dict[str, list[Node]] = {}
        for node in nodes:
            if node.op == "get_attr":
                self.attrs.setdefault(str(node.target), []).append(node)
        self.products = {n for n in nodes if n.op == "call_function" and n.target in (_MM, _ADDMM)}
        self.reference: dict[Node, tuple[tuple[torch.Tensor, ...], torch.Tensor]] = {}
        self.narrow: dict[Node, torch.Tensor] = {}  # bfloat16 copies of weights' operands
        self.moved: set[Node] = set()  # the swapped weight's reads and what is computed from them alone
        self.recorded = False  # whether any product was (float32): what a result reports

    @staticmethod
    def applies(graph: Graph) -> bool:
        """Whether the graph has no in-place op (see the module)."""
        schemas = (getattr(n.target, "_schema", None) for n in graph.nodes if n.op == "call_function")
        return not any(schema is not None and schema.is_mutable for schema in schemas)

    def swap(self, name: str | None) -> None:
        """A trial of weight `name` (None: of none)."""
        self.moved = set(self.attrs.get(name, [])) if name is not None else set()
        frontier = list(self.moved)
        while frontier:
            for user in frontier.pop().users:
                if user in self.state and user not in self.moved:
                    self.moved.add(user)
                    frontier.append(user)

    def clear(self) -> None:
        """A new batch: the last one's reference values let go."""
        self.reference.clear()

    def release(self) -> None:
        """The measurement done: the recorded values and the bfloat16 copies let go."""
        self.reference.clear()
        self.narrow.clear()

    def head(self, output: Node, shape: tuple[int, ...]) -> Node | None:
        """The product whose [batch * tokens, vocabulary] output the program's first output
        (logits of `shape`) is through reshapes alone: a trial leaves its change factored for the
        scorer (`Reference.against_head`). None where there is no such product."""
        node = next((n for n in torch.utils._pytree.tree_leaves(output.args[0]) if hasattr(n, "op")), None)
        while node is not None and getattr(node.target, "overloadpacket", None) in _RESHAPES:
            node = node.args[0]
        value = getattr(node, "meta", {}).get("val")
        batch, tokens, vocabulary = shape
        flat = value is not None and tuple(value.shape) == (batch * tokens, vocabulary)
        return node if flat and node in self.products else None

    def record(self, node: Node, args: tuple[Any, ...], out: Any) -> None:
        tensors = (*args, out)
        if all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in tensors):
            self.reference[node] = (tuple(args), out)
            self.recorded = True

    def product(self, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
        """The trial's value of `node` (a product the reference recorded), None for the caller to
        run it as it is (another dtype, a changed bias)."""
        found = self.factored(node, args, kwargs)
        if found is None:
            return None
        out = self.reference[node][1]  # unchanged operands: the reference's own tensor
        for i, (left, right) in enumerate(found.terms):
            term = left @ right  # then a new tensor: the reference's is never written
            out = torch.add(out, term, alpha=found.alpha) if i == 0 else out.add_(term, alpha=found.alpha)
        return out

    def factored(self, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> FactoredChange | None:
        """The trial's change to `node`'s output as bfloat16 factors; None as in `product`."""
        found = self.reference.get(node)
        if found is None or any(not isinstance(a, torch.Tensor) or a.dtype != torch.float32 for a in args):
            return None
        before = found[0]
        changed = [not self._unchanged(n, a, r) for n, a, r in zip(node.args, args, before, strict=True)]
        alpha = 1.0
        if node.target is _ADDMM:
            if changed[0]:
                return None  # a bias that moved: rare enough to run as it is
            changed, args, before = changed[1:], args[1:], before[1:]
            alpha = float(kwargs.get("alpha", 1))
        (a, b), (a_ref, b_ref) = args, before
        terms = []
        if changed[0]:
            right = b.bfloat16() if changed[1] else self._narrowed(node.args[-1], b)
            terms.append(((a - a_ref).bfloat16(), right))
        if changed[1]:
            terms.append((a_ref.bfloat16(), (b - b_ref).bfloat16()))
        return FactoredChange(terms, alpha)

    def _unchanged(self, operand: Any, value: Any, reference: Any) -> bool:
        """Computed from weights alone but not from the swapped one, or the reference's own tensor
        (a value computed before the trial's cut)."""
        if operand in self.state:
            return operand not in self.moved
        return value is reference

    def _narrowed(self, operand: Node, value: torch.Tensor) -> torch.Tensor:
        """`value` in bfloat16, kept for a constant operand (a weight's view: the same in every
        batch and trial); an activation's is taken anew."""
        if operand not in self.state:
            return value.bfloat16()
        found = self.narrow.get(operand)
        if found is None:
            found = self.narrow[operand] = value.bfloat16()
        return found


class FactoredChange:
    """A trial's change to a product's output, alpha * sum(left @ right) over bfloat16 terms,
    kept as its factors: `product` multiplies it out, the scorer the logits' a piece at a time."""

    def __init__(self, terms: list[tuple[torch.Tensor, torch.Tensor]], alpha: float) -> None:
        self.terms, self.alpha = terms, alpha

    def rows(self, index: torch.Tensor) -> FactoredChange:
        return FactoredChange([(left[index], right) for left, right in self.terms], self.alpha)

    def columns(self, columns: slice) -> torch.Tensor:
        """The change's columns, float32 (a change of at least one term)."""
        out = (self.terms[0][0] @ self.terms[0][1][:, columns]).float()
        for left, right in self.terms[1:]:
            out += left @ right[:, columns]
        return out if self.alpha == 1 else out.mul_(self.alpha)

    def at(self, index: torch.Tensor) -> torch.Tensor:
        """Row r's change at column index[r], float32."""
        out = torch.zeros(len(index))
        for left, right in self.terms:
            out += (left.float() * right[:, index].t().float()).sum(-1)
        return out * self.alpha
