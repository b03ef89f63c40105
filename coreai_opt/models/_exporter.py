"""`torch.export` of a Hugging Face model at a fixed batch and sequence length, for Core AI.

The model is loaded by transformers from the checked source only (local files, safetensors or
GGUF, no remote code), in float32, with the config transformers makes of the source checked
against the stored weights first and every parameter loaded from them (none left randomly
initialised), and exported with coreai-torch's decompositions - the form
every coreopt pass and the converter take. Weights keep their Hugging Face names (what
`--override` and the reports use): the model's own class is given a forward that returns plain
tensors (logits; or the last hidden state and pooled output) instead of wrapping it in a module
that would prefix every name.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coreai_opt.errors import ConfigError
from coreai_opt.io import ModelFileError, one_line

from ._chat import chat_format
from ._families import ModelKind
from ._loading import Given, given_folder, quiet
from ._sidecar import ModelInfo
from ._sizes import check_sizes, stated_values
from ._source import ModelSource, open_source
from ._stateful import KV_DTYPES
from ._tokenizer import source_tokenizer

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

_POSITIONS = ("max_position_embeddings", "n_positions")
_SHOWN_MISSING = 3  # weights named when some are missing
_TRACED_TOKENS = 8  # a stateful decoder is traced on this many tokens (its token count is dynamic)


@dataclass
class ExportedModel:
    """A freshly exported program, what it is, and its tokenizer (`tokenizer.json` text, or None)."""

    program: ExportedProgram
    info: ModelInfo
    tokenizer: str | None
    parameters: int
    seconds: float


def export_model(
    source: Path | str,
    *,
    seq_len: int = 128,
    batch: int = 1,
    seed: int = 0,
    context: int | None = None,
    kv_cache_dtype: str | None = None,
) -> ExportedModel:
    """Export a local Hugging Face folder or GGUF file (see `open_source`) for Core AI.

    A causal language model takes `input_ids [batch, seq_len]` (int64) and returns logits
    `[batch, seq_len, vocab]`; an encoder takes `input_ids` and `attention_mask` and returns its
    last hidden state (and its pooled output where it has a pooler). With `context`, a causal
    language model is exported as a stateful decoder instead (`_stateful`: its key/value cache of
    `context` positions as state; 1 to `context` tokens a call at a given position; batch 1), its
    cache holding `kv_cache_dtype` codes and scales where given (one of `KV_DTYPES`; None: floats).
    `ModelFileError` names the source and the problem; `ConfigError` a bad length or dtype.
    """
    for name, value, least in (("seq_len", seq_len, 2), ("batch", batch, 1), ("context", context, 2)):
        if value is None and name == "context":
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ConfigError(f"{name} must be an integer of at least {least}, not {value!r}", name)
    if context is not None and batch != 1:
        raise ConfigError("a stateful decoder (context) takes one sequence: batch must be 1", "batch")
    if kv_cache_dtype is not None and (context is None or kv_cache_dtype not in KV_DTYPES):
        raise ConfigError(f"kv_cache_dtype is one of {', '.join(KV_DTYPES)} for a stateful decoder (context), "
                          f"not {kv_cache_dtype!r}", "kv_cache_dtype")  # fmt: skip
    start = time.perf_counter()
    src = open_source(source)
    if context is not None and src.family.kind is not ModelKind.CAUSAL_LM:
        raise ModelFileError(src.path, f"is a {src.family.kind.value}; only causal language models keep a "
                             "key/value cache")  # fmt: skip
    length = seq_len if context is None else context
    with given_folder(src) as given:  # the source's checked files only
        tokenizer = source_tokenizer(src, given)
        model = _load(src, given)
    _check_positions(src, model.config, length, "seq_len" if context is None else "context")
    program = _export(src, model, length, batch, seed, stateful=context is not None, kv_dtype=kv_cache_dtype)
    config = json.loads(json.dumps(model.config.to_dict(), default=str))
    info = ModelInfo(
        src.family.kind, src.family.model_type, batch, length,
        getattr(model.config, "vocab_size", None), str(src.path), config, context, chat_format(src.chat_template),
    )  # fmt: skip
    parameters = sum(p.numel() for p in model.parameters())
    return ExportedModel(program, info, tokenizer, parameters, time.perf_counter() - start)


def _load(src: ModelSource, given: Given) -> Any:
    """The model, built from the config transformers makes of the source (`given`) once that
    config's sizes are the stored weights' (`check_sizes`), every parameter loaded from the source."""
    import torch

    try:
        import transformers
    except ImportError:
        raise ImportError("exporting needs transformers: pip install 'coreopt[hf]'") from None
    auto = (
        transformers.AutoModelForCausalLM
        if src.family.kind is ModelKind.CAUSAL_LM
        else transformers.AutoModel
    )
    config = _transformers(
        src, lambda: transformers.AutoConfig.from_pretrained(given.folder, **given.options)
    )
    check_sizes(src.family, stated_values(src.family, config), src.stored, src.config_path)
    options = given.options | {"config": config, "dtype": torch.float32, "output_loading_info": True}
    if not src.gguf:
        options["use_safetensors"] = True
    pooler = src.family.shapes.pooler
    if pooler is not None and src.stored.find(pooler) is None:
        options["add_pooling_layer"] = False  # the checkpoint has none: export the encoder without one
    model, loading = _transformers(src, lambda: auto.from_pretrained(given.folder, **options))
    missing = sorted(loading.get("missing_keys", ()))
    if missing:
        named = ", ".join(missing[:_SHOWN_MISSING]) + (", ..." if len(missing) > _SHOWN_MISSING else "")
        raise ModelFileError(
            src.stored.path, f"lacks {len(missing)} weight(s) the model needs ({named}); they would be random"
        )
    return model.eval()


def _transformers(src: ModelSource, call: Callable[[], Any]) -> Any:
    """`call()` (a transformers loader), its failure one line naming the source."""
    try:
        with quiet():
            return call()
    except ImportError:
        raise
    except Exception as exc:  # transformers raises many types for a malformed folder or file
        text = one_line(exc, 200)
        if "accelerate" in text and "pip install" in text:
            raise ImportError("GGUF models need accelerate: pip install 'coreopt[hf]'") from None
        raise ModelFileError(src.path, f"transformers could not load it ({text})") from None


def _check_positions(src: ModelSource, config: Any, length: int, option: str) -> None:
    for name in _POSITIONS:
        limit = getattr(config, name, None)
        if isinstance(limit, int) and length > limit:
            raise ConfigError(f"{option} {length} exceeds the {limit} positions {src.path.name} has", option)


def _plain_outputs(model: Any, kind: ModelKind) -> None:
    """Give the model's class a forward that returns tensors, not a ModelOutput (whose pytree
    type a loader would need transformers for); the parameters keep their names."""
    base = type(model)
    if kind is ModelKind.CAUSAL_LM:

        def forward(self: Any, input_ids: torch.Tensor) -> torch.Tensor:
            return base.forward(self, input_ids=input_ids, use_cache=False, return_dict=True).logits

    else:

        def forward(self: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
            out = base.forward(self, input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
            pooled = getattr(out, "pooler_output", None)
            return out.last_hidden_state if pooled is None else (out.last_hidden_state, pooled)

    model.__class__ = type(base.__name__, (base,), {"forward": forward})


def traced_ids(model: Any, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """Seeded token ids of the model's vocabulary, [batch, length]: what a program is traced on."""
    import torch

    vocab = int(getattr(model.config, "vocab_size", 2) or 2)
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def _export(
    src: ModelSource, model: Any, seq_len: int, batch: int, seed: int, *, stateful: bool = False,
    kv_dtype: str | None = None,
) -> ExportedProgram:  # fmt: skip
    import torch

    from coreai_opt._export import coreai_decompositions

    from ._stateful import stateful_program

    ids = traced_ids(model, batch, min(seq_len, _TRACED_TOKENS) if stateful else seq_len, seed)
    kwargs = {"input_ids": ids}
    if src.family.kind is ModelKind.ENCODER:
        kwargs["attention_mask"] = torch.ones_like(ids)
    if not stateful:
        _plain_outputs(model, src.family.kind)
    try:
        with torch.no_grad():
            if stateful:
                program = stateful_program(model, seq_len, ids, kv_dtype)
            else:
                program = torch.export.export(model, tuple(kwargs.values()), strict=False)
            return program.run_decompositions(coreai_decompositions())
    except Exception as exc:  # torch.export raises many types for code it cannot trace
        shape = f"a context of {seq_len}" if stateful else f"batch {batch}, seq_len {seq_len}"
        raise ModelFileError(src.path, f"does not export at {shape} ({one_line(exc, 200)})") from None
