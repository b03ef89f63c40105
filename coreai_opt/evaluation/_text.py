"""How well language models predict a text: perplexity of each program, and each candidate's
next-token distributions against the reference's (KL divergence, top-1 agreement).

The reference runs once over every window; its log-probabilities at the scored positions are
kept (tokens x vocab float32) and each candidate then runs alone, so memory holds one model at a
time. `.pt2` programs run in PyTorch (compressed weights decoded once), `.aimodel` programs on
the Core AI runtime - the comparison room's sides.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from coreai_opt.errors import ConfigError
from coreai_opt.io import ModelFileError, asset_bytes, model_format, require_existing

from ._config import EvalConfig
from ._tokens import Windows, token_stream, window_batches

if TYPE_CHECKING:
    import torch

    from coreai_opt.comparison import Side

Progress = Callable[[int, int, str], None]
_HELD_LIMIT = 6 << 30  # bytes of reference log-probabilities kept at most


@dataclass
class TextScore:
    """One program's numbers on the text (the KL and top-1 fields are None for the reference)."""

    path: Path
    size_bytes: int
    bits_per_weight: float | None
    perplexity: float
    seconds: float
    tokens_per_second: float  # tokens through the program per second of its own run time
    perplexity_increase: float | None = None  # relative to the reference's
    kl_mean: float | None = None
    kl_p99: float | None = None
    top1: float | None = None

    def to_dict(self) -> dict[str, Any]:
        def num(v: float | None, digits: int = 6) -> float | str | None:
            return None if v is None else (round(v, digits) if math.isfinite(v) else str(v))

        return {
            "path": str(self.path), "size_bytes": self.size_bytes,
            "bits_per_weight": num(self.bits_per_weight, 4), "perplexity": num(self.perplexity),
            "perplexity_increase": num(self.perplexity_increase), "kl_mean": num(self.kl_mean, 8),
            "kl_p99": num(self.kl_p99, 8), "top1": num(self.top1), "seconds": num(self.seconds, 3),
            "tokens_per_second": num(self.tokens_per_second, 1),
        }  # fmt: skip


@dataclass
class TextEvaluation:
    source: str
    windows: Windows
    reference: TextScore
    candidates: list[TextScore] = field(default_factory=list)

    def failures(self, max_ppl_increase: float | None = None, max_kl: float | None = None) -> list[str]:
        """What each budget says of the candidates, a line per candidate over it."""
        found = []
        for row in self.candidates:
            rise, kl = row.perplexity_increase, row.kl_mean
            if max_ppl_increase is not None and not (rise is not None and rise <= max_ppl_increase):
                found.append(f"{row.path.name}: perplexity +{_pct(rise)} exceeds +{_pct(max_ppl_increase)}")
            if max_kl is not None and not (kl is not None and kl <= max_kl):
                found.append(f"{row.path.name}: KL {kl} exceeds {max_kl}")
        return found

    def to_csv(self) -> str:
        """One row per program, the reference first."""
        import csv
        import io

        rows = [self.reference.to_dict()] + [c.to_dict() for c in self.candidates]
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()

    def to_dict(self) -> dict[str, Any]:
        w = self.windows
        return {
            "source": self.source, "tokens": w.tokens, "window": w.length, "stride": w.stride,
            "windows": len(w.starts), "scored_tokens": w.scored, "unscored_tail": w.dropped,
            "reference": self.reference.to_dict(), "candidates": [c.to_dict() for c in self.candidates],
        }  # fmt: skip


def _pct(v: float | None) -> str:
    return "inf" if v is None or not math.isfinite(v) else f"{100 * v:.2f}%"


def evaluate_text(
    reference: Path | str,
    candidates: list[Path | str] | tuple[Path | str, ...] = (),
    *,
    text: Path | str | None = None,
    tokens: Path | str | None = None,
    tokenizer: Path | str | None = None,
    config: EvalConfig | None = None,
    trust_pickle: bool = False,
    progress: Progress | None = None,
    **options: Any,
) -> TextEvaluation:
    """Perplexity of the reference and every candidate on `text` (cut with `tokenizer`, by default
    the one `coreopt export` saved beside the reference) or on the ids of a safetensors `tokens`
    file, over windows of the programs' token length every `stride` tokens (default: the window,
    so windows do not overlap); each candidate's KL divergence from the reference per scored token
    (mean and 99th percentile) and how often its most likely next token is the reference's.
    `config` (an `EvalConfig`; any of its fields given here replace the config's) says how much
    is scored (`max_tokens`) and the windows' `stride`."""
    config = dataclasses.replace(config or EvalConfig(), **options)
    max_tokens, stride = config.max_tokens, config.stride
    reference, paths = Path(reference), [Path(c) for c in candidates]
    for path in (reference, *paths):
        require_existing(path)
        model_format(path)
    ids, source, _ = token_stream(reference, text, tokens, tokenizer, max_tokens)
    with contextlib.ExitStack() as stack:
        ref = _LanguageSide.open(reference, trust_pickle, stack, None)
        windows = Windows(len(ids), ref.length, stride or ref.length)
        runs = len(windows.starts) * (1 + len(paths))
        counter = _Counter(progress, runs)
        held, ref_score = _score_reference(ref, ids, windows, counter)
    result = TextEvaluation(source, windows, ref_score)
    for path in paths:
        with contextlib.ExitStack() as stack:
            side = _LanguageSide.open(path, trust_pickle, stack, ref.length)
            if side.length != ref.length or side.batch != ref.batch:
                raise ModelFileError(path, f"takes [{side.batch}, {side.length}] tokens; the reference takes "
                                     f"[{ref.batch}, {ref.length}]")  # fmt: skip
            result.candidates.append(_score_candidate(side, ids, windows, held, ref_score, counter))
    return result


