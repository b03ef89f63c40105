"""Which weights a pass compresses, along which axes, and why every other float tensor is left.

A container (a Core AI program, a `torch.export` program) describes each float tensor it stores
as a `Candidate`: its name, shape, element type and how it is used. The rules here decide: a
weight is a tensor of more than `weight_num_threshold` elements that every use reads as the
weight of a convolution, a matrix product or an embedding lookup, with one layout; its output
channels (one scale or LUT each) and input axis (along which blocks run) follow from that layout.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from coreai_opt._elements import Element

from ._config import Override

if TYPE_CHECKING:
    import torch

    from ._encoded import Encoding


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


def _not_a_weight(candidate: Candidate) -> str | None:
    if candidate.tied_to is not None:
        return f"tied to {candidate.tied_to} (one tensor): stored, and compressed, with it"
    if not candidate.uses:
        return "not used by any op"
    others = sorted({u.op for u in candidate.uses if u.consumer is Consumer.OTHER})
    if others:
        return f"not a weight of conv/matmul/gather (used by {', '.join(others)})"
    rank = len(candidate.shape)
    layouts = {u.axes(rank) for u in candidate.uses}
    if len(layouts) > 1:
        ops = sorted({u.op for u in candidate.uses})
        return f"read with different layouts by {', '.join(ops)}: no one channel axis"
    return None


def select_sites(
    candidates: Sequence[Candidate], threshold: int, config_for: Callable[[str], Any]
) -> tuple[list[tuple[WeightSite, Any]], list[Skipped]]:
    """The weights to compress, each with its config (`config_for(name)`: the pass's config, an
    override's version of it, or a skipping `Override`), and every other candidate with its reason."""
    sites: list[tuple[WeightSite, Any]] = []
    skipped: list[Skipped] = []
    for candidate in candidates:
        count = math.prod(candidate.shape)
        # a tied tensor is stored once, under the name that holds it
        nbytes = 0 if candidate.tied_to is not None else stored_nbytes(candidate.shape, candidate.element)
        if count <= threshold:
            reason = f"{count} elements <= threshold {threshold}"
            skipped.append(Skipped(candidate.name, candidate.shape, reason, SkipKind.SMALL, nbytes))
            continue
        reason = _not_a_weight(candidate)
        if reason is not None:
            skipped.append(Skipped(candidate.name, candidate.shape, reason, SkipKind.NOT_A_WEIGHT, nbytes))
            continue
        config = config_for(candidate.name)
        if isinstance(config, Override):
            reason = f"excluded by override {config.pattern!r}"
            skipped.append(Skipped(candidate.name, candidate.shape, reason, SkipKind.OVERRIDE, nbytes))
            continue
        out, inp = candidate.uses[0].axes(len(candidate.shape))
        site = WeightSite(candidate.handle, candidate.name, candidate.shape, candidate.element, out, inp)
        sites.append((site, config))
    return sites, skipped


class Written(Protocol):
    """What a container reports of a weight it wrote: how it is stored and what it costs."""

    encoding: str
    bytes_before: int
    bytes_after: int


class Container(Protocol):
    """A program whose weights can be compressed: it lists its float tensors, reads a weight, and
    writes an encoded weight in its place (a Core AI program: `coreai_opt._coreai`; a `torch.export`
    program: `coreai_opt._export`)."""

    def candidates(self) -> list[Candidate]: ...

    def compressed(self) -> int:
        """How many weights the program already holds compressed (they are never encoded again)."""
        ...

    def read(self, site: WeightSite) -> torch.Tensor: ...

    def refusal(self, site: WeightSite, encoding: Encoding) -> str | None:
        """Why this container cannot store `encoding` of the weight (it is then skipped), or None."""
        ...

    def write(self, site: WeightSite, encoding: Encoding) -> Written: ...

    def finish(self) -> None: ...
