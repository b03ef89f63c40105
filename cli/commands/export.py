"""`coreopt export`: a local Hugging Face folder or GGUF file to a `.pt2` for Core AI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from coreai_opt.models import KV_DTYPES

from .._common import (
    choices,
    force_option,
    human_bytes,
    json_option,
    print_json,
    quiet_option,
    shown,
    user_errors,
)

_CONTEXT = 512  # --kv-cache's positions unless --context says


KVDType = choices("KVDType", KV_DTYPES)


def register(app: typer.Typer) -> None:
    app.command("export")(export)


_SOURCE = typer.Argument(
    ..., help="A local Hugging Face model folder (config.json + *.safetensors) or a .gguf file."
)
_KV_CACHE = typer.Option(
    False, "--kv-cache", help="A stateful decoder for coreopt generate: its key/value cache as state."
)
_CONTEXT_OPTION = typer.Option(
    None, "--context", min=2, help=f"Positions the --kv-cache holds (default {_CONTEXT})."
)
_KV_DTYPE = typer.Option(
    None, "--kv-cache-dtype", help="Codes the --kv-cache holds, with float16 scales (default: floats)."
)


def export(
    source: Path = _SOURCE,
    output: Path = typer.Option(..., "--output", "-o", help="The .pt2 to write."),
    seq_len: int = typer.Option(128, "--seq-len", min=2, help="Tokens per sequence the program takes."),
    batch: int = typer.Option(1, "--batch", min=1, help="Sequences per run."),
    kv_cache: bool = _KV_CACHE,
    context: int | None = _CONTEXT_OPTION,
    kv_cache_dtype: KVDType | None = _KV_DTYPE,  # type: ignore[valid-type]
    force: bool = force_option(),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Export a model for Core AI: torch.export with coreai-torch's decompositions, float32.

    Causal language models (LLaMA, SmolLM, Mistral, Qwen2, GPT-2) take input_ids [batch, seq-len]
    and return logits; BERT-style encoders (BERT, RoBERTa, DistilBERT) take input_ids and
    attention_mask and return the last hidden state (and pooled output). Weights keep their
    Hugging Face names. The model's description and tokenizer are saved beside the program
    (<stem>.model.json, <stem>.tokenizer.json), and every coreopt command that writes a program
    from it copies them, so eval and text calibration find the tokenizer. Nothing is fetched from
    the network and no code from the source runs: pickled weights and custom model code are refused.

    Example: coreopt export ./SmolLM2-135M-Instruct -o smol.pt2 --seq-len 256

    Example: coreopt export model.Q8_0.gguf -o model.pt2 --json

    Example: coreopt export ./bert-base-uncased -o bert.pt2 --seq-len 128 --batch 4

    With --kv-cache, a causal language model becomes a stateful decoder for `coreopt generate`:
    input_ids [1, T] (T from 1 to --context: a prefill chunk or one token) and their first
    position in, logits out, each layer's keys and values written into cache buffers
    [1, kv-heads, context, head-dim] kept as the program's state.

    --kv-cache-dtype int8|fp8|int4 keeps the keys and values as codes with float16 scales (fp8:
    e4m3; int4: rotated, per run of 32 values): 3.9x / 3.9x / 6.4x fewer bytes than fp32.

    Example: coreopt export ./SmolLM2-135M-Instruct -o smol.kv.pt2 --kv-cache --context 512

    Example: coreopt export model.gguf -o s8.pt2 --kv-cache --context 256 --kv-cache-dtype int8
    """
    from coreai_opt.models import export_file

    from .._progress import spinner

    context = _context(kv_cache, context, kv_cache_dtype)
    dtype = kv_cache_dtype.value if kv_cache_dtype is not None else None
    flags = {
        "seq_len": "--seq-len",
        "batch": "--batch",
        "context": "--context",
        "kv_cache_dtype": "--kv-cache-dtype",
    }
    with user_errors(as_json, flags), spinner(not (quiet or as_json), f"exporting {shown(source.name)}"):
        result = export_file(
            source, output, seq_len=seq_len, batch=batch, context=context, kv_cache_dtype=dtype, force=force
        )
    if as_json:
        print_json(result.to_dict())
    else:
        _render(result, quiet)


def _context(kv_cache: bool, context: int | None, dtype: Any) -> int | None:
    """The cache's positions (None: a window program); --context or --kv-cache-dtype without
    --kv-cache is a usage error."""
    for given, flag in ((context, "--context"), (dtype, "--kv-cache-dtype")):
        if given is not None and not kv_cache:
            raise typer.BadParameter(f"{flag} shapes the --kv-cache; give --kv-cache too", param_hint=flag)
    return (context or _CONTEXT) if kv_cache else None


def _render(result: Any, quiet: bool) -> None:
    from ..render import console, print_line

    info = result.info
    shape = (
        f"[{info.batch}, {info.seq_len}] tokens"
        if info.context is None
        else f"a cache of {info.context} tokens"
    )
    line = (
        f"export {result.source} -> {result.output}: {info.model_type} {info.kind.value}, "
        f"{result.parameters / 1e6:.1f}M parameters, {shape}, "
        f"{human_bytes(result.output_bytes)} in {result.seconds:.1f} s"
    )
    if quiet:
        print_line(line)
        return
    console.print(shown(line))
    told = (
        shown(result.tokenizer) if result.tokenizer else "none found in the source (give --tokenizer to eval)"
    )
    console.print(f"  tokenizer: {told}")
