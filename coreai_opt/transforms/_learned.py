"""A residual-stream rotation learned on calibration data (after SpinQuant, layer by layer): Q
starts at the seeded Hadamard rotation and moves on the orthogonal group - Q = Q0 (I - A)^-1
(I + A), A skew-symmetric (the Cayley map), A learned by Adam - to lower the loss its weights
take from round to nearest.

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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coreai_opt.weights import Needs

if TYPE_CHECKING:
    import torch

    from ._stream import Stream


@dataclass(frozen=True)
class _Term:
    """One weight, its output axis first and input axis last ([out, in]), whether the stream is
    its input (reader) or output (writer), its input Gram and its output energy."""

    weight: torch.Tensor
    reader: bool
    gram: torch.Tensor
    energy: float


def learned_rotation(
    state: dict[str, Any], stream: Stream, q0: torch.Tensor, config: Any, calibration: Any
) -> tuple[torch.Tensor, float, float]:
    """(Q, the mean relative loss at Q0, at Q) after `config.steps` steps."""
    import torch

    device = getattr(calibration, "device", None) or torch.device("cpu")
    groups = _terms(state, stream, calibration, device)
    generator = torch.Generator().manual_seed(config.seed)
    q0 = q0.to(device)
    skew = torch.zeros_like(q0, requires_grad=True)
    optimizer = torch.optim.Adam([skew], lr=config.learning_rate)
    first = _mean_loss(groups, q0, config.bits)
    order: list[int] = []
    for _ in range(config.steps):
        if not order:
            order = torch.randperm(len(groups), generator=generator).tolist()
        terms = groups[order.pop()]
        loss = sum(_loss(term, _cayley(q0, skew), config.bits) for term in terms)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[union-attr]
        optimizer.step()
    with torch.no_grad():
        q = _cayley(q0, skew)
    return q.detach().cpu(), first, _mean_loss(groups, q, config.bits)


def _terms(state: dict[str, Any], stream: Stream, calibration: Any, device: Any) -> list[list[_Term]]:
    """The stream's weights with a Gram matrix (every linear layer; not an embedding lookup),
    grouped by layer (their names up to the last two parts), on `device`."""
    import torch

    roles = {(name, axis): reader for name, axis, reader in stream.roles}
    names = sorted({name for name, _ in roles})
    statistics = calibration.statistics(names, Needs.INPUT_GRAM)
    grams: dict[int, torch.Tensor] = {}  # one float32 copy of a Gram its readers share
    groups: dict[str, list[_Term]] = {}
    for (name, axis), reader in sorted(roles.items()):
        found = statistics.get(name)
        weight = state[name].detach().to(device, torch.float64)
        if found is None or found.gram is None or weight.dim() != 2:
            continue
        rows = weight if (axis == weight.dim() - 1) == reader else weight.T  # [out, in]
        key = found.gram.data_ptr()
        gram = grams.setdefault(key, found.gram.to(device, torch.float32))
        energy = float(((rows.float() @ gram) * rows.float()).sum())
        if energy > 0:
            groups.setdefault(name.rsplit(".", 2)[0], []).append(_Term(rows.float(), reader, gram, energy))
    return [groups[key] for key in sorted(groups)] if groups else [[]]


def _cayley(q0: torch.Tensor, skew: torch.Tensor) -> torch.Tensor:
    import torch

    a = (skew - skew.T) / 2
    eye = torch.eye(a.shape[0], dtype=a.dtype, device=a.device)
    return q0 @ torch.linalg.solve(eye - a, eye + a)


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
        losses = [float(_loss(term, q, bits)) for terms in groups for term in terms]
    return sum(losses) / max(len(losses), 1)
