"""A stateful decoder from a file, with what it needs to make text: its tokenizer and its
end-of-sequence ids (the sidecars `coreopt export` wrote beside it)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coreai_opt.io import ModelFileError, ModelFormat, model_format, require_existing

from ._decoder import NotADecoder, StatefulDecoder


@dataclass
class OpenDecoder:
    """A decoder ready to run (`StatefulDecoder` in PyTorch, `AssetDecoder` on the Core AI runtime),
    its tokenizer and end-of-sequence ids; a context manager (an asset's worker closes with it)."""

    decoder: Any
    tokenizer: Any  # a tokenizers.Tokenizer, or None when none was given or found
    eos: tuple[int, ...]
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def __enter__(self) -> OpenDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stack.close()


def check_decoder_path(path: Path) -> ModelFormat:
    """What can be told of `path` before it is read: it exists and is a `.pt2` or an `.aimodel`."""
    require_existing(path)
    return model_format(path, (ModelFormat.PT2, ModelFormat.AIMODEL))


def open_decoder(
    path: Path | str, *, tokenizer: Path | str | None = None, trust_pickle: bool = False, device: Any = None
) -> OpenDecoder:
    """The stateful decoder `path` holds, ready to run - a `.pt2` in PyTorch, an `.aimodel` on the
    Core AI runtime (in a worker process, closed with the result) - with the tokenizer given or
    saved beside it (None when neither exists) and its end-of-sequence ids; `ModelFileError` names
    the file."""
    from coreai_opt.models import model_info, model_tokenizer, read_tokenizer

    path = Path(path)
    kind = check_decoder_path(path)
    found = Path(tokenizer) if tokenizer is not None else model_tokenizer(path)
    coder = read_tokenizer(found) if found is not None else None
    info = model_info(path)
    opened = OpenDecoder(None, coder, _eos(info.config if info is not None else {}))
    try:
        if kind is ModelFormat.AIMODEL:
            opened.decoder = _asset(path, opened.stack)
        else:
            opened.decoder = _program(path, trust_pickle, device)
    except NotADecoder as why:
        opened.close()
        raise ModelFileError(
            path, f"is not a stateful decoder: {why} (coreopt export --kv-cache makes one)"
        ) from None
    except BaseException:
        opened.close()
        raise
    return opened


def _program(path: Path, trust_pickle: bool, device: Any) -> StatefulDecoder:
    from coreai_opt.io import load_pt2

    return StatefulDecoder(load_pt2(path, trust_pickle=trust_pickle), device)


def _asset(path: Path, stack: contextlib.ExitStack) -> Any:
    from coreai_opt._coreai import AssetWorker
    from coreai_opt.io import verify_aimodel

    from ._asset import AssetDecoder

    worker = stack.enter_context(AssetWorker(path))
    verify_aimodel(path, worker)
    return AssetDecoder(path, worker)


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
