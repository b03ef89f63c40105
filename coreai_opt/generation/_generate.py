"""Text from a stateful decoder: the prompt in one prefill call, then one call per new token."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from coreai_opt.errors import ConfigError

from ._config import GenerateConfig
from ._decoder import Decoder
from ._sampling import next_token


@dataclass(frozen=True)
class Generation:
    """What one `generate` call made: the prompt's ids, the new ids, why it stopped ("eos", "length":
    max_new_tokens, "context": the cache is full), and the seconds of the prefill (the prompt and
    the first new token) and of the decode steps after it."""

    prompt_tokens: list[int]
    tokens: list[int]
    stopped: str
    prefill_seconds: float
    decode_seconds: float
    state_bytes: int

    @property
    def prefill_tokens_per_s(self) -> float:
        return len(self.prompt_tokens) / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        steps = len(self.tokens) - 1
        return steps / self.decode_seconds if steps > 0 and self.decode_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens, "tokens": self.tokens, "stopped": self.stopped,
            "prefill_seconds": round(self.prefill_seconds, 4), "decode_seconds": round(self.decode_seconds, 4),
            "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 2),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 2), "state_bytes": self.state_bytes,
        }  # fmt: skip


def generate(
    decoder: Decoder,
    prompt: Sequence[int],
    config: GenerateConfig | None = None,
    *,
    eos: Sequence[int] = (),
    on_token: Callable[[int], None] | None = None,
) -> Generation:
    """Up to `config.max_new_tokens` tokens after `prompt` (its ids), each passed to `on_token` as it
    comes; stops after a token of `eos` (kept in the result) unless `config.ignore_eos`, or when
    the decoder's context is full. The cache is reset first: every call is a new sequence."""
    import torch

    config = config or GenerateConfig()
    prompt = [int(t) for t in prompt]
    if not prompt or len(prompt) > decoder.context:
        raise ConfigError(
            f"the prompt has {len(prompt)} tokens; this program's context holds 1 to {decoder.context}",
            "prompt",
        )
    generator = None if config.greedy else torch.Generator().manual_seed(config.seed)
    stops = set() if config.ignore_eos else {int(t) for t in eos}
    decoder.reset()
    began = time.perf_counter()
    logits = decoder(prompt, 0)[-1]
    tokens: list[int] = []
    prefill = decode_began = 0.0
    while True:
        token = next_token(logits, config, generator)
        tokens.append(token)
        if len(tokens) == 1:
            prefill = time.perf_counter() - began
            decode_began = time.perf_counter()
        if on_token is not None:
            on_token(token)
        position = len(prompt) + len(tokens) - 1  # where the token just made would be written
        stopped = _stop(token in stops, len(tokens) >= config.max_new_tokens, position >= decoder.context)
        if stopped:
            break
        logits = decoder([token], position)[-1]
    decode = time.perf_counter() - decode_began
    return Generation(prompt, tokens, stopped, prefill, decode, decoder.state_bytes)


def _stop(eos: bool, enough: bool, full: bool) -> str | None:
    """Why generation stops after a token, or None: "eos", "length" (max_new_tokens), "context"."""
    return "eos" if eos else "length" if enough else "context" if full else None
