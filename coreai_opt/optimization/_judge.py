"""The judge: a program made from a plan, measured against the reference on the evaluation data -
perplexity, KL and top-1 for a language model (`evaluate_text`), the worst and mean output cosine
for any other (`compare_many`). Kept apart from the rounds that call it because it is the one
place that knows how each kind of evaluation data is read and scored.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from coreai_opt._memory import release_garbage
from coreai_opt.calibration import is_text
from coreai_opt.io import asset_bytes

from ._records import Measured

Progress = Callable[[int, int, str], None]


class Judge:
    """Measures programs against the reference on the evaluation data: a language model on text
    or token ids (`evaluate_text`, on `device`: the one the search calibrates on), any other on
    model inputs (`compare_many`, worst cosine)."""

    def __init__(self, reference: Path, evaluation: Path | None, tokens: int | None, samples: int,
                 progress: Progress | None, device: str | None = None) -> None:  # fmt: skip
        self.reference_path, self.device = reference, device
        self.evaluation, self.tokens, self.samples, self.progress = evaluation, tokens, samples, progress
        self.language = evaluation is not None and (is_text(evaluation) or _token_ids(evaluation))
        self.reference: Measured | None = None

    def __call__(self, candidate: Path) -> Measured:
        """The candidate measured; the programs it loaded freed before the next round makes one."""
        try:
            return self._measure(candidate)
        finally:
            release_garbage(asset_bytes(candidate) + asset_bytes(self.reference_path))

    def _measure(self, candidate: Path) -> Measured:
        began = time.perf_counter()
        size = asset_bytes(candidate)
        if self.language:
            from coreai_opt.evaluation import evaluate_text

            text = self.evaluation if self.evaluation.suffix != ".safetensors" else None  # type: ignore[union-attr]
            ids = None if text is not None else self.evaluation
            found = evaluate_text(self.reference_path, [candidate], text=text, tokens=ids, max_tokens=self.tokens,
                                  progress=self.progress, device=self.device)  # fmt: skip
            ref, row = found.reference, found.candidates[0]
            if self.reference is None:
                self.reference = Measured(
                    self.reference_path, asset_bytes(self.reference_path), ref.perplexity
                )
            return Measured(candidate, size, row.perplexity, row.perplexity_increase, row.kl_mean, row.top1,
                            seconds=time.perf_counter() - began)  # fmt: skip
        from coreai_opt.comparison import compare_many

        (result,) = compare_many(self.reference_path, [candidate], inputs=self.evaluation,
                                 samples=self.samples if self.evaluation is None else 1,
                                 progress=self.progress)  # fmt: skip
        if self.reference is None:
            self.reference = Measured(self.reference_path, asset_bytes(self.reference_path))
        means = [o.spread.cosine_mean for o in result.outputs if o.spread.cosine_mean is not None]
        return Measured(candidate, size, cosine=result.worst_cosine, mean_cosine=min(means) if means else None,
                        seconds=time.perf_counter() - began)  # fmt: skip


def _token_ids(path: Path) -> bool:
    """Whether a safetensors file holds token ids (integers) rather than model inputs."""
    if path.suffix != ".safetensors" or not path.is_file():
        return False
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            keys = list(handle.keys())
            return len(keys) == 1 and str(handle.get_slice(keys[0]).get_dtype()).upper().startswith(
                ("I", "U")
            )
    except Exception:
        return False
