"""Which Hugging Face architectures `coreopt export` takes, and what each returns.

One table: a family's `model_type` (config.json), the kind of model (a causal language model
returns next-token logits; an encoder returns its last hidden state and, where it has one, its
pooled output), the GGUF `general.architecture` names that load as it, and which config fields
the stored weights determine (`Shapes`: a config is checked against the weights before
transformers builds a model of its sizes).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace


class ModelKind(enum.Enum):
    CAUSAL_LM = "causal-lm"  # input_ids -> logits [batch, tokens, vocab]
    ENCODER = "encoder"  # input_ids, attention_mask -> last hidden state (, pooled output)


class Rule(enum.Enum):
    """How a config field relates to a stored weight's dimension."""

    EQUALS = "equals"  # the field is that dimension (a width, a vocabulary, a table's rows)
    DIVIDES = "divides"  # the field divides it (a head count, a head's width)
    BOUNDED = "bounded"  # no weight holds the field: at most UNSTORED_LIMIT


UNSTORED_LIMIT = 1 << 24  # positions a rotary model may claim (long-context models state ~1e6)
GGUF_LAYERS = ("block_count", r"^blk\.(\d+)\.")  # llama.cpp's layer count key and layer weight names


@dataclass(frozen=True)
class Dim:
    """A config field against axis `axis` of a stored weight: `weight` is its Hugging Face name
    after the model's prefix (the first layer's, for a layer's weight); in a GGUF file the weight is
    `gguf_weight`, read along `gguf_axis` (default `axis`: llama.cpp stores some weights transposed,
    GPT-2's Conv1D ones as linear layers), and the field the metadata key `<architecture>.<gguf_key>`."""

    field: str
    rule: Rule
    weight: str | None = None
    axis: int = 0
    gguf_weight: str | None = None
    gguf_key: str | None = None
    gguf_axis: int | None = None

    def axis_in(self, gguf: bool) -> int:
        """The axis of the weight that holds the field, in a GGUF file or in safetensors."""
        return self.gguf_axis if gguf and self.gguf_axis is not None else self.axis


@dataclass(frozen=True)
class Shapes:
    """What a family's config says that its weights must bear out."""

    layers: str  # the config field of the layer count
    layer: str  # a layer's weight names (a regular expression; group 1 is the layer's index)
    dims: tuple[Dim, ...]
    groups: tuple[str, str] | None = None  # (key/value heads, heads): the first divides the second
    pooler: str | None = None  # an encoder's pooler weight; a checkpoint without it exports without one

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.layers, *(dim.field for dim in self.dims))