class _Counter:
    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0

    def step(self, label: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total, label)


@dataclass
class _LanguageSide:
    """A program that takes `[batch, length]` token ids and returns logits first."""

    path: Path
    side: Side
    ids_name: str
    batch: int
    length: int
    fixed: dict[str, np.ndarray]  # other inputs (an attention mask: all ones)
    seconds: float = 0.0  # spent running the program
    decoder: Any = None  # a stateful decoder's (generation.StatefulDecoder): each window one prefill

    @classmethod
    def open(
        cls, path: Path, trust_pickle: bool, stack: contextlib.ExitStack, length: int | None
    ) -> _LanguageSide:
        """A program to score windows with; a stateful decoder takes windows of `length` tokens
        (None: its context), written from position 0 - the decode path's perplexity."""
        from coreai_opt.comparison import open_side

        side = open_side(path, trust_pickle, stack)
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
        self, ids: np.ndarray, windows: Windows, counter: _Counter
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

    def _run(self, arrays: dict[str, np.ndarray]) -> Any:
        """The logits of one batch of windows: a stateful decoder's from one call at position 0."""
        if self.decoder is not None:
            from coreai_opt.io import running

            with running(self.path):  # an asset's decoder reports its worker's failures itself
                self.decoder.reset()  # a new sequence
                return self.decoder(arrays[self.ids_name][0].tolist(), 0)[None].float().numpy()
        result = self.side.run(arrays)
        return result.values[result.outputs[0].name]


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


def _targets(ids: np.ndarray, windows: Windows, index: int) -> tuple[int, torch.Tensor]:
    import torch

    row = windows.first_row(index)
    start = windows.starts[index]
    return row, torch.from_numpy(ids[start + row + 1 : start + windows.length].copy())


def _score_reference(
    ref: _LanguageSide, ids: np.ndarray, windows: Windows, counter: _Counter
) -> tuple[list[torch.Tensor], TextScore]:
    import torch

    held: list[torch.Tensor] = []
    nll, kept = 0.0, 0
    for index, logits in ref.logits(ids, windows, counter):
        row, targets = _targets(ids, windows, index)
        logp = torch.log_softmax(logits[row:-1].double(), dim=-1).float()
        kept += logp.numel() * 4
        if kept > _HELD_LIMIT:
            raise ConfigError(f"{windows.scored} tokens x {logp.shape[-1]} logits exceed the memory kept for "
                              "the reference: evaluate fewer tokens (--max-tokens)", "max_tokens")  # fmt: skip
        nll -= float(logp.gather(1, targets[:, None]).double().sum())
        held.append(logp)
    score = _score(ref, nll / windows.scored, windows)
    return held, score


def _score_candidate(
    side: _LanguageSide, ids: np.ndarray, windows: Windows, held: list[torch.Tensor],
    reference: TextScore, counter: _Counter,
) -> TextScore:  # fmt: skip
    import torch

    nll, kls, agree = 0.0, [], 0
    for index, logits in side.logits(ids, windows, counter):
        row, targets = _targets(ids, windows, index)
        logq = torch.log_softmax(logits[row:-1].double(), dim=-1).float().double()  # as the reference is kept
        logp = held[index].double()
        nll -= float(logq.gather(1, targets[:, None]).sum())
        kls.append((logp.exp() * (logp - logq)).sum(-1).float())
        agree += int((logp.argmax(-1) == logq.argmax(-1)).sum())
    score = _score(side, nll / windows.scored, windows)
    kl = torch.cat(kls).double()
    finite = bool(torch.isfinite(kl).all())
    score.kl_mean = float(kl.mean()) if finite else math.inf
    score.kl_p99 = float(torch.quantile(kl, 0.99)) if finite else math.inf
    score.top1 = agree / windows.scored
    score.perplexity_increase = score.perplexity / reference.perplexity - 1.0
    return score


def _score(side: _LanguageSide, mean_nll: float, windows: Windows) -> TextScore:
    perplexity = math.exp(mean_nll) if math.isfinite(mean_nll) and mean_nll < 700 else math.inf
    processed = len(windows.starts) * windows.length
    return TextScore(
        side.path,
        asset_bytes(side.path),
        _bits_per_weight(side),
        perplexity,
        side.seconds,
        processed / side.seconds,
    )


def _bits_per_weight(side: _LanguageSide) -> float | None:
    """Of the program the side already loaded (a `.pt2`), or of the file (an `.aimodel`)."""
    from coreai_opt.inspection import inspect_exported_program, inspect_model

    program = getattr(side.side, "program", None)
    try:
        report = inspect_model(side.path) if program is None else inspect_exported_program(program, side.path)
        return report.mean_bits_per_weight
    except (ModelFileError, ZeroDivisionError):
        return None
