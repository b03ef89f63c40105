"""`EvalConfig`: how `eval` scores - how much text, the windows' stride, and the bounds a candidate
must stay within - declared once with its flags (the CLI's options are these fields)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from coreai_opt.compression import check_options, option, plain_fields
from coreai_opt.errors import ConfigError

CONFIG_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """`max_tokens` scored at most (`max_items` of a task), windows every `stride` tokens (None: the window), and the
    bounds a candidate fails (`max_ppl_increase` in percent, `max_kl` mean per token)."""

    max_tokens: int | None = option(None, "--max-tokens", "Score at most this many tokens.", minimum=2)
    max_items: int | None = option(
        None, "--max-items", "With --task: score at most this many items.", minimum=1
    )
    stride: int | None = option(
        None, "--stride", "Tokens between window starts (default: the window; less gives context).", minimum=1
    )
    max_ppl_increase: float | None = option(
        None, "--max-ppl-increase", "Exit 1 when a candidate's perplexity rises more than this many percent."
    )
    max_kl: float | None = option(None, "--max-kl", "Exit 1 when a candidate's mean KL exceeds this.")
    device: str | None = option(
        None,
        "--device",
        "Where .pt2 programs run: cpu (default), cuda, cuda:1, ... (an .aimodel: the Core AI runtime).",
    )

    def __post_init__(self) -> None:
        check_options(self)
        for name in ("max_ppl_increase", "max_kl"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise ConfigError(f"{name} is a number of 0 or more, not {value!r}", name)

    def failures(self, result: Any) -> list[str]:
        """What the bounds say of a `TextEvaluation`'s candidates, a line per candidate over one."""
        rise = None if self.max_ppl_increase is None else self.max_ppl_increase / 100
        return result.failures(rise, self.max_kl)  # type: ignore[no-any-return]

    def to_dict(self) -> dict[str, Any]:
        return {"version": CONFIG_VERSION} | dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> EvalConfig:
        return cls(**plain_fields(cls, data, CONFIG_VERSION))
