"""Where a weight lives and how it is read: the vocabulary every container and pass shares.

A container (a Core AI program, a `torch.export` program) describes each float tensor it stores
as a `Candidate`: its name, shape, element type and how each op uses it (`Use`). A tensor chosen
for compression becomes a `WeightSite`, with its output-channel axis (one scale or LUT each) and
input axis (along which blocks run); one left alone is `Skipped`, with a reason and its kind.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from coreai_opt._elements import Element


class Consumer(enum.Enum):
    """How an op reads a weight (the layouts below are the weight's as the op sees it)."""

    CONV = "conv"  # [C_out, C_in / groups, k...]: output channels on axis 0, inputs on axis 1
    LINEAR = "linear"  # [N, K] (torch's linear): output on axis 0, input on axis 1
    MATMUL = "matmul"  # the y operand [..., K, N]: output on the last axis, input on the one before
    GATHER = "gather"  # an embedding table [rows, dim]: rows are the channels, blocks along the last axis
    OTHER = "other"  # anything else: the tensor is not a weight


@dataclass(frozen=True)
class Use:
    consumer: Consumer
    op: str  # the reading op's name, for reasons
    permutation: tuple[int, ...] | None = None  # a transpose between the tensor and the op

    def axes(self, rank: int) -> tuple[int, int]:
        """(output axis, input axis) of the stored tensor."""
        if self.consumer is Consumer.MATMUL:
            out, inp = rank - 1, rank - 2
        elif self.consumer is Consumer.GATHER:
            out, inp = 0, rank - 1
        else:
            out, inp = 0, 1
        if self.permutation is not None:  # the op sees the tensor transposed
            out, inp = self.permutation[out], self.permutation[inp]
        return out, inp


@dataclass(frozen=True)
class Candidate:
    """A float tensor a container stores; `handle` is the container's own reference to it."""

    handle: Any
    name: str
    shape: tuple[int, ...]
    element: Element
    uses: tuple[Use, ...]
    tied_to: str | None = None  # another candidate holding the same tensor (stored once, with it)
    stored_bytes: int | None = None  # what it takes as stored, where not dense (a splat: one element)


@dataclass(frozen=True)
class WeightSite:
    """An eligible weight: where it is, what it is, and the axes its use implies."""

    handle: Any
    name: str
    shape: tuple[int, ...]
    element: Element
    output_axis: int  # the channel axis (one scale / LUT per channel)
    input_axis: int  # the axis blocks run along (the reduction axis of the consumer)

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return stored_nbytes(self.shape, self.element)

    def skipped(self, reason: str, kind: SkipKind) -> Skipped:
        return Skipped(self.name, self.shape, reason, kind, self.nbytes)


def stored_nbytes(shape: tuple[int, ...], element: Element) -> int:
    """Bytes a tensor of `element` values takes as it is stored now."""
    return math.ceil(math.prod(shape) * element.bits / 8)


class SkipKind(enum.Enum):
    """Why a float tensor was left alone, in a form a renderer can group by."""

    SMALL = "small"  # at or below the element-count threshold
    NOT_A_WEIGHT = "not-a-weight"  # not read as a conv/matmul/gather weight with one layout
    LAYOUT = "layout"  # a weight, but its shape does not fit the requested granularity
    NON_FINITE = "non-finite"  # a weight holding NaN or Inf: no scale, LUT or mask represents it
    OVERRIDE = "override"  # excluded by an override
    WOULD_GROW = "would-grow"  # its encoding would take more bytes than the weight does now


@dataclass(frozen=True)
class Skipped:
    name: str
    shape: tuple[int, ...]
    reason: str
    kind: SkipKind
    nbytes: int = 0  # what it keeps taking in the program, as stored
