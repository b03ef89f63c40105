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

import itertools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

INPUTS = ("input_ids", "position")  # what a stateful decoder takes, in order
KV_DTYPES = ("int8", "fp8", "int4")  # a quantized cache's codes (None: the activations' float dtype)
PREFILL_CHUNK = 64  # tokens the converted program's prefill entry takes a call (at most the context)
KEY, VALUE = "key_cache_{}", "value_cache_{}"  # its state buffers, by layer
KEY_SCALE, VALUE_SCALE = "key_scale_{}", "value_scale_{}"  # a quantized cache's scales, by layer
_FP16_MAX = 65504.0
_ROTATABLE = (16, 4096)  # head dims tcast.hadamard turns (powers of two)
_INT4_RUN = 32  # values of a head vector that share one int4 scale and least
_SHRINKS = (1.0, 0.95, 0.9, 0.85)  # int4 ranges tried for each run, as shares of its own
_KV_SEED = 0  # the cache rotation's signs
_FP8_MAX = 448.0  # float8 e4m3fn's largest finite value (code 0x7E; 0x7F is NaN, never written)
_ATTENTION = "coreopt_rotated_kv"  # the attention that meets a rotated cache
ROTATION = "kv_rotation"  # the buffer of a rotated cache's [head-dim, head-dim] turning matrix


def _rotated_attention(model: Any, head_dim: int, turn: list[Any]) -> None:
    """Give `model` the cache's rotation (`ROTATION`: tcast's seeded random Hadamard matrix, whose
    entries are all +-1/sqrt(head-dim)) and make it attend through `_ATTENTION`: transformers' SDPA
    attention of queries turned as the cached keys were (x R), its output turned back (x R^T: the
    cached values are turned too). `turn[0]` is the matrix as the trace under way sees it."""
    import torch
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    import tcast

    model.register_buffer(
        ROTATION, tcast.hadamard(torch.eye(head_dim), -1, head_dim, _KV_SEED), persistent=True
    )

    def attention(module: Any, query: Any, key: Any, value: Any, mask: Any, **kwargs: Any) -> Any:
        rotation = turn[0].to(query.dtype)
        out, weights = sdpa_attention_forward(module, query @ rotation, key, value, mask, **kwargs)
        return out @ rotation.T, weights

    AttentionInterface.register(_ATTENTION, attention)
    AttentionMaskInterface.register(_ATTENTION, sdpa_mask)
    model.config._attn_implementation = _ATTENTION


def stateful_program(
    model: Any, context: int, example: torch.Tensor, kv_dtype: str | None = None
) -> ExportedProgram:
    """`model` (a causal LM, float32) exported with a cache of `context` positions: T tokens from 1 to
    `context` per call (a dynamic dimension), traced on `example` [1, T] at position 0; with
    `kv_dtype`, the cache holds codes (`_KVCodes`) and their scales instead of floats."""
    import torch

    _give_cache(model, context, kv_dtype)
    tokens = torch.export.Dim("tokens", min=1, max=context)
    return torch.export.export(
        model, (example, torch.zeros(1, dtype=torch.long)), dynamic_shapes=({1: tokens}, None), strict=False
    )


