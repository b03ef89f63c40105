"""What data-driven compression learns from, and the contract of whoever gathers it.

An algorithm declares its `Needs`; a `Calibration` (`coreai_opt.calibration` implements it for
`torch.export` programs) runs the program on calibration samples and hands each weight its
`Statistics`, keyed by the weight names both containers share. Layer-by-layer algorithms take
them in graph order with every weight compressed so far already swapped in (`replace`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


class Needs(enum.Enum):
    """What an algorithm learns from, per weight."""

    NOTHING = "nothing"
    INPUT_MOMENTS = "input-moments"  # E[x_k^2] of each input channel k of the weight's consumer
    INPUT_GRAM = "input-gram"  # E[x x^T] over the consumer's input channels (GPTQ, SparseGPT)
    GRADIENT_SQUARES = "gradient-squares"  # E[(dL/dw)^2] per weight element (Fisher, SqueezeLLM)


@dataclass(frozen=True)
class Statistics:
    """What one weight's consumer saw on the calibration data (means over `rows` input rows:
    tokens, pixels, positions), in float64 on the CPU unless a gatherer says otherwise."""

    rows: int
    moments: torch.Tensor | None = None  # [in_features]
    gram: torch.Tensor | None = None  # [in_features, in_features]
    gradient_squares: torch.Tensor | None = None  # the weight's shape
    # the mean of the whole weight's squared gradients where it is known without summing them:
    # `gradient_squares` holds a sample of its rows, or was read back from disk (`Narrowable`)
    squares_mean: float | None = None

    def gradient_mean(self) -> float:
        """The mean squared gradient over the whole weight, summed on the host in float64 a piece
        at a time (no host or float64 copy of the whole: a float64 one of SmolLM2's embedding's
        squares was 216 MB), or `squares_mean` where `gradient_squares` is a sample of its rows; 0
        without them."""
        import torch

        from coreai_opt._pieces import PIECE

        squares = self.gradient_squares
        if self.squares_mean is not None or squares is None or not squares.numel():
            return self.squares_mean or 0.0
        flat = squares.detach().reshape(-1)
        total = sum(
            float(flat[a : a + PIECE].cpu().sum(dtype=torch.float64)) for a in range(0, flat.numel(), PIECE)
        )
        return total / flat.numel()


class Checkpoints(Protocol):
    """Where one long pass over the calibration samples keeps its state between runs."""

    def load(
        self, expected: dict[str, tuple[tuple[int, ...], torch.dtype]]
    ) -> dict[str, torch.Tensor] | None:
        """The last state stored, when it is exactly the `expected` tensors (name -> shape, dtype)."""
        ...

    def store(self, tensors: dict[str, torch.Tensor]) -> None:
        """Keep `tensors` as the pass's state, in place of the one before."""
        ...

    def drop(self) -> None:
        """Forget the state: the pass finished."""
        ...


class Calibration(Protocol):
    """Statistics of a program's weights on calibration data."""

    def statistics(self, names: Sequence[str], needs: Needs, *, final: bool = False) -> dict[str, Statistics]:
        """Each named weight's statistics from the program as it is now (one pass over the data).
        `final`: nothing is asked of this calibration afterwards (not even a `replace`), so it may
        let go of its program and samples once the statistics are taken."""
        ...

    def sequential(
        self, names: Sequence[str], needs: Needs, *, final: bool = False
    ) -> Iterator[tuple[str, Statistics]]:
        """The named weights one at a time, the caller replacing each before asking for the next:
        moments and Gram matrices in the order the program reads the weights, each taken after
        every `replace` made so far; squared gradients in the order a backward pass finishes
        them (from the output back), all of the program as it was when the pass began.
        `final`: nothing is asked of this calibration after the pass, so a weight replaced without
        keeping its original may be let go once the pass is done with it."""
        ...

    def replace(self, name: str, value: torch.Tensor, *, keep_original: bool = True) -> None:
        """Use `value` for the weight `name` from now on (its compressed form, decoded). Without
        `keep_original` the weight as given may be let go (its memory comes back while the pass
        goes on), and `divergence` - which compares with it - may no longer be asked for."""
        ...

    @property
    def sample_count(self) -> int:
        """How many calibration samples `divergence` takes."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the program runs: weights given to `divergence` there are used without a copy."""
        ...

    def references(self, samples: Sequence[int]) -> list[Any]:
        """The program's outputs as it was given on calibration samples `samples`: what
        `divergence` compares with, taken together before a step holds any gradient (the weights
        as given are read in for them, the leaves' gradients need not be held beside them)."""
        ...

    def divergence(
        self, weights: Mapping[str, torch.Tensor], sample: int, reference: Any = None
    ) -> torch.Tensor:
        """How far the program's output on calibration sample `sample`, with `weights` (by name,
        differentiable) in place of the named weights and every `replace` made so far, is from
        the program's as it was given (`reference`, from `references`; else taken now): a scalar
        that gradients flow back from to `weights`."""
        ...

    def checkpoints(self, identity: Callable[[], bytes]) -> Checkpoints | None:
        """Where a pass over these samples keeps checkpoints, so a run stopped part way resumes -
        keyed by what else its result depends on, `identity()` (asked only where it keeps them);
        None: it keeps none."""
        ...


Known = Mapping[Needs, Mapping[str, Statistics]]  # statistics of a program as it is, taken before


@runtime_checkable
class Narrowable(Protocol):
    """Statistics by name that are read one weight at a time (from disk: `calibration`'s squared
    gradients kept for a later step), so that whatever narrows them keeps them unread."""

    def narrowed(self, names: Collection[str]) -> Mapping[str, Statistics]:
        """The same, of `names` only (those it has), still unread."""
        ...


def _narrowed(by_name: Mapping[str, Statistics], names: Collection[str]) -> Mapping[str, Statistics]:
    """`by_name` of `names` only (in its order), read no sooner than before."""
    if isinstance(by_name, Narrowable):
        return by_name.narrowed(names)
    wanted = set(names)
    return {n: s for n, s in by_name.items() if n in wanted}


def known_of(
    known: Known, names: Collection[str], needs: Collection[Needs] | None = None
) -> dict[Needs, Mapping[str, Statistics]]:
    """`known` narrowed to the weights `names` (and the kinds `needs`, when given): what a later
    step reads, so the rest can go."""
    return {
        kind: _narrowed(by_name, names) for kind, by_name in known.items() if needs is None or kind in needs
    }


def statistics_from(
    calibration: Calibration, names: Sequence[str], needs: Needs, known: Known | None
) -> Mapping[str, Statistics]:
    """`names`' statistics of the program as it is: from `known` where it has them (taken earlier
    in the run, or derived by a transform from what it measured), the rest taken by `calibration`
    in one pass (none where `known` has them all; those read a weight at a time stay so)."""
    have = (known or {}).get(needs, {})
    missing = [name for name in names if name not in have]
    if not missing and isinstance(have, Narrowable):
        return have.narrowed(names)
    taken = calibration.statistics(missing, needs) if missing else {}
    return {name: have[name] if name in have else taken[name] for name in names}
