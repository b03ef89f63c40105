"""Multiple-choice task accuracy, scored as lm-eval-harness scores its loglikelihood tasks.

A task file holds one JSON object a line: ours (`context`, `choices`, the index `label`), or an item
as HellaSwag, ARC, PIQA and Winogrande are distributed (read into the same form as lm-eval-harness
words them: `_layouts`). Each choice is a continuation of its context (ours: a space and the
choice); its log-likelihood is the sum of the log-probabilities of the continuation's tokens after
the context's, the pair cut into tokens as lm-eval-harness cuts it (the context's trailing spaces
moved to the continuation; the continuation's tokens those of the whole past the context's), the
sequence cut from the left to the program's window. `acc`: how often the most likely choice is the
label; `acc_norm`: the same with each log-likelihood divided by the choice's length in characters
(lm-eval-harness's normalisation: bytes for ASCII text); each with its standard error. Programs
run one at a time, so memory holds one model.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from coreai_opt.errors import ConfigError
from coreai_opt.io import (
    ModelFileError,
    asset_bytes,
    model_format,
    one_line,
    read_in_folder,
    require_existing,
)

from ._language import Counter, LanguageSide, Progress
from ._layouts import TaskItem, task_item
from ._tokens import check_ids

_TASK_LIMIT = 1 << 30  # bytes of a task file read at most


@dataclass
class TaskScore:
    """One program's accuracy on a task, with each item's choices' log-likelihoods (`lls`)."""

    path: Path
    size_bytes: int
    acc: float
    acc_stderr: float | None
    acc_norm: float
    acc_norm_stderr: float | None
    seconds: float
    lls: list[list[float]] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path), "size_bytes": self.size_bytes, "acc": self.acc, "acc_stderr": self.acc_stderr,
            "acc_norm": self.acc_norm, "acc_norm_stderr": self.acc_norm_stderr, "seconds": round(self.seconds, 3),
        }  # fmt: skip


@dataclass
class TaskEvaluation:
    """A task's items and every program's score on them (the reference first)."""

    source: str
    items: int
    scores: list[TaskScore] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.source, "items": self.items, "programs": [s.to_dict() for s in self.scores]}

    def to_csv(self) -> str:
        head = "program,size_bytes,acc,acc_stderr,acc_norm,acc_norm_stderr,seconds\n"
        return head + "".join(
            f"{s.path},{s.size_bytes},{s.acc},{s.acc_stderr},{s.acc_norm},{s.acc_norm_stderr},{s.seconds:.3f}\n"
            for s in self.scores
        )


def read_task(path: Path | str, limit: int | None = None) -> list[TaskItem]:
    """The items of a task file (at most `limit`), one JSON object a line; a line that is not one
    of the layouts `_layouts` reads is refused in one line naming the file and the line."""
    path = Path(path)
    require_existing(path)
    text = read_in_folder(path, limit=_TASK_LIMIT).decode("utf-8", errors="replace")
    items: list[TaskItem] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(task_item(json.loads(line)))
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise ModelFileError(path, f"line {number}: {one_line(exc, 160)}") from None
        if limit is not None and len(items) >= limit:
            break
    if not items:
        raise ModelFileError(path, "holds no task items (one JSON object a line)")
    return items


def evaluate_task(
    reference: Path | str,
    candidates: list[Path | str] | tuple[Path | str, ...] = (),
    *,
    task: Path | str,
    tokenizer: Path | str | None = None,
    max_items: int | None = None,
    trust_pickle: bool = False,
    progress: Progress | None = None,
) -> TaskEvaluation:
    """`acc` and `acc_norm` of the reference and every candidate on the items of `task` (at most
    `max_items`), the text cut with `tokenizer` (default: the one `coreopt export` saved beside
    the reference)."""
    from ._tokens import tokenizer_for

    paths = [Path(reference), *(Path(c) for c in candidates)]
    for path in paths:
        require_existing(path)
        model_format(path)
    items = read_task(task, max_items)
    found = tokenizer_for(paths[0], task, tokenizer)
    assert found is not None
    coder = PairCoder(found, paths[0])
    runs = sum(len(item.pairs) for item in items)
    counter = Counter(progress, runs * len(paths))
    result = TaskEvaluation(str(task), len(items))
    window = None
    for path in paths:
        with contextlib.ExitStack() as stack:
            side = LanguageSide.open(path, trust_pickle, stack, window)
            if window is not None and side.length != window:
                raise ModelFileError(path, f"takes {side.length} tokens; the reference takes {window}")
            window = side.length
            result.scores.append(_score(side, items, coder, counter))
    return result


