"""`GenerateConfig`: how `generate` picks each next token - how many, greedy or sampled, and from
what share of the distribution - declared once with its flags (the CLI's options are these fields)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from coreai_opt.compression import check_options, option, plain_fields
from coreai_opt.errors import ConfigError

CONFIG_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class GenerateConfig:
    """`max_new_tokens` at most; `temperature` 0 takes the most likely token (greedy, what
    transformers' `generate` does by default), above 0 samples from the distribution sharpened
    or flattened by it, kept to its `top_k` most likely tokens (0: all) and to the smallest set
    whose probability reaches `top_p`, drawn with `seed`; generation stops at an end-of-sequence
    token unless `ignore_eos`."""

    max_new_tokens: int = option(64, "--max-new-tokens", "Tokens to generate at most.", minimum=1)
    temperature: float = option(0.0, "--temperature", "0: greedy; above 0: sample, sharper below 1.")
    top_k: int = option(0, "--top-k", "Sample from the k most likely tokens only (0: all).", minimum=0)
    top_p: float = option(1.0, "--top-p", "Sample from the most likely tokens that reach this probability.")
    seed: int = option(0, "--seed", "Seed of the sampling (the same seed gives the same tokens).", minimum=0)
    ignore_eos: bool = option(False, "--ignore-eos", "Go on past an end-of-sequence token.")

    def __post_init__(self) -> None:
        check_options(self)
        for name, low, high, low_open in (("temperature", 0.0, 100.0, False), ("top_p", 0.0, 1.0, True)):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value > high
                or value < low
                or (low_open and value == low)
            ):
                span = f"({low:g}, {high:g}]" if low_open else f"[{low:g}, {high:g}]"
                raise ConfigError(f"{name} is a number in {span}, not {value!r}", name)
        if not isinstance(self.ignore_eos, bool):
            raise ConfigError(f"ignore_eos is true or false, not {self.ignore_eos!r}", "ignore_eos")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict[str, Any]:
        return {"version": CONFIG_VERSION} | dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> GenerateConfig:
        return cls(**plain_fields(cls, data, CONFIG_VERSION))
