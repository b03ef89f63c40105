"""A residual-stream rotation learned on calibration data (after SpinQuant, layer by layer): Q
starts at the seeded Hadamard rotation and moves on the orthogonal group - Q = Q0 (I - A)^-1
(I + A), A skew-symmetric (the Cayley map), A learned by Adam - to lower the loss its weights
take from round to nearest. The statistics it measured come back with Q: the rotated program's
follow from them (`_derived`), so nothing runs the program again to take them.

Each weight on the stream contributes its rounding error as its layer's output sees it, relative
to that output: for a reader W (the stream its input), E = rtn(W Q) - W Q and the loss
tr(E Q^T H Q E^T) / tr(W H W^T), H the Gram matrix of its input on the calibration data; for a
writer (the stream its output), E = rtn(Q^T W) - Q^T W and tr(E H E^T) / tr(W H W^T). Round to
nearest is symmetric with `bits` bits and one scale per output channel; its rounding is held
fixed in each step (a straight-through estimate), so the gradient moves the scales: each
channel's largest weight. Each step takes the weights of one layer (in turn, from a seeded
order), so a step costs one layer's products, not the model's; it runs where the calibration
ran (`--device`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coreai_opt.weights import Needs

if TYPE_CHECKING:
    import torch

    from coreai_opt.weights import Statistics

    from ._stream import Stream


_PART = 1 << 22  # elements of a weight whose loss one product takes (16 MB in float32)


@dataclass(frozen=True)
class _Term:
    """One weight, its output axis first and input axis last ([out, in]), whether the stream is
    its input (reader) or output (writer), its input Gram (float32) and its output energy."""

    weight: torch.Tensor
    reader: bool
    gram: torch.Tensor
    energy: float


def learned_rotation(
    state: dict[str, Any],
    stream: Stream,
    q0: torch.Tensor,
    config: Any,
    calibration: Any,
    progress: Any = None,
) -> tuple[torch.Tensor, float, float, dict[str, Statistics]]:
    """(Q, the mean relative loss at Q0, at Q, the input statistics of every tensor on the stream
    as `calibration` measured them, their Gram matrices in float32) after `config.steps` steps, each reported to
    `progress(done, total, label)` when given."""
    import torch

    device = getattr(calibration, "device", None) or torch.device("cpu")
    measured = _in_float32(calibration.sequential(sorted(stream.axes), Needs.INPUT_GRAM), device)
    groups = _terms(state, stream, measured, device)
    generator = torch.Generator().manual_seed(config.seed)
    q0 = q0.to(device)
    skew = torch.zeros_like(q0, requires_grad=True)
    optimizer = torch.optim.Adam([skew], lr=config.learning_rate)
    first = _mean_loss(groups, q0, config.bits)
    order: list[int] = []
    for step in range(config.steps):
        if progress is not None:
            progress(step + 1, config.steps, "rotation step")
        if not order:
            order = torch.randperm(len(groups), generator=generator).tolist()
        optimizer.zero_grad()
        for part in _parts(groups[order.pop()]):  # gradients add up part by part
            _loss(part, _cayley(q0, skew), config.bits).backward()
        optimizer.step()
    with torch.no_grad():
        q = _cayley(q0, skew)
    return q.detach().cpu(), first, _mean_loss(groups, q, config.bits), measured


def _in_float32(found: Iterator[tuple[str, Statistics]], device: Any) -> dict[str, Statistics]:
    """Each weight's statistics in the program's order, its Gram matrix in float32 on `device`
    only (one for the readers of one input, as measured: they come one after another), each
    float64 one let go as the next comes."""
    import torch

    from coreai_opt.weights import Statistics

    measured: dict[str, Statistics] = {}
    last: tuple[Statistics, Statistics] | None = None  # (as measured, in float32): shared ones come in a row
    for name, statistics in found:
        if last is None or last[0] is not statistics:  # by identity, the object held: ids of freed ones recur
            gram = None if statistics.gram is None else statistics.gram.to(device, torch.float32)
            last = statistics, Statistics(statistics.rows, gram=gram)
        measured[name] = last[1]
    return measured


def _terms(
    state: dict[str, Any], stream: Stream, measured: dict[str, Statistics], device: Any
) -> list[list[_Term]]:
    """The stream's weights with a Gram matrix (every linear layer; not an embedding lookup),
    grouped by layer (their names up to the last two parts), on `device`. A weight already in
    float32 there is used as it is; each Gram matrix is the one measured, in float32 (the readers
    of one input - q, k, v - share it)."""
    import torch

    axes = {name: (axis, reader) for name, axis, reader in stream.roles}
    groups: dict[str, list[_Term]] = {}
    for name in (name for name in measured if name in axes):
        weight, gram = state[name].detach(), measured[name].gram
        if gram is None or weight.dim() != 2:
            continue
        axis, reader = axes[name]
        rows = (weight if (axis == weight.dim() - 1) == reader else weight.T).to(
            device, torch.float32
        )  # [out, in]
        energy = float(((rows @ gram) * rows).sum())
        if energy > 0:
            groups.setdefault(name.rsplit(".", 2)[0], []).append(_Term(rows, reader, gram, energy))
    return [groups[key] for key in sorted(groups)] if groups else [[]]


def _cayley(q0: torch.Tensor, skew: torch.Tensor) -> torch.Tensor:
    import torch

    a = (skew - skew.T) / 2
    eye = torch.eye(a.shape[0], dtype=a.dtype, device=a.device)
    return q0 @ torch.linalg.solve(eye - a, eye + a)


def _parts(terms: list[_Term]) -> Iterator[_Term]:
    """Each term, a reader's output rows cut into parts of at most `_PART` elements (its rows
    round and count apart: the parts' losses add up to the whole's), so a tied head's products
    are taken a slice at a time."""
    for term in terms:
        rows = max(1, _PART // term.weight.shape[1]) if term.reader else term.weight.shape[0]
        for start in range(0, term.weight.shape[0], rows):
            yield _Term(term.weight[start : start + rows], term.reader, term.gram, term.energy)


def _loss(term: _Term, q: torch.Tensor, bits: int) -> torch.Tensor:
    q = q.float()
    turned = term.weight @ q if term.reader else q.T @ term.weight
    top = 2 ** (bits - 1) - 1
    step = turned.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / top
    held = ((turned / step).round().clamp(-top - 1, top) - turned / step).detach()  # the rounding, fixed
    error = held * step
    if term.reader:
        error = error @ q.T  # back to the weight's own input channels, where H was measured
    return ((error @ term.gram) * error).sum() / term.energy


def _mean_loss(groups: list[list[_Term]], q: torch.Tensor, bits: int) -> float:
    import torch

    with torch.no_grad():
        losses = [
            sum(float(_loss(part, q, bits)) for part in _parts([term])) for terms in groups for term in terms
        ]
    return sum(losses) / max(len(losses), 1)
