"""What the methods that learn from data share: a weight as the matrix its consumer multiplies,
the inverse of its input Gram matrix as GPTQ and SparseGPT use it, and the error measures the
report shows (an error weighted as the data says it matters, beside the data-free one's).

The matrix view puts output channels in rows and every other axis in columns, the input
(reduction) axis innermost: a linear weight is itself, a convolution's [O, I, kh, kw] becomes
[O, kh * kw * I], so a run along the input axis (a block of scales, an n:m group) is a run of
adjacent columns. The calibration's Gram matrix, taken over the consumer's input as the weight
reshaped to [O, -1] reads it (`calibration._sums._patches`: I, kh, kw), is permuted to match.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from coreai_opt._pieces import spans
from coreai_opt.weights import Encoding, Learned, Statistics, WeightSite, decode

DAMPING = 0.01  # of the mean diagonal, added to the Gram matrix before it is inverted


@dataclass(frozen=True)
class MatrixView:
    """A weight's layout as a [rows, columns] matrix (see the module)."""

    shape: tuple[int, ...]  # the weight's
    output_axis: int
    input_axis: int

    @classmethod
    def of(cls, site: WeightSite) -> MatrixView:
        return cls(tuple(site.shape), site.output_axis, site.input_axis)

    def _moved(self, t: torch.Tensor) -> torch.Tensor:
        moved = t.movedim(self.output_axis, 0)
        inner = self.input_axis if self.input_axis > self.output_axis else self.input_axis + 1
        return moved.movedim(inner, -1)

    def matrix(self, t: torch.Tensor) -> torch.Tensor:
        """`t` (the weight's shape) as [output channels, columns]."""
        return self._moved(t).reshape(self.shape[self.output_axis], -1)

    def weight(self, matrix: torch.Tensor) -> torch.Tensor:
        """The inverse of `matrix`: back to the weight's layout."""
        moved_shape = self._moved(torch.empty(self.shape, device="meta")).shape
        inner = self.input_axis if self.input_axis > self.output_axis else self.input_axis + 1
        return matrix.reshape(moved_shape).movedim(-1, inner).movedim(0, self.output_axis)

    def columns_in_gram_order(self) -> torch.Tensor:
        """For each column of the view, its index among the Gram matrix's inputs (the weight
        reshaped to [O, -1] with the output axis moved first)."""
        count = math.prod(self.shape) // self.shape[self.output_axis]
        order = torch.arange(count).reshape(
            torch.empty(self.shape, device="meta").movedim(self.output_axis, 0).shape[1:]
        )
        inner = self.input_axis - 1 if self.input_axis > self.output_axis else self.input_axis
        return order.movedim(inner, -1).reshape(-1)


def gram_of(statistics: Statistics | None, view: MatrixView) -> torch.Tensor | None:
    """The input Gram matrix in the view's column order (float64), or None where the calibration
    has none that fits (an embedding lookup, a grouped convolution, a weight nothing reads). To be
    read, never written: where the order is the calibration's own (every linear weight), it is
    the statistics' matrix itself - a copy is 0.25 GB at a 5,632-input projection."""
    if not gram_fits(statistics, view):
        return None
    assert statistics is not None and statistics.gram is not None
    columns = math.prod(view.shape) // view.shape[view.output_axis]
    order = view.columns_in_gram_order()
    gram = statistics.gram.double()
    if torch.equal(order, torch.arange(columns)):
        return gram
    return gram[order[:, None], order[None, :]]


def gram_fits(statistics: Statistics | None, view: MatrixView) -> bool:
    """Whether `statistics` hold an input Gram matrix of the view's columns (`gram_of` gives one)."""
    if statistics is None or statistics.gram is None or statistics.rows == 0:
        return False
    columns = math.prod(view.shape) // view.shape[view.output_axis]
    return tuple(statistics.gram.shape) == (columns, columns)


def dead_inputs(gram: torch.Tensor) -> torch.Tensor:
    """The inputs that never fired on the calibration data (H_ii = 0), a mask over H's columns:
    nothing reads their columns of a weight, so a solve zeroes them in its working copy, and H^-1
    takes H_ii = 1 there."""
    return torch.diagonal(gram) == 0


