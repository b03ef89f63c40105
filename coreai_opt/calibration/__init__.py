"""Calibration data and what a program does with it: the statistics compression learns from.

`Samples` says where samples come from (a safetensors file or directory, seeded draws, token
windows of a text with the model's tokenizer); `calibrate(program, samples)` gives a
`weights.Calibration` for a `torch.export` program - per-weight input moments, input Gram
matrices or squared gradients, one pass or layer by layer, keyed by the weight names every
container shares and cached on disk by program and samples (`COREOPT_CACHE`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ._samples import (
    ALL_TOKENS,
    DEFAULT_TEXT_TOKENS,
    RANDOM,
    Samples,
    Source,
    check_source,
    is_text,
    recorded_budget,
    text_tokens,
    token_budget,
)
from ._spec import CalibrationSpec

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from ._capture import ProgramCalibration
    from ._kept import KeptSquares

__all__ = [
    "ALL_TOKENS",
    "DEFAULT_TEXT_TOKENS",
    "RANDOM",
    "CalibrationSpec",
    "Samples",
    "Source",
    "cache_folder",
    "calibrate",
    "check_source",
    "is_text",
    "kept_squares",
    "recorded_budget",
    "text_tokens",
    "token_budget",
]


def cache_folder() -> Path:
    """Where statistics (and what is learned from them) are kept between runs: `COREOPT_CACHE`,
    else ~/.cache/coreopt/calibration."""
    from ._cache import cache_folder as folder

    return folder()


def kept_squares(on_disk: bool = True) -> KeptSquares:
    """An empty mapping of statistics by name that keeps the squared gradients passed through its
    `keeping(passing)` in a private temporary folder and reads one weight's back when asked: a
    later step that reads them a weight at a time does not hold them all (SmolLM2-135M's 0.54 GB).
    Not `on_disk`: held as they came instead (squares that live on a GPU)."""
    from ._kept import KeptSquares

    return KeptSquares(on_disk)


def calibrate(
    program: ExportedProgram,
    samples: Samples,
    *,
    cache: bool = True,
    seed: int = 0,
    device: str | None = None,
    exact_gradients: bool = False,
) -> ProgramCalibration:
    """A calibration of `program` on `samples` (the samples are read, and checked, now), run on
    `device` (default: the CPU); its statistics stay there, and the methods that learn from them
    (GPTQ, SparseGPT) solve there. On a CPU with bfloat16 instructions the Fisher pass
    (`sensitive`) takes its weights' matrix products in bfloat16 (SmolLM2-135M's compression
    139 -> 93 s, its squared gradients within about 1% of the exact ones); `exact_gradients`
    keeps the program's own dtypes. Table tuning always keeps them (bfloat16 saved it 14% at a
    slightly worse held-out KL: docs/benchmarks.md)."""
    from ._capture import ProgramCalibration

    return ProgramCalibration(
        program, samples, cache=cache, seed=seed, device=device, exact_gradients=exact_gradients
    )
