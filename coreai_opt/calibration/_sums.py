"""Running sums of a weight's input statistics: what one activation at its reader adds to them.

An activation becomes rows of input channels (a convolution's channels moved last; for the Gram
matrix of a convolution of one group, its unfolded patches), whose squares - and for the Gram
matrix, products - are summed in float64 across samples, then divided by the number of rows.
Both captures (`_one_pass`, `_layer_by_layer`) add to the same sums, so the same activations give
the same statistics bit for bit whichever of them took them. Readers whose rows are the same (a
layer's query, key and value projections) share one sums (`rows_key`), so one Gram matrix serves
them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coreai_opt.weights import Consumer, Needs, Statistics

if TYPE_CHECKING:
    import torch
    from torch.fx import Node

    from ._readers import Reader


def _rows(activation: torch.Tensor, reader: Reader) -> torch.Tensor:
    """The activation as [rows, input channels] for moments (a convolution: channels on axis 1)."""
    if reader.consumer is Consumer.CONV:
        return activation.movedim(1, -1).reshape(-1, activation.shape[1])
    return activation.reshape(-1, activation.shape[-1])


def _patches(activation: torch.Tensor, node: Node) -> torch.Tensor:
    """A 1-D or 2-D convolution's input as [positions, C_in * kernel] (groups of 1), the rows the
    weight reshaped to [C_out, C_in * kernel] multiplies."""
    import torch

    weight = node.args[1].meta["val"]  # type: ignore[union-attr]
    kernel = tuple(weight.shape[2:])
    stride, padding, dilation = (  # an argument left out takes its default: stride 1, padding 0, dilation 1
        tuple(node.args[i]) if len(node.args) > i else (default,) * len(kernel)
        for i, default in ((3, 1), (4, 0), (5, 1))
    )  # type: ignore[arg-type]
    x = activation if len(kernel) == 2 else activation.unsqueeze(-1)
    if len(kernel) == 1:
        kernel, stride, padding, dilation = (*kernel, 1), (*stride, 1), (*padding, 0), (*dilation, 1)
    unfolded = torch.nn.functional.unfold(x, kernel, dilation=dilation, padding=padding, stride=stride)
    return unfolded.transpose(1, 2).reshape(-1, unfolded.shape[1])


_ROW_VIEWS = ("view", "reshape", "_unsafe_view")


def rows_key(reader: Reader) -> tuple[str, object]:
    """What identifies the rows `reader` adds: ("rows", its activation's source), looked through
    the views that keep the last axis (every reshape to [rows, channels] of them is the same), for
    a reader that takes rows of channels last; ("reader", the reader's own node) for a convolution
    or a lookup - never equal to a rows key, though a linear layer may read a lookup's output."""
    from torch.fx import Node

    value = reader.node.args[reader.activation] if reader.activation is not None else None
    if reader.consumer is Consumer.CONV or not isinstance(value, Node):
        return "reader", reader.node
    while value.op == "call_function" and getattr(value.target, "__name__", "").split(".")[0] in _ROW_VIEWS:
        source = value.args[0]
        axis = _last_axis(source) if isinstance(source, Node) else None
        if axis is None or axis != _last_axis(value):
            break
        value = source
    return "rows", value


def _last_axis(node: Node) -> int | None:
    value = node.meta.get("val")
    shape = getattr(value, "shape", None)
    return int(shape[-1]) if shape else None


class Sums:
    """Running sums of one weight's statistics."""

    def __init__(self) -> None:
        self.rows = 0
        self.moments: torch.Tensor | None = None
        self.gram: torch.Tensor | None = None

    def add(self, activation: torch.Tensor, reader: Reader, needs: Needs) -> None:
        if needs is Needs.INPUT_GRAM and reader.consumer is Consumer.CONV:
            groups = reader.node.args[8] if len(reader.node.args) > 8 else 1
            rows = (
                _patches(activation.float(), reader.node)
                if groups == 1
                else _rows(activation.float(), reader)
            )
        else:
            rows = _rows(activation.float(), reader)
        self.rows += rows.shape[0]
        squares = (rows.double() ** 2).sum(0)
        self.moments = squares if self.moments is None else self.moments.add_(squares)
        if needs is Needs.INPUT_GRAM:
            gram = (rows.T @ rows).double()  # float32 products, float64 sums across batches
            self.gram = gram if self.gram is None else self.gram.add_(gram)

    def mean(self) -> Statistics:
        """The sums divided by their rows, in place (a Gram matrix is not copied; the sums are
        spent)."""
        rows = max(self.rows, 1)
        return Statistics(
            self.rows,
            moments=None if self.moments is None else self.moments.div_(rows),
            gram=None if self.gram is None else self.gram.div_(rows),
        )
