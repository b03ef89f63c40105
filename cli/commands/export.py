"""`coreopt export`: a local Hugging Face folder or GGUF file to a `.pt2` for Core AI."""

from __future__ import annotations

from pathlib import Path

import typer

from .._common import force_option, human_bytes, json_option, print_json, quiet_option, shown, user_errors


def register(app: typer.Typer) -> None:
    app.command("export")(export)


def export(
    source: Path = typer.Argument(
        ..., help="A local Hugging Face model folder (config.json + *.safetensors) or a .gguf file."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="The .pt2 to write."),
    seq_len: int = typer.Option(128, "--seq-len", min=2, help="Tokens per sequence the program takes."),
    batch: int = typer.Option(1, "--batch", min=1, help="Sequences per run."),
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
    """
    from coreai_opt.models import export_file

    from .._progress import spinner
    from ..render import console, print_line

    flags = {"seq_len": "--seq-len", "batch": "--batch"}
    with user_errors(as_json, flags), spinner(not (quiet or as_json), f"exporting {shown(source.name)}"):
        result = export_file(source, output, seq_len=seq_len, batch=batch, force=force)
    if as_json:
        print_json(result.to_dict())
        return
    info = result.info
    line = (
        f"export {result.source} -> {result.output}: {info.model_type} {info.kind.value}, "
        f"{result.parameters / 1e6:.1f}M parameters, [{info.batch}, {info.seq_len}] tokens, "
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
