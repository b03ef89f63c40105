"""Models from where people keep them: a local Hugging Face folder or a GGUF file, exported to a
`.pt2` for Core AI (`export_model`, `export_file`; a causal language model also as a stateful
decoder with its key/value cache, taking `STATE_INPUTS`), with what the model is and its tokenizer kept
beside the program (`model_info`, `model_tokenizer`) for the commands that follow."""

from ._chat import ChatFormat, chat_format
from ._exporter import ExportedModel, export_model
from ._families import FAMILIES, Family, ModelKind, supported
from ._files import ExportFileResult, export_file
from ._recache import CacheError, KVCacheReport, check_kv_dtype, quantize_kv_cache
from ._sidecar import (
    ModelInfo,
    Sidecars,
    copy_sidecars,
    info_path,
    model_info,
    model_tokenizer,
    read_sidecars,
    read_tokenizer,
    tokenizer_path,
    write_sidecars,
)
from ._source import ModelSource, open_source
from ._stateful import INPUTS as STATE_INPUTS
from ._stateful import KV_DTYPES, PREFILL_CHUNK, decoder_context, decoder_entries, decoder_problem

__all__ = [
    "FAMILIES",
    "KV_DTYPES",
    "PREFILL_CHUNK",
    "STATE_INPUTS",
    "CacheError",
    "ChatFormat",
    "ExportFileResult",
    "ExportedModel",
    "Family",
    "KVCacheReport",
    "ModelInfo",
    "ModelKind",
    "ModelSource",
    "Sidecars",
    "chat_format",
    "check_kv_dtype",
    "copy_sidecars",
    "decoder_context",
    "decoder_entries",
    "decoder_problem",
    "export_file",
    "export_model",
    "info_path",
    "model_info",
    "model_tokenizer",
    "open_source",
    "quantize_kv_cache",
    "read_sidecars",
    "read_tokenizer",
    "supported",
    "tokenizer_path",
    "write_sidecars",
]
