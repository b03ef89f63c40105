"""A few seconds' look at what a compression wrote: a language model's next-token predictions
against the program it came from, on a text every Python ships (the standard library's
documentation topics, `pydoc_data.topics`), so a broken result is said at once, not found later.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPOT_TOKENS = 256  # tokens scored: whole windows of the program's length, at least one
_TEXT_CHARACTERS = 65536  # of the shipped text: ~15k tokens, a window of most models
BROKEN_TOP1 = 0.5  # fewer of the original's most likely tokens kept than this: broken
BROKEN_KL = 1.0  # a mean KL from the original above this (nats per token): broken


@dataclass(frozen=True)
class SpotCheck:
    """How far a candidate's next-token predictions moved from the original's on a few windows."""

    tokens: int
    kl_mean: float
    top1: float
    perplexity_increase: float

    @property
    def broken(self) -> bool:
        return self.top1 < BROKEN_TOP1 or not self.kl_mean <= BROKEN_KL

    def to_dict(self) -> dict[str, Any]:
        def num(value: float) -> float | str:  # JSON has no infinity: a broken result's KL may be one
            return value if math.isfinite(value) else str(value)

        return {"tokens": self.tokens, "kl_mean": num(self.kl_mean), "top1": self.top1,
                "perplexity_increase": num(self.perplexity_increase), "broken": self.broken}  # fmt: skip


def shipped_text() -> str:
    """English prose every Python install holds: its documentation topics, in a fixed order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))[:_TEXT_CHARACTERS]


def spot_check(
    reference: Path | str, candidate: Path | str, *, trust_pickle: bool = False
) -> SpotCheck | None:
    """The candidate against the reference on about `SPOT_TOKENS` tokens of `shipped_text()` (whole
    windows, one at least), or None when the reference is not a language model with a tokenizer
    beside it (as `coreopt export` leaves one) or the check cannot run (a window longer than the
    text, too little memory): it never fails what it looks at."""
    from coreai_opt.errors import ConfigError
    from coreai_opt.io import ModelFileError
    from coreai_opt.models import ModelKind, model_info, model_tokenizer

    from ._text import evaluate_text

    info = model_info(reference)
    if info is None or info.kind is not ModelKind.CAUSAL_LM or model_tokenizer(reference) is None:
        return None
    window = info.context or info.seq_len
    tokens = max(1, SPOT_TOKENS // window) * window
    try:
        with tempfile.TemporaryDirectory(prefix="coreopt-spot-") as folder:
            text = Path(folder) / "topics.txt"
            text.write_text(shipped_text(), encoding="utf-8")
            found = evaluate_text(
                reference, [candidate], text=text, max_tokens=tokens, trust_pickle=trust_pickle
            )
    except (ConfigError, ModelFileError, ImportError, MemoryError, OSError):
        return None
    score = found.candidates[0]
    return SpotCheck(
        found.windows.scored, score.kl_mean or 0.0, score.top1 or 0.0, score.perplexity_increase or 0.0
    )