def _give_cache(model: Any, context: int, kv_dtype: str | None) -> None:
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
    turn: list[Any] = [None]  # a rotated cache's matrix, as the trace under way sees it
    codes = _KVCodes(kv_dtype, head_dim, turn) if kv_dtype is not None else None
    if codes is not None and codes.rotated:
        _rotated_attention(model, head_dim, turn)
    cache.layers = [_positioned_layer(context, where, codes) for _ in cache.layers]
    cache.early_initialization(1, kv_heads, head_dim, torch.float32, torch.device("cpu"))
    names = [KEY, VALUE] if codes is None else [KEY, VALUE, KEY_SCALE, VALUE_SCALE]
    slots = list(
        zip(names, ("keys", "values", "key_scales", "value_scales"), strict=False)
    )  # buffer, attribute
    for index, layer in enumerate(cache.layers):
        if codes is not None:
            layer.keys, layer.values = codes.empty(layer.keys), codes.empty(layer.values)
            layer.key_scales, layer.value_scales = codes.scales(layer.keys), codes.scales(layer.values)
        for name, attribute in slots:
            model.register_buffer(name.format(index), getattr(layer, attribute), persistent=True)
    base = type(model)

    def forward(self: Any, input_ids: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        where[0] = position
        turn[0] = getattr(self, ROTATION, None)
        for i, layer in enumerate(cache.layers):  # the buffers as this trace sees them
            for name, attribute in slots:
                setattr(layer, attribute, getattr(self, name.format(i)))
        positions = (position + torch.arange(input_ids.shape[1], device=input_ids.device))[None]
        out = base.forward(self, input_ids=input_ids, position_ids=positions, past_key_values=cache,
                           use_cache=True, return_dict=True)  # fmt: skip
        return out.logits

    model.__class__ = type(base.__name__, (base,), {"forward": forward})


def _positioned_layer(context: int, where: list[Any], codes: _KVCodes | None) -> Any:
    """A static cache layer that writes at `where[0] + 0..T-1` instead of counting what it was given;
    with `codes`, it writes each token's codes and scale and returns the whole cache decoded."""
    import torch
    from transformers.cache_utils import StaticLayer

    class PositionedLayer(StaticLayer):
        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> Any:
            at = where[0] + torch.arange(key_states.shape[-2], device=key_states.device)
            if codes is None:
                self.keys.index_copy_(2, at, key_states)
                self.values.index_copy_(2, at, value_states)
                return self.keys, self.values
            return (
                codes.write(self.keys, self.key_scales, key_states, at),
                codes.write(self.values, self.value_scales, value_states, at),
            )

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


def _int4_runs(runs: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes in [0, 15], scale and least (in `dtype`) of each run [..., n, run]: of the ranges
    `_SHRINKS` of the run's own (centred on it), the one whose codes lose the least squared error
    (all tried at once along a leading axis, then kept by comparison)."""
    import torch

    low, high = runs.amin(-1, keepdim=True), runs.amax(-1, keepdim=True)
    middle, half = (low + high) / 2, (high - low) / 2
    shrinks = torch.tensor(_SHRINKS, dtype=runs.dtype, device=runs.device).reshape(-1, *[1] * runs.dim())
    least = (middle - half * shrinks).clamp(-_FP16_MAX, _FP16_MAX).to(dtype)
    scale = (2 * half * shrinks / 15).clamp(max=_FP16_MAX).to(dtype)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    base, step = least.to(runs.dtype), scale.to(runs.dtype)
    codes = torch.round((runs - base) / step).clamp(0, 15)
    errors = ((codes * step + base - runs) ** 2).sum(-1, keepdim=True)
    found = codes[0], scale[0], least[0], errors[0]
    for i in range(1, len(_SHRINKS)):  # the first of the least errors (Core AI converts no argmin)
        better = errors[i] < found[3]
        found = tuple(
            torch.where(better, new[i], old)
            for new, old in zip((codes, scale, least, errors), found, strict=True)
        )
    return found[0], found[1], found[2]


def _fp8_magnitudes() -> list[float]:
    """The values of float8 e4m3fn's magnitude codes 0..126 (exponent bias 7, 3 mantissa bits;
    exponent 0: subnormals of 2^-9)."""
    return [(m % 8) * 2.0**-9 if m < 8 else (8 + m % 8) * 2.0 ** (m // 8 - 10) for m in range(127)]


def _fp8_codes(values: torch.Tensor) -> torch.Tensor:
    """float8 e4m3fn codes of `values` (at most 448 in magnitude; larger saturate) as floats 0..255:
    the sign in the top bit, the magnitude code counting the midpoints below it - to nearest, a tie
    to the even code (a code's parity is its mantissa's) - exactly what a cast to float8_e4m3fn gives."""
    import torch

    table = _fp8_magnitudes()
    middles = [(a + b) / 2 for a, b in itertools.pairwise(table)]
    strict = torch.tensor(middles[0::2], dtype=values.dtype)  # below an even code: a tie stays there
    loose = torch.tensor(middles[1::2], dtype=values.dtype)  # below an odd code: a tie goes up, to even
    size = values.abs().unsqueeze(-1)
    magnitude = (size > strict).sum(-1) + (size >= loose).sum(-1)
    return magnitude.to(values.dtype) + 128 * (values < 0).to(values.dtype)


def _fp8_values(codes: torch.Tensor) -> torch.Tensor:
    """The values of float8 e4m3fn codes (floats 0..255; 127 and 255, NaN codes, read as 480)."""
    import torch

    sign = torch.floor(codes / 128)
    magnitude = codes - 128 * sign
    exponent = torch.floor(magnitude / 8)
    mantissa = magnitude - 8 * exponent
    normal = (8 + mantissa) * torch.exp2(exponent - 10)
    return torch.where(exponent > 0, normal, mantissa * 2.0**-9) * (1 - 2 * sign)


class _KVCodes:
    """A quantized cache: each token's vector of one kv-head (its head-dim values) as integer codes
    with float16 parameters in a second buffer `[1, kv-heads, context, k]`, decoded where attention
    reads the whole cache (in the activations' dtype); rounding is to nearest even.
    - int8: symmetric codes in [-127, 127] of the vector's largest magnitude (k = 1 scale: 66
      bytes for 64 values);
    - fp8: float8 e4m3fn codes (stored as bytes, encoded and decoded by arithmetic Core AI
      converts) of the vector over its largest magnitude times 448 (k = 1 scale);
    - int4: first turned by a seeded random Hadamard rotation of the head dim (where it is a power of
      two from 16: QuaRot's online rotation of the cache, so the keys' outlier channels spread over
      all of them; attention turns the queries the same way and its output back, `_rotated_attention`),
      then asymmetric codes in [0, 15] of each run of 32 values over a range chosen among the run's
      own and that range shrunk around its middle (`_SHRINKS`: whichever loses the least squared
      error; k = a scale and a least per run), two codes a byte, the even element in the low nibble
      (40 bytes for 64 values)."""

    def __init__(self, dtype: str, head_dim: int, turn: list[Any]) -> None:
        if dtype not in KV_DTYPES:
            raise ValueError(f"a key/value cache holds {' or '.join(KV_DTYPES)} codes, not {dtype!r}")
        self.packed = dtype == "int4"
        self.float8 = dtype == "fp8"
        self.rotated = (
            self.packed and _ROTATABLE[0] <= head_dim <= _ROTATABLE[1] and not head_dim & (head_dim - 1)
        )
        self.turn = turn
        self.run = (
            min(_INT4_RUN, head_dim) if self.packed and head_dim % min(_INT4_RUN, head_dim) == 0 else head_dim
        )

    def empty(self, floats: torch.Tensor) -> torch.Tensor:
        import torch

        if self.packed:
            return torch.zeros((*floats.shape[:-1], floats.shape[-1] // 2), dtype=torch.uint8)
        return torch.zeros(floats.shape, dtype=torch.uint8 if self.float8 else torch.int8)

    def scales(self, codes: torch.Tensor) -> torch.Tensor:
        import torch

        per_token = 2 * (2 * codes.shape[-1] // self.run) if self.packed else 1
        return torch.zeros((*codes.shape[:-1], per_token), dtype=torch.float16)

    def write(
        self, store: torch.Tensor, scales: torch.Tensor, states: torch.Tensor, at: torch.Tensor
    ) -> torch.Tensor:
        """Encode `states` [1, heads, T, dim] into `store` / `scales` at positions `at`; the whole
        cache decoded in the states' dtype."""
        import torch

        if not self.packed:
            top = _FP8_MAX if self.float8 else 127
            scale = (states.abs().amax(-1, keepdim=True) / top).clamp(max=_FP16_MAX).to(scales.dtype)
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))
            scaled = states / scale.to(states.dtype)
            codes = _fp8_codes(scaled) if self.float8 else torch.round(scaled).clamp(-127, 127)
            parameters = scale
        else:
            if self.rotated:
                states = states @ self.turn[0].to(states.dtype)
            runs = states.unflatten(-1, (-1, self.run))
            codes, scale, least = _int4_runs(runs, scales.dtype)
            codes = codes.flatten(-2)
            codes = codes[..., 1::2] * 16 + codes[..., 0::2]
            parameters = torch.cat([scale, least], -1).flatten(-2)
        store.index_copy_(2, at, codes.to(store.dtype))
        scales.index_copy_(2, at, parameters)
        return self.decode(store, scales, states.dtype)

    def decode(self, store: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        import torch

        values = store.to(dtype)
        if not self.packed:
            return (_fp8_values(values) if self.float8 else values) * scales.to(dtype)
        high = torch.floor(values / 16)
        codes = torch.stack([values - 16 * high, high], -1).flatten(-2).unflatten(-1, (-1, self.run))
        scale, least = scales.to(dtype).unflatten(-1, (-1, 2)).unbind(-1)
        return (codes * scale[..., None] + least[..., None]).flatten(-2)