class PairCoder:
    """A tokenizer with lm-eval-harness's way of cutting a (context, continuation) pair, and the
    model's start token (`prefix`: its config's start of sequence, else its end of sequence, or the
    one given) and end-of-sequence ids (`stops`). Texts are encoded as lm-eval's Hugging Face model
    encodes them: with the tokenizer's own special tokens (a start token where its template adds
    one), none added to a text that already begins with the start token."""

    def __init__(self, tokenizer: Path, program: Path, prefix: int | None = None) -> None:
        from coreai_opt.models import model_info, read_tokenizer

        self.tokenizer, self.path = read_tokenizer(tokenizer), tokenizer
        info = model_info(program)
        self.vocab = info.vocab_size if info is not None else None
        self.prefix = prefix if prefix is not None else info.start_id if info is not None else None
        self.stops = info.eos_ids if info is not None else ()
        # what a text that already begins with the start token begins with ("\0": none can)
        self.started = (
            self.tokenizer.decode([self.prefix], False) if self.prefix is not None else ""
        ) or "\0"

    def encode(self, text: str, special: bool = True) -> list[int]:
        special = special and not text.startswith(self.started)
        ids = list(self.tokenizer.encode(text, add_special_tokens=special).ids)
        check_ids(np.asarray(ids, dtype=np.int64), self.vocab, self.path)
        return ids

    def pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        if not context:  # the model's start token stands for it, unless the continuation starts with it
            tail = self.encode(continuation, special=False)
            if tail[:1] == [self.start()]:
                return tail[:1], tail[1:]
            return [self.start()], tail
        whole, start = self.encode(context + continuation), self.encode(context)
        return start, whole[len(start) :]

    def start(self) -> int:
        """The start token, or a one-line error naming what needed it."""
        if self.prefix is None:
            raise ConfigError(
                "the model names no start token to put before an empty context or a text", "task"
            )
        return self.prefix


def _score(side: LanguageSide, items: list[TaskItem], coder: PairCoder, counter: Counter) -> TaskScore:
    lls = []
    for item in items:
        lls.append([continuation_loglikelihood(side, coder.pair(*pair))[0] for pair in item.pairs])
        for _ in item.pairs:
            counter.step(f"{side.path.name} item {len(lls)}")
    hits = [
        max(range(len(ll)), key=ll.__getitem__) == item.label for ll, item in zip(lls, items, strict=True)
    ]
    normed = [
        max(range(len(ll)), key=lambda k, ll=ll, item=item: ll[k] / item.lengths[k]) == item.label
        for ll, item in zip(lls, items, strict=True)
    ]
    acc, acc_norm = sum(hits) / len(items), sum(normed) / len(items)
    return TaskScore(side.path, asset_bytes(side.path), acc, _stderr(acc, len(items)), acc_norm,
                     _stderr(acc_norm, len(items)), side.seconds, lls)  # fmt: skip


def continuation_loglikelihood(side: LanguageSide, pair: tuple[list[int], list[int]]) -> tuple[float, bool]:
    """The sum of the log-probabilities of the continuation's tokens after the context's, the
    sequence cut from the left to the program's window; and whether each of them is the most
    likely token where it stands (greedy decoding would make the continuation)."""
    import torch

    context, continuation = pair
    if not continuation:
        raise ConfigError("a task choice is empty: it has no tokens to score", "task")
    if len(continuation) > side.length:
        raise ConfigError(f"a task choice has {len(continuation)} tokens; the program's window holds "
                          f"{side.length}", "task")  # fmt: skip
    whole = (context + continuation)[-(side.length + 1) :]
    tail = side.sequence_logits(whole[:-1])[-len(continuation) :].double()
    target = torch.tensor(continuation)
    logp = torch.log_softmax(tail, dim=-1)[torch.arange(len(continuation)), target]
    return float(logp.sum()), bool((tail.argmax(-1) == target).all())


def _stderr(share: float, count: int) -> float | None:
    """The standard error of a mean of 0/1 outcomes (sample deviation, as lm-eval-harness's)."""
    return math.sqrt(share * (1 - share) / (count - 1)) if count > 1 else None
