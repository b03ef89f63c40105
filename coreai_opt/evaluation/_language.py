"""A language model as evaluation runs it: a program that takes token ids and returns logits
first (a `.pt2` in PyTorch or an `.aimodel` on the Core AI runtime, the comparison room's sides;
a stateful decoder from position 0), run over windows of a text or on one sequence."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from coreai_opt.io import ModelFileError

from ._tokens import Windows, window_batches

if TYPE_CHECKING:
    import torch

    from coreai_opt.comparison import Side

Progress = Callable[[int, int, str], None]


class Counter:
    """Runs done of all a pass makes, passed on to a progress callback."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0

    def step(self, label: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total, label)


@dataclass
class LanguageSide:
    """A program that takes `[batch, length]` token ids and returns logits first."""

    path: Path
    side: Side
    ids_name: str
    batch: int
    length: int
    fixed: dict[str, np.ndarray]  # other inputs (an attention mask: all ones)
    seconds: float = 0.0  # spent running the program
    decoder: Any = None  # a stateful decoder's (generation.StatefulDecoder): each window one prefill
    bits_per_weight: float | None = None  # of its weights as stored (`weight_bits`)

    @classmethod
    def open(
        cls,
        path: Path,
        trust_pickle: bool,
        stack: contextlib.ExitStack,
        length: int | None,
        device: str | None = None,
    ) -> LanguageSide:
        """A program to score windows with (a `.pt2` on `device` when given); a stateful decoder
        takes windows of `length` tokens (None: its context), written from position 0 - the
        decode path's perplexity. A `.pt2`'s tensors that its running module does not hold are let
        go once its bits per weight are read (`ExportedSide.release_weights`)."""
        from coreai_opt.comparison import open_side

        side = open_side(path, trust_pickle, stack, device)
        made = cls._of(path, side, length)
        release = getattr(side, "release_weights", None)
        if release is not None:
            made.bits_per_weight = _bits_per_weight(path, side)
            release()
        return made

    def weight_bits(self) -> float | None:
        """Bits per weight as stored: a `.pt2`'s read when it was opened, an `.aimodel`'s from its
        file when first asked."""
        if self.bits_per_weight is None and getattr(self.side, "program", None) is None:
            self.bits_per_weight = _bits_per_weight(self.path, self.side)
        return self.bits_per_weight

    @classmethod
    def _of(cls, path: Path, side: Side, length: int | None) -> LanguageSide:
        decoder = _decoder(side)
        if decoder is not None:
            window = length or decoder.context
            if window > decoder.context:
                raise ModelFileError(path, f"holds {decoder.context} positions; the reference's windows are "
                                     f"{window} tokens")  # fmt: skip
            return cls(path, side, "input_ids", 1, window, {}, decoder=decoder)
        ints = [s for s in side.inputs if np.issubdtype(s.dtype, np.integer) and len(s.shape) == 2]
        if not ints:
            raise ModelFileError(path, "takes no [batch, tokens] integer ids: not a language model")
        ids = ints[0]
        fixed = {s.name: np.ones(s.shape, s.dtype) for s in side.inputs if s.name != ids.name}
        return cls(path, side, ids.name, ids.shape[0], ids.shape[1], fixed)

    def logits(
        self, ids: np.ndarray, windows: Windows, counter: Counter
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """(window index, its logits [length, vocab] float32), the batch filled window by window."""
        import torch

        dtype = next(s.dtype for s in self.side.inputs if s.name == self.ids_name)
        for first, group, stacked in window_batches(ids, windows, self.batch):
            arrays = {self.ids_name: stacked.astype(dtype), **self.fixed}
            begun = time.perf_counter()
            out = self._run(arrays)
            self.seconds += time.perf_counter() - begun  # the model's time, not the metrics'

            if out.ndim != 3 or out.shape[:2] != (self.batch, self.length):
                raise ModelFileError(self.path, f"returns {list(out.shape)} first, not logits "
                                     f"[{self.batch}, {self.length}, vocab]")  # fmt: skip
            for k in range(len(group)):
                counter.step(f"{self.path.name} window {first + k + 1}")
                yield first + k, torch.from_numpy(np.asarray(out[k], dtype=np.float32))

    def sequence_logits(self, ids: list[int]) -> torch.Tensor:
        """The logits [len(ids), vocab] float32 of one sequence of at most the window's tokens: a
        window program's batch filled with it, padded on the right (a causal model's logits at a
        position never see the positions after it); a stateful decoder's from one call."""
        import torch

        if not 1 <= len(ids) <= self.length:
            raise ValueError(f"a sequence of {len(ids)} tokens; {self.path} takes 1 to {self.length}")
        dtype = next(s.dtype for s in self.side.inputs if s.name == self.ids_name)
        pad = 0 if self.decoder is not None else self.length - len(ids)  # a decoder takes any count
        row = np.asarray(ids + [ids[-1]] * pad, dtype=np.int64)
        arrays = {self.ids_name: np.repeat(row[None], self.batch, 0).astype(dtype), **self.fixed}
        begun = time.perf_counter()
        out = self._run(arrays)
        self.seconds += time.perf_counter() - begun
        return torch.from_numpy(np.asarray(out[0, : len(ids)], dtype=np.float32))

    def _run(self, arrays: dict[str, np.ndarray]) -> Any:
        """The logits of one batch of windows: a stateful decoder's from one call at position 0."""
        if self.decoder is not None:
            from coreai_opt.io import running

            with running(self.path):  # an asset's decoder reports its worker's failures itself
                self.decoder.reset()  # a new sequence
                return self.decoder(arrays[self.ids_name][0].tolist(), 0)[None].float().cpu().numpy()
        result = self.side.run(arrays)
        return result.values[result.outputs[0].name]


def _bits_per_weight(path: Path, side: Side) -> float | None:
    """Of the program the side loaded (a `.pt2`), or of the file (an `.aimodel`)."""
    from coreai_opt.inspection import inspect_exported_program, inspect_model

    program = getattr(side, "program", None)
    try:
        report = inspect_model(path) if program is None else inspect_exported_program(program, path)
        return report.mean_bits_per_weight
    except (ModelFileError, ZeroDivisionError):
        return None


def _decoder(side: Side) -> Any:
    """The stateful decoder a side holds (a `.pt2`'s module or an `.aimodel`'s worker reused), or None."""
    from coreai_opt.comparison import ExportedSide
    from coreai_opt.generation import AssetDecoder, NotADecoder, StatefulDecoder
    from coreai_opt.models import STATE_INPUTS

    if isinstance(side, ExportedSide):
        try:
            return StatefulDecoder(side.program, module=side.module)
        except NotADecoder:
            return None
    if tuple(s.name for s in side.inputs) != STATE_INPUTS:
        return None
    return AssetDecoder(side.path, side.worker)
