"""`CalibrationSpec`: where the statistics of the methods that learn from data come from - set once
for a whole recipe (every compress step that learns reads the same data), each field with its
command-line flag."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from coreai_opt.compression import check_options, option, plain_fields
from coreai_opt.errors import ConfigError

from ._samples import check_source, recorded_budget, token_budget

_SOURCE = (
    "Calibration samples for methods that learn from data: a safetensors file (one tensor per input, optionally "
    "[N, *shape] or [N, ...] for an input of [1, ...]) or a directory of them, a text file (token windows), or "
    "'random' (seeded draws)."
)
_TOKENS = "At most this many tokens of a text --calibration (default 16384; 'all': every one)."
_PROGRAM = (
    "For an .aimodel: the .pt2 it was converted from; the calibration runs through it and its statistics reach "
    "the .aimodel's weights by name."
)
_GRADIENTS = (
    "--method sensitive: the Fisher pass in the program's own dtypes (default on a CPU with bfloat16 "
    "instructions: its weights' matrix products in bfloat16, 1.5x faster end to end)."
)


@dataclass(frozen=True, kw_only=True)
class CalibrationSpec:
    """The samples (`source`: a file, a folder, a text or "random"; at most `samples` of them or
    `tokens` of a text), the `.pt2` an `.aimodel` was converted from (`program`), the torch
    `device` the calibration and the solves run on, and whether the Fisher pass keeps the
    program's own dtypes (`exact_gradients`)."""

    source: str = option(None, "--calibration", _SOURCE)  # required: None is refused
    samples: int | None = option(
        None, "--calibration-samples",
        "At most this many calibration samples (--calibration random draws this many; default 32).", minimum=1,
    )  # fmt: skip
    tokens: int | str | None = option(None, "--calibration-tokens", _TOKENS)
    program: str | None = option(None, "--calibration-program", _PROGRAM)
    device: str | None = option(
        None,
        "--device",
        "Where calibration runs and GPTQ / SparseGPT solve: cpu (default), cuda, cuda:1, ...",
    )
    exact_gradients: bool = option(False, "--exact-gradients", _GRADIENTS)

    def __post_init__(self) -> None:
        check_options(self)
        if self.source is None:
            raise ConfigError("calibration needs its source: a file, a folder, a text or 'random'", "source")
        for name in ("source", "program", "device"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{name} is a non-empty text, not {value!r}", name)
        check_source(self.source)
        object.__setattr__(self, "tokens", token_budget(self.tokens, source=self.source))
        if not isinstance(self.exact_gradients, bool):
            raise ConfigError(
                f"exact_gradients is true or false, not {self.exact_gradients!r}", "exact_gradients"
            )

    def to_dict(self) -> dict[str, Any]:
        """The fields that differ from their defaults (the source always)."""
        data = dataclasses.asdict(self)
        return {k: v for k, v in data.items() if k == "source" or v not in (None, False)}

    @classmethod
    def from_dict(cls, data: Any) -> CalibrationSpec:
        """A spec as `to_dict` wrote it (a budget as `recorded_budget` reads it)."""
        values = plain_fields(cls, data, 1)
        values["tokens"] = recorded_budget(values.get("tokens"), values.get("source"))
        return cls(**values)
