"""A stateful decoder from a file, with what it needs to make text: its tokenizer and its
end-of-sequence ids (the sidecars `coreopt export` wrote beside it)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coreai_opt.errors import ConfigError
from coreai_opt.io import ModelFileError, ModelFormat, model_format, require_existing

from ._decoder import NotADecoder, StatefulDecoder

if TYPE_CHECKING:
    from coreai_opt.models import ChatFormat


@dataclass
class OpenDecoder:
    """A decoder ready to run (`StatefulDecoder` in PyTorch, `AssetDecoder` on the Core AI runtime),
    its tokenizer, end-of-sequence ids and chat format; a context manager (an asset's worker
    closes with it)."""

    decoder: Any
    tokenizer: Any  # a tokenizers.Tokenizer, or None when none was given or found
    eos: tuple[int, ...]
    chat: ChatFormat | None = None  # from the source's chat template, when coreopt recognised it
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    name: str = ""  # the file, as messages name it

    def prompt_ids(self, text: str, *, chat: bool = False, system: str | None = None) -> list[int]:
        """`text`'s token ids; with `chat`, as one user turn of the model's chat format (after
        `system`, else the format's default system message) opening the assistant's turn, the
        chat format's own special tokens written as it writes them."""
        if self.tokenizer is None:
            raise ConfigError(f"{self.name} has no tokenizer beside it; give --tokenizer", "tokenizer")
        if not chat:
            return list(self.tokenizer.encode(text).ids)
        if self.chat is None:
            raise ConfigError(
                f"{self.name} has no chat format coreopt renders (a ChatML chat template in the source "
                "coreopt export read); give the prompt without --chat", "chat",
            )  # fmt: skip
        return list(self.tokenizer.encode(self.chat.render(text, system), add_special_tokens=False).ids)

    def stop_ids(self, *, chat: bool = False) -> tuple[int, ...]:
        """The end-of-sequence ids, and with `chat` the token that ends a turn."""
        turn = (
            self.tokenizer.token_to_id(self.chat.end_of_turn)
            if chat and self.chat and self.tokenizer
            else None
        )
        return self.eos + ((turn,) if turn is not None and turn not in self.eos else ())

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
    eos = info.eos_ids if info is not None else ()
    opened = OpenDecoder(None, coder, eos, info.chat if info is not None else None, name=str(path))
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
