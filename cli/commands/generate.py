"""`coreopt generate`: text from a stateful decoder (`coreopt export --kv-cache`), token by token."""

from __future__ import annotations

import dataclasses
import inspect
import sys
from pathlib import Path
from typing import Any

import typer

from coreai_opt.compression import flag_names
from coreai_opt.generation import GenerateConfig

from .._common import human_bytes, json_option, print_json, quiet_option, trust_pickle_option, user_errors
from .._config_options import config_from_options, config_parameters, keyword


def register(app: typer.Typer) -> None:
    app.command("generate")(generate)


_MODEL = typer.Argument(
    ..., help="A stateful decoder: a .pt2 (coreopt export --kv-cache) or the .aimodel converted from it."
)
_PROMPT = typer.Option(None, "--prompt", "-p", help="The text to continue.")
_PROMPT_FILE = typer.Option(None, "--prompt-file", help="A UTF-8 file holding the text to continue.")
_TOKENIZER = typer.Option(
    None, "--tokenizer", help="A tokenizer.json (default: the one coreopt export saved beside MODEL)."
)
_CHAT = typer.Option(
    False,
    "--chat",
    help="Lay the prompt out as one user turn of the model's chat format (from its source's "
    "chat template; ChatML), opening the assistant's turn; stop at the end of that turn.",
)
_SYSTEM = typer.Option(
    None, "--system", help="With --chat: the system message (default: the one the chat template writes)."
)
_FIELDS = {f.name for f in dataclasses.fields(GenerateConfig)}


def generate(**values: Any) -> None:
    """Generate text with a stateful decoder: the prompt in one prefill call, then one call per new
    token, the key/value cache kept as the program's state. Tokens are printed as they come;
    at the end, the prefill and decode speeds (tokens per second) and the state's bytes.

    A .pt2 runs in PyTorch; an .aimodel (coreopt convert of such a .pt2: a "prefill" function
    of a fixed chunk and a one-token "main", sharing weights and cache) on the Core AI runtime.

    Greedy by default (the most likely token: transformers' own greedy tokens); --temperature
    above 0 samples (with --top-k, --top-p and --seed). Stops at the model's end-of-sequence
    token (unless --ignore-eos), after --max-new-tokens, or when the cache is full.
    --json prints prompt_tokens, tokens, text, prefill_tokens_per_s and decode_tokens_per_s.

    Example: coreopt export ./SmolLM2-135M-Instruct -o smol.kv.pt2 --kv-cache --context 512

    Example: coreopt generate smol.kv.pt2 --prompt "The capital of France is" --max-new-tokens 32

    Example: coreopt generate smol.kv.pt2 --chat --prompt "Name three rivers of Europe."

    Example: coreopt generate smol.kv.pt2 --prompt-file story.txt --temperature 0.7 --top-p 0.9 --seed 1 --json
    """
    from coreai_opt.generation import check_decoder_path

    as_json, quiet = values["as_json"], values["quiet"]
    config = config_from_options(GenerateConfig, {k: v for k, v in values.items() if k in _FIELDS})
    prompt = _prompt(values["prompt"], values["prompt_file"])
    if values["system"] is not None and not values["chat"]:
        raise typer.BadParameter(
            "--system sets the system message of --chat: give --chat too", param_hint="--system"
        )
    chat = (values["chat"], values["system"])
    model = values["model"]
    with user_errors(as_json, flag_names(GenerateConfig)):
        check_decoder_path(model)
        result, text = _run(model, prompt, chat, values["tokenizer"], config, values["trust_pickle"],
                            stream=not (as_json or quiet))  # fmt: skip
    if as_json:
        print_json(result.to_dict() | {"text": text})
        return
    line = (
        f"{len(result.prompt_tokens)} prompt tokens, {len(result.tokens)} new ({result.stopped}): prefill "
        f"{result.prefill_tokens_per_s:.1f} tokens/s, decode {result.decode_tokens_per_s:.1f} tokens/s, "
        f"state {human_bytes(result.state_bytes)}"
    )
    if quiet:
        sys.stdout.write(text + "\n")
    sys.stderr.write(("" if quiet else "\n") + line + "\n")


def _signature() -> inspect.Signature:
    return inspect.Signature([
        keyword("model", _MODEL, Path), keyword("prompt", _PROMPT, str | None),
        keyword("prompt_file", _PROMPT_FILE, Path | None), keyword("chat", _CHAT, bool),
        keyword("system", _SYSTEM, str | None), keyword("tokenizer", _TOKENIZER, Path | None),
        *config_parameters(GenerateConfig), keyword("trust_pickle", trust_pickle_option(), bool),
        keyword("quiet", quiet_option(), bool), keyword("as_json", json_option(), bool),
    ])  # fmt: skip


generate.__signature__ = _signature()  # type: ignore[attr-defined]


def _prompt(text: str | None, file: Path | None) -> str:
    """The prompt's text, before any model loads: exactly one of --prompt and --prompt-file."""
    if (text is None) == (file is None):
        raise typer.BadParameter("give --prompt or --prompt-file (one of them)", param_hint="--prompt")
    if text is not None:
        if not text:
            raise typer.BadParameter("the prompt is empty", param_hint="--prompt")
        return text
    assert file is not None
    try:
        read = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise typer.BadParameter(
            f"{file}: not a readable UTF-8 text file ({exc})", param_hint="--prompt-file"
        ) from None
    if not read:
        raise typer.BadParameter(f"{file} is empty", param_hint="--prompt-file")
    return read


def _run(model: Path, prompt: str, chat: tuple[bool, str | None], tokenizer: Path | None,
         config: GenerateConfig, trust_pickle: bool, stream: bool) -> tuple[Any, str]:  # fmt: skip
    from coreai_opt.generation import open_decoder

    with open_decoder(model, tokenizer=tokenizer, trust_pickle=trust_pickle) as opened:
        return _generate(opened, prompt, chat, config, stream)


def _generate(
    opened: Any, prompt: str, chat: tuple[bool, str | None], config: GenerateConfig, stream: bool
) -> tuple[Any, str]:
    from coreai_opt.generation import TextStream, generate

    ids = opened.prompt_ids(prompt, chat=chat[0], system=chat[1])
    text = TextStream(opened.tokenizer)

    def show(token: int) -> None:
        added = text.push(token)
        if stream and added:
            sys.stdout.write(added)
            sys.stdout.flush()

    if stream and not chat[0]:
        sys.stdout.write(prompt)
    result = generate(opened.decoder, ids, config, eos=opened.stop_ids(chat=chat[0]), on_token=show)
    if stream:
        sys.stdout.write(text.text()[len(text.shown) :] + "\n")
    return result, text.text()
