"""The rotated program's input statistics, derived from those the learned rotation measured on the
program with its norms folded, so nothing runs the rotated program to take them again.

A reader of the stream sees x Q where it saw x: its Gram matrix becomes Q^T G Q (and its input
moments that Gram's diagonal); a tensor looked up from the stream's table and measured through
its multiplied twin turns the same way. A writer's input is not on the stream: it keeps its own.
Around a gain kept before a tied head, the matmul that turns the stream back reads the normalized
stream (x Q, whose Gram is Q^T D^-1 G D^-1 Q, G the head's measured Gram and D the gain) and the
one that turns it forward reads the gain's output (G itself). Where a statistic cannot be derived
- a head-rotated output projection, a gain with a zero - it is left out, and the caller takes it.
The derived Gram matrices equal the measured ones of the rotated program up to rounding: the
rotation's float32 Gram is turned in float64, where the rotated program would square rotated
activations, and kept in float32 again - half of what a pass's float64 ones hold from the rotation
to the estimates that read them (each read widens its own, `compression.gram_of`); the moments,
one value a channel, in float64 as a pass's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from coreai_opt.weights import Statistics

if TYPE_CHECKING:
    import torch

    from ._stream import Stream


def turning_names(gain: str) -> tuple[str, str]:
    """The stored weights of the two matmuls kept around the gain `gain`: the one that turns the
    stream back before it, and the one that turns it forward after it."""
    prefix = gain.rpartition(".")[0]
    return f"{prefix}.unrotation", f"{prefix}.rotation"


@dataclass(frozen=True)
class KeptGain:
    """A gain kept before a tied head: its name, its values, and the weight that read its output
    in the measured program (None: none did)."""

    name: str
    gain: torch.Tensor
    reader: str | None


def rotated_statistics(
    measured: dict[str, Statistics], stream: Stream, q: torch.Tensor, kept: list[KeptGain],
    underivable: set[str],
) -> dict[str, Statistics]:  # fmt: skip
    """The rotated program's statistics of every measured tensor but the `underivable` ones, and
    of the matmuls around each kept gain, from `measured` and Q. A weight that reads the stream and
    writes it too (x + W norm(x)) reads it turned: only a pure writer keeps its Gram."""
    readers = {name for name, _, reader in stream.roles if reader}
    writers = {name for name, _, reader in stream.roles if not reader} - readers
    derived: dict[int, Statistics] = {}  # readers of one input (q, k, v) share one derived Gram
    found: dict[str, Statistics] = {}
    for name, statistics in measured.items():
        if name in underivable:
            continue
        if id(statistics) not in derived:
            derived[id(statistics)] = (
                _as_measured(statistics)
                if name in writers or statistics.gram is None
                else _turned(statistics, q)
            )
        found[name] = derived[id(statistics)]
    for gain in kept:
        found.update(_around_gain(gain, measured, q))
    return found


def _as_measured(found: Statistics) -> Statistics:
    """`found`, its float32 Gram as it is, with the moments a pass gives beside it (float64)."""
    if found.gram is None:
        return found
    return Statistics(found.rows, moments=found.gram.diagonal().double(), gram=found.gram)


def _turned(found: Statistics, q: torch.Tensor) -> Statistics:
    """`found` of inputs x seen as x Q."""
    import torch

    assert found.gram is not None
    q = q.to(found.gram.device, torch.float64)
    gram = q.T @ found.gram.double() @ q
    return _kept(found.rows, (gram + gram.T) / 2)  # exactly symmetric, as a measured Gram is


def _kept(rows: int, gram: torch.Tensor) -> Statistics:
    """A float64 Gram kept in float32, its diagonal in float64 as the moments."""
    return Statistics(rows, moments=gram.diagonal().clone(), gram=gram.float())


def _around_gain(gain: KeptGain, measured: dict[str, Statistics], q: torch.Tensor) -> dict[str, Statistics]:
    """The statistics of `gain`'s two matmuls: forward (reads the gain's output, turned back) and
    back (reads the normalized stream); none without a measured reader, back none where the gain
    has a zero (the normalized stream is then not known from its product)."""
    import torch

    found = measured.get(gain.reader) if gain.reader is not None else None
    if found is None or found.gram is None:
        return {}
    back, forward = turning_names(gain.name)
    derived = {forward: _as_measured(found)}
    g = gain.gain.to(found.gram.device, torch.float64).reshape(-1)
    if g.numel() == found.gram.shape[0] and bool(torch.isfinite(g).all()) and bool((g != 0).all()):
        normalized = found.gram.double() / (g[:, None] * g[None, :])
        derived[back] = _turned(Statistics(found.rows, gram=normalized), q)
    return derived
