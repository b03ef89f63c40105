"""The next token from a row of logits: the most likely one, or a draw as transformers' sampling
makes it (temperature, then top-k, then top-p, then a multinomial draw)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ._config import GenerateConfig


def next_token(logits: torch.Tensor, config: GenerateConfig, generator: torch.Generator | None) -> int:
    """The token `config` picks from `logits [vocab]` (float32 scores; ties: the lowest id)."""
    import torch

    scores = logits.float()
    if config.greedy:
        return int(scores.argmax())
    scores = scores / config.temperature
    if 0 < config.top_k < scores.numel():
        kth = torch.topk(scores, config.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if config.top_p < 1:
        ordered, order = torch.sort(scores, descending=False)
        tail = ordered.softmax(-1).cumsum(-1) <= 1 - config.top_p
        tail[-1] = False  # the most likely token always stays
        scores = scores.masked_fill(tail.scatter(0, order, tail), float("-inf"))
    return int(torch.multinomial(scores.softmax(-1), 1, generator=generator))
