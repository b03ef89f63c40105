"""A causal language model with its key/value cache as program state, for token-by-token generation.

The exported program takes `input_ids [1, T]` (T from 1 to the context: a prefill chunk or one
decode token) and `position [1]` (the index of the first of them in the sequence), writes the T
keys and values of every layer into its cache buffers at those positions (`index_copy_`, which
coreai-torch's decompositions make an `index_put` and Core AI a state update), attends to what
is written up to each token, and returns `logits [1, T, vocab]`. The cache is one key and one value
buffer per layer, `[1, kv-heads, context, head-dim]`: grouped-query attention keeps its kv-heads.

The attention is the model's own (transformers' modelling code with a static cache whose layers
write at the given positions), so the tokens it predicts are transformers' own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

INPUTS = ("input_ids", "position")  # what a stateful decoder takes, in order
PREFILL_CHUNK = 64  # tokens the converted program's prefill entry takes a call (at most the context)
KEY, VALUE = "key_cache_{}", "value_cache_{}"  # its state buffers, by layer


def stateful_program(model: Any, context: int, example: torch.Tensor) -> ExportedProgram:
    """`model` (a causal LM, float32) exported with a cache of `context` positions: T tokens from 1 to
    `context` per call (a dynamic dimension), traced on `example` [1, T] at position 0."""
    import torch

    _give_cache(model, context)
    tokens = torch.export.Dim("tokens", min=1, max=context)
    return torch.export.export(
        model, (example, torch.zeros(1, dtype=torch.long)), dynamic_shapes=({1: tokens}, None), strict=False
    )


def _give_cache(model: Any, context: int) -> None:
    """Register the cache's buffers on `model` itself (its weights keep their names) and give its
    class a forward of (input_ids, position) that writes them."""
    import torch
    from transformers.cache_utils import StaticCache

    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    cache = StaticCache(max_cache_len=context, config=config)
    where: list[Any] = [None]  # the position tensor of the call under way, read by every layer
    cache.layers = [_positioned_layer(context, where) for _ in cache.layers]
    cache.early_initialization(1, kv_heads, head_dim, torch.float32, torch.device("cpu"))
    for index, layer in enumerate(cache.layers):
        model.register_buffer(KEY.format(index), layer.keys, persistent=True)
        model.register_buffer(VALUE.format(index), layer.values, persistent=True)
    base = type(model)

    def forward(self: Any, input_ids: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        where[0] = position
        for i, layer in enumerate(cache.layers):  # the buffers as this trace sees them
            layer.keys, layer.values = getattr(self, KEY.format(i)), getattr(self, VALUE.format(i))
        positions = (position + torch.arange(input_ids.shape[1], device=input_ids.device))[None]
        out = base.forward(self, input_ids=input_ids, position_ids=positions, past_key_values=cache,
                           use_cache=True, return_dict=True)  # fmt: skip
        return out.logits

    model.__class__ = type(base.__name__, (base,), {"forward": forward})


def _positioned_layer(context: int, where: list[Any]) -> Any:
    """A static cache layer that writes at `where[0] + 0..T-1` instead of counting what it was given."""
    import torch
    from transformers.cache_utils import StaticLayer

    class PositionedLayer(StaticLayer):
        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> Any:
            at = where[0] + torch.arange(key_states.shape[-2], device=key_states.device)
            self.keys.index_copy_(2, at, key_states)
            self.values.index_copy_(2, at, value_states)
            return self.keys, self.values

        def get_seq_length(self) -> Any:
            return where[0][0]

    return PositionedLayer(context)


def decoder_problem(program: ExportedProgram) -> str | None:
    """Why `program` is not a stateful decoder - `input_ids [1, T]` and `position [1]` (int64) in,
    logits out, key/value buffers of one context length updated - or None when it is one."""
    import torch

    signature = program.graph_signature
    inputs = {n.name: n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"}
    names = list(signature.user_inputs)
    if tuple(names) != INPUTS:
        return f"takes {', '.join(names) or 'nothing'}, not {', '.join(INPUTS)}"
    if any(not isinstance(inputs[n], torch.Tensor) or inputs[n].dtype != torch.long for n in names):
        return "its input_ids and position are not int64 tensors"
    mutated = list(signature.buffers_to_mutate.values())
    if not mutated or signature.user_inputs_to_mutate:
        return "updates no key/value cache (export it with --kv-cache)"
    lengths = {program.state_dict[name].shape[2] for name in mutated if program.state_dict[name].dim() == 4}
    if len(lengths) != 1 or len(mutated) != sum(program.state_dict[n].dim() == 4 for n in mutated):
        return "its state is not key/value buffers of one context length"
    return None


def decoder_context(program: ExportedProgram) -> int | None:
    """The positions a stateful decoder's cache holds (the most tokens one call takes), or None
    when `program` is not one."""
    if decoder_problem(program) is not None:
        return None
    first = next(iter(program.graph_signature.buffers_to_mutate.values()))
    return int(program.state_dict[first].shape[2])


def decoder_entries(program: ExportedProgram, chunk: int = PREFILL_CHUNK) -> dict[str, ExportedProgram]:
    """A stateful decoder at fixed token counts, as Core AI converts it (an `index_put` on a dynamic
    dimension does not convert): "main" takes one token (decode), "prefill" `chunk` tokens (at
    most the context); both write the same cache, and the converted program stores the weights
    once. Each is `program` traced again at its count (a program read from a file has passed the
    audit before this runs its graph)."""
    import torch

    from coreai_opt._export import coreai_decompositions

    context = decoder_context(program)
    if context is None:
        raise ValueError(f"not a stateful decoder: {decoder_problem(program)}")
    module = program.module()
    entries = {}
    for name, tokens in (("main", 1), ("prefill", min(chunk, context))):
        example = (torch.zeros(1, tokens, dtype=torch.long), torch.zeros(1, dtype=torch.long))
        with torch.no_grad():
            traced = torch.export.export(module, example, strict=False)
        entries[name] = traced.run_decompositions(coreai_decompositions())
    return entries
