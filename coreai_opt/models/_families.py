"""Which Hugging Face architectures `coreopt export` takes, and what each returns.

One table: a family's `model_type` (config.json), the kind of model (a causal language model
returns next-token logits; an encoder returns its last hidden state and, where it has one, its
pooled output), and the GGUF `general.architecture` names that load as it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ModelKind(enum.Enum):
    CAUSAL_LM = "causal-lm"  # input_ids -> logits [batch, tokens, vocab]
    ENCODER = "encoder"  # input_ids, attention_mask -> last hidden state (, pooled output)


@dataclass(frozen=True)
class Family:
    model_type: str
    kind: ModelKind
    gguf: tuple[str, ...] = ()  # GGUF architecture names transformers loads as this family


FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (
        Family("llama", ModelKind.CAUSAL_LM, ("llama",)),  # SmolLM and SmolLM2 are LLaMA
        Family("mistral", ModelKind.CAUSAL_LM, ("mistral",)),
        Family("qwen2", ModelKind.CAUSAL_LM, ("qwen2",)),
        Family("gpt2", ModelKind.CAUSAL_LM, ("gpt2",)),
        Family("bert", ModelKind.ENCODER),
        Family("roberta", ModelKind.ENCODER),
        Family("distilbert", ModelKind.ENCODER),
    )
}
GGUF_ARCHITECTURES = {name: family for family in FAMILIES.values() for name in family.gguf}


def supported() -> str:
    """The families, for error messages and --help."""
    return ", ".join(sorted(FAMILIES))