_DECODER = Shapes(
    "num_hidden_layers", r"(?:^|\.)layers\.(\d+)\.",
    (
        Dim("vocab_size", Rule.EQUALS, "embed_tokens.weight", 0, "token_embd.weight", "vocab_size"),
        Dim("hidden_size", Rule.EQUALS, "embed_tokens.weight", 1, "token_embd.weight", "embedding_length"),
        Dim("intermediate_size", Rule.EQUALS, "layers.0.mlp.up_proj.weight", 0, "blk.0.ffn_up.weight",
            "feed_forward_length"),
        Dim("num_attention_heads", Rule.DIVIDES, "layers.0.self_attn.q_proj.weight", 0, "blk.0.attn_q.weight",
            "attention.head_count"),
        Dim("head_dim", Rule.DIVIDES, "layers.0.self_attn.q_proj.weight", 0, "blk.0.attn_q.weight",
            "rope.dimension_count"),
        Dim("num_key_value_heads", Rule.DIVIDES, "layers.0.self_attn.k_proj.weight", 0, "blk.0.attn_k.weight",
            "attention.head_count_kv"),
        Dim("max_position_embeddings", Rule.BOUNDED, gguf_key="context_length"),
        Dim("sliding_window", Rule.BOUNDED),
    ),
    groups=("num_key_value_heads", "num_attention_heads"),
)  # fmt: skip
# transformers drops a qwen2 GGUF file's `rope.dimension_count` (it makes head_dim of the widths):
# no config field is read from it, so none is checked against it.
_QWEN2 = replace(
    _DECODER,
    dims=tuple(
        replace(dim, gguf_key=None) if dim.gguf_key == "rope.dimension_count" else dim
        for dim in _DECODER.dims
    ),
)
_GPT2 = Shapes(
    "n_layer", r"(?:^|\.)h\.(\d+)\.",
    (
        Dim("vocab_size", Rule.EQUALS, "wte.weight", 0, "token_embd.weight"),
        Dim("n_embd", Rule.EQUALS, "wte.weight", 1, "token_embd.weight", "embedding_length"),
        Dim("n_positions", Rule.EQUALS, "wpe.weight", 0, "position_embd.weight"),
        Dim("n_inner", Rule.EQUALS, "h.0.mlp.c_fc.weight", 1, "blk.0.ffn_up.weight", gguf_axis=0),
        Dim("n_head", Rule.DIVIDES, "h.0.attn.c_proj.weight", 0, "blk.0.attn_output.weight", "attention.head_count"),
    ),
)  # fmt: skip
_BERT = Shapes(
    "num_hidden_layers",
    r"(?:^|\.)encoder\.layer\.(\d+)\.",
    (
        Dim("vocab_size", Rule.EQUALS, "embeddings.word_embeddings.weight", 0),
        Dim("hidden_size", Rule.EQUALS, "embeddings.word_embeddings.weight", 1),
        Dim("intermediate_size", Rule.EQUALS, "encoder.layer.0.intermediate.dense.weight", 0),
        Dim("max_position_embeddings", Rule.EQUALS, "embeddings.position_embeddings.weight", 0),
        Dim("type_vocab_size", Rule.EQUALS, "embeddings.token_type_embeddings.weight", 0),
        Dim("num_attention_heads", Rule.DIVIDES, "encoder.layer.0.attention.self.query.weight", 0),
    ),
    pooler="pooler.dense.weight",
)
_DISTILBERT = Shapes(
    "n_layers",
    r"(?:^|\.)transformer\.layer\.(\d+)\.",
    (
        Dim("vocab_size", Rule.EQUALS, "embeddings.word_embeddings.weight", 0),
        Dim("dim", Rule.EQUALS, "embeddings.word_embeddings.weight", 1),
        Dim("hidden_dim", Rule.EQUALS, "transformer.layer.0.ffn.lin1.weight", 0),
        Dim("max_position_embeddings", Rule.EQUALS, "embeddings.position_embeddings.weight", 0),
        Dim("n_heads", Rule.DIVIDES, "transformer.layer.0.attention.q_lin.weight", 0),
    ),
)


@dataclass(frozen=True)
class Family:
    model_type: str
    kind: ModelKind
    shapes: Shapes
    gguf: tuple[str, ...] = ()  # GGUF architecture names transformers loads as this family


FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (
        Family("llama", ModelKind.CAUSAL_LM, _DECODER, ("llama",)),  # SmolLM and SmolLM2 are LLaMA
        Family("mistral", ModelKind.CAUSAL_LM, _DECODER, ("mistral",)),
        Family("qwen2", ModelKind.CAUSAL_LM, _QWEN2, ("qwen2",)),
        Family("gpt2", ModelKind.CAUSAL_LM, _GPT2, ("gpt2",)),
        Family("bert", ModelKind.ENCODER, _BERT),
        Family("roberta", ModelKind.ENCODER, _BERT),
        Family("distilbert", ModelKind.ENCODER, _DISTILBERT),
    )
}
GGUF_ARCHITECTURES = {name: family for family in FAMILIES.values() for name in family.gguf}


def supported() -> str:
    """The families, for error messages and --help."""
    return ", ".join(sorted(FAMILIES))
