"""A stateful decoder from a file, with what it needs to make text: its tokenizer and its
end-of-sequence ids (the sidecars `coreopt export` wrote beside it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coreai_opt.io import ModelFileError, ModelFormat, model_format, require_existing

from ._decoder import NotADecoder, StatefulDecoder


@dataclass
class OpenDecoder:
    decoder: StatefulDecoder
    tokenizer: Any  # a tokenizers.Tokenizer, or None when none was given or found
    eos: tuple[int, ...]


def check_decoder_path(path: Path) -> None:
    """What can be told of `path` before it is read: it exists and is a `.pt2` (generation on the
    Core AI runtime is not built yet: an `.aimodel` is refused in one line)."""
    require_existing(path)
    if model_format(path, (ModelFormat.PT2, ModelFormat.AIMODEL)) is ModelFormat.AIMODEL:
        raise ModelFileError(
            path, "generation runs .pt2 programs in PyTorch; an .aimodel cannot generate yet"
        )


def open_decoder(
    path: Path | str, *, tokenizer: Path | str | None = None, trust_pickle: bool = False, device: Any = None
) -> OpenDecoder:
    """The stateful decoder `path` holds, ready to run, with the tokenizer given or saved beside it
    (None when neither exists) and its end-of-sequence ids; `ModelFileError` names the file."""
    from coreai_opt.io import load_pt2
    from coreai_opt.models import model_info, model_tokenizer, read_tokenizer

    path = Path(path)
    check_decoder_path(path)
    found = Path(tokenizer) if tokenizer is not None else model_tokenizer(path)
    coder = read_tokenizer(found) if found is not None else None
    info = model_info(path)
    program = load_pt2(path, trust_pickle=trust_pickle)
    try:
        decoder = StatefulDecoder(program, device)
    except NotADecoder as why:
        raise ModelFileError(
            path, f"is not a stateful decoder: {why} (coreopt export --kv-cache makes one)"
        ) from None
    return OpenDecoder(decoder, coder, _eos(info.config if info is not None else {}))


def _eos(config: dict[str, Any]) -> tuple[int, ...]:
    """The end-of-sequence ids a Hugging Face config names (one id or a list)."""
    value = config.get("eos_token_id")
    values = value if isinstance(value, list) else [value]
    return tuple(v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0)


class TextStream:
    """The text of generated tokens as it grows: `push(token)` returns what it adds, held back while
    the last tokens end inside a character (byte-level vocabularies split UTF-8 sequences)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.shown = ""

    def push(self, token: int) -> str:
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self.shown):
            return ""
        added, self.shown = text[len(self.shown) :], text
        return added

    def text(self) -> str:
        return str(self.tokenizer.decode(self.tokens, skip_special_tokens=True))