def inverse_cholesky(gram: torch.Tensor, order: torch.Tensor | None = None) -> torch.Tensor:
    """The upper Cholesky factor U of H^-1 (H = the Gram matrix, damped; its columns taken in
    `order` when given), as GPTQ and SparseGPT read it: U[i, i] and U[i, i:] give column i's
    error scale and how it spreads to the columns after it. Inputs that never fire
    (`dead_inputs`) get H_ii = 1. The damping grows tenfold until H is positive definite. Each try
    factors, inverts and factors again one fresh copy of H in place, so besides `gram` one matrix
    of its size (and a transient the library takes) is alive at once: a 5,632-input down
    projection's H is 0.25 GB."""
    undamped = torch.diagonal(gram).clone() if order is None else torch.diagonal(gram)[order]
    undamped[undamped == 0] = 1.0
    mean = float(undamped.mean())
    info = torch.empty((), dtype=torch.int32, device=gram.device)
    for attempt in range(6):
        h = gram.clone() if order is None else gram[order[:, None], order[None, :]]
        torch.diagonal(h).copy_(undamped + (DAMPING * 10**attempt) * mean)  # H + damping x I
        torch.linalg.cholesky_ex(h, out=(h, info))
        if int(info) == 0:
            torch.cholesky_inverse(h, out=h)
            torch.linalg.cholesky_ex(h, upper=True, out=(h, info))
            if int(info) == 0:
                return h
        del h
    raise ValueError("the input Gram matrix stays singular after damping")


def output_snr_db(matrix: torch.Tensor, approximation: torch.Tensor, gram: torch.Tensor) -> float:
    """The consumer's output SNR on the calibration data: tr(W H W^T) / tr(dW H dW^T) in dB, in
    float64, summed over pieces of rows (`_pieces`: no weight-sized float64 products at once)."""
    signal = noise = 0.0
    for top, bottom in spans(*matrix.shape):
        w = matrix[top:bottom].double()
        error = approximation[top:bottom].double() - w
        signal += float(((w @ gram) * w).sum())
        noise += float(((error @ gram) * error).sum())
    return _db(signal, noise)


def with_output_error(
    method: str,
    encoding: Encoding,
    free: Encoding | None,
    view: MatrixView,
    matrix: torch.Tensor,
    gram: torch.Tensor,
    measured: bool = True,
) -> Encoding:
    """`encoding` with what the data did: the consumer's output SNR on the calibration data,
    beside that of `free` (the data-free encoding of the same config; None: not compared) - or
    neither, not `measured` (an estimate: two float64 products a weight nobody reads)."""
    if not measured:
        return replace(encoding, learned=Learned(method, "output", None, None))
    snr = output_snr_db(matrix, view.matrix(decode(encoding, device=gram.device)), gram)
    before = (
        None if free is None else output_snr_db(matrix, view.matrix(decode(free, device=gram.device)), gram)
    )
    return replace(encoding, learned=Learned(method, "output", snr, before))


def weighted_snr_db(
    w: torch.Tensor, approximation: torch.Tensor, importance: torch.Tensor, floor: float = 0.0
) -> float:
    """sum f w^2 / sum f (w' - w)^2 in dB, f the importance of each element plus `floor` (any
    dtypes, same shape; `importance` may be a broadcast view), widened to float64 and summed a
    piece of rows at a time (`_pieces`): no weight-sized float64 temporaries (0.5 GB each at a 1B
    model's head)."""
    if w.dim() == 0:
        w, approximation, importance = w.reshape(1), approximation.reshape(1), importance.reshape(1)
    signal = noise = 0.0
    for top, bottom in spans(w.shape[0], w.numel() // max(w.shape[0], 1)):
        f = importance[top:bottom].double() + floor
        x = w[top:bottom].double()
        signal += float((f * x**2).sum())
        noise += float((f * (approximation[top:bottom].double() - x) ** 2).sum())
    return _db(signal, noise)


def _db(signal: float, noise: float) -> float:
    if noise <= 0:
        return math.inf
    if signal <= 0:
        return -math.inf
    return 10 * math.log10(signal / noise)
