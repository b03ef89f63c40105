"""What a calibration measures a program's outputs by: the loss its squared gradients are taken
of, and how far a candidate's outputs are from the program's own.

A language model (int ids in, [batch, tokens, vocabulary] logits out over a vocabulary that holds
every id) is measured for the Fisher pass by the cross entropy of next tokens drawn from its own
predictions, and a candidate by its mean next-token KL divergence from the reference; any other
model by its outputs' squared error - for the Fisher pass as one seeded random-sign projection a
sample (Hutchinson: its expectation is the diagonal of J^T J), for a candidate relative to the
reference's energy. Drawn tokens make the squared gradients the true Fisher's diagonal, the
curvature of that KL at the program itself: each position's gradient has mean zero, so the cross
terms between positions vanish in expectation. The text's own next tokens (the empirical Fisher)
weigh where the model and the text disagree instead (docs/benchmarks.md, 2026-12-02: the two
measured on SmolLM2's 4-bit plan). Kept apart from the passes that use them (`_fisher`,
`ProgramCalibration.divergence`): both must tell a language model the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_DRAW_ROWS = 256  # rows of logits a piece of the draws: 50 MB of probabilities at a 49,152-token vocabulary


def sample_loss(output: Any, inputs: tuple[Any, ...], generator: Any) -> tuple[torch.Tensor, int]:
    """(loss, rows): for a language model the cross entropy of next tokens drawn from its own
    predictions (with `generator`, on the CPU), else the output's squared error as one
    random-sign projection of it."""
    import torch

    leaves = _float_leaves(output)
    ids = _language_ids(leaves, inputs)
    first = leaves[0]
    if ids is not None:
        logits = first[:, :-1].reshape(-1, first.shape[-1]).float()
        targets = _drawn_tokens(logits, generator)
        return torch.nn.functional.cross_entropy(logits, targets, reduction="sum"), targets.numel()
    loss = sum(
        (leaf.float() * (torch.randint(0, 2, leaf.shape, generator=generator) * 2 - 1).to(leaf.device)).sum()
        for leaf in leaves
    )
    return loss, sum(leaf.numel() for leaf in leaves)  # type: ignore[return-value]


def _drawn_tokens(logits: torch.Tensor, generator: Any) -> torch.Tensor:
    """A next token for each row of `logits`, drawn from its softmax by the CPU `generator` (the
    same draws on any device), a piece of rows at a time."""
    import torch

    drawn = torch.empty(logits.shape[0], dtype=torch.int64)
    with torch.no_grad():
        for top in range(0, logits.shape[0], _DRAW_ROWS):
            probabilities = torch.softmax(logits[top : top + _DRAW_ROWS].float(), dim=-1).cpu()
            drawn[top : top + _DRAW_ROWS] = torch.multinomial(probabilities, 1, generator=generator)[:, 0]
    return drawn.to(logits.device)


def _float_leaves(output: Any) -> list[torch.Tensor]:
    import torch

    return [
        t
        for t in torch.utils._pytree.tree_leaves(output)
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]


def _language_ids(leaves: list[torch.Tensor], inputs: tuple[Any, ...]) -> torch.Tensor | None:
    """The [batch, tokens] ids of a language model's sample (its first output is logits
    [batch, tokens, vocabulary] over a vocabulary that holds every id), or None for any other
    model - a token tagger's [batch, tokens, labels] scores included: its labels are not its ids."""
    ids = next((t for t in inputs if not t.is_floating_point() and t.dim() == 2), None)
    first = leaves[0]
    if ids is None or first.dim() != 3 or first.shape[:2] != ids.shape or first.shape[1] < 2:
        return None
    return ids if int(ids.min()) >= 0 and int(ids.max()) < first.shape[-1] else None


def output_divergence(output: Any, reference: Any, inputs: tuple[Any, ...]) -> torch.Tensor:
    """A language model's mean next-token KL divergence from the reference's distribution, or
    for any other model each float output's squared error relative to its reference's energy."""
    import torch

    leaves, held = _float_leaves(output), _float_leaves(reference)
    if _language_ids(held, inputs) is not None:
        logp = torch.log_softmax(held[0].float(), dim=-1)
        logq = torch.log_softmax(leaves[0].float(), dim=-1)
        return (logp.exp() * (logp - logq)).sum(-1).mean()
    return sum(
        ((leaf.float() - ref.float()) ** 2).mean() / (ref.float() ** 2).mean().clamp_min(1e-30)
        for leaf, ref in zip(leaves, held, strict=True)
    )  # type: ignore[return-value]
