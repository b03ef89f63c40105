"""What an exported model is, kept beside its program: `<stem>.model.json` and `<stem>.tokenizer.json`.

`coreopt export model.pt2` writes both; every command that writes a program from one (compress,
cast, convert, apply) copies them to its output, so `eval`, `sensitivity` and text calibration
find the tokenizer and the model's kind from any program of the lineage. Sidecars work for both
containers (an `.aimodel` is a folder whose files coreai owns) and are plain JSON.

A sidecar is read only from the program's own folder (a link out of it is refused, never read or
copied) and parsed before anything is written from it: a copy is what was parsed, never the bytes
read, so nothing but a model description or a tokenizer travels with a program.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coreai_opt.io import (
    ModelFileError,
    check_depth,
    one_line,
    read_in_folder,
    read_json,
    resolve_in_folder,
    write_atomically,
)

from ._chat import ChatFormat
from ._families import ModelKind

FORMAT = "coreopt-model"
VERSION = 1
_INFO_SUFFIX = ".model.json"
_TOKENIZER_SUFFIX = ".tokenizer.json"
_INFO_LIMIT = 8 << 20
_TOKENIZER_LIMIT = 256 << 20  # bytes of a tokenizer.json (large vocabularies take tens of megabytes)


@dataclass(frozen=True)
class ModelInfo:
    """An exported model's kind and shapes, where it came from, and its Hugging Face config."""

    kind: ModelKind
    model_type: str
    batch: int
    seq_len: int
    vocab_size: int | None = None
    source: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    context: int | None = None  # a stateful decoder's cache positions (models._stateful); None: a window
    chat: ChatFormat | None = None  # how its chat template lays out a conversation (models._chat)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION, "kind": self.kind.value, "model_type": self.model_type,
            "batch": self.batch, "seq_len": self.seq_len, "vocab_size": self.vocab_size,
            "source": self.source, "config": self.config,
        } | ({} if self.context is None else {"context": self.context}) | (
            {} if self.chat is None else {"chat": self.chat.to_dict()})  # fmt: skip

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """The end-of-sequence ids its config names (one id or a list)."""
        value = self.config.get("eos_token_id")
        return tuple(v for v in (value if isinstance(value, list) else [value]) if _token_id(v))

    @property
    def start_id(self) -> int | None:
        """The token a text's first token is predicted after, as lm-eval-harness takes it: the start
        of sequence, else the first end of sequence; None where the config names neither."""
        first = self.config.get("bos_token_id")
        return first if _token_id(first) else next(iter(self.eos_ids), None)

    @classmethod
    def from_dict(cls, data: Any, path: Path) -> ModelInfo:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ModelFileError(path, f"not a {FORMAT} file")
        if any(
            isinstance(value, dict | list) for key, value in data.items() if key not in ("config", "chat")
        ):
            raise ModelFileError(
                path, "malformed model description (only its config and chat format hold objects or lists)"
            )
        if data.get("version") != VERSION:
            raise ModelFileError(
                path, f"version {one_line(repr(data.get('version')), 40)} is not one this coreopt reads"
            )
        try:
            kind = ModelKind(data["kind"])
            batch, seq_len, vocab = data["batch"], data["seq_len"], data.get("vocab_size")
            context = data.get("context")
            ints = [batch, seq_len] + [v for v in (vocab, context) if v is not None]
            if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in ints):
                raise ValueError("batch, seq_len, vocab_size and context must be positive integers")
            config = data.get("config", {})
            if not isinstance(config, dict) or not isinstance(data["model_type"], str):
                raise ValueError("model_type must be a string and config an object")
            if not isinstance(data.get("source", ""), str):
                raise ValueError("source must be a string")
        except (KeyError, ValueError) as exc:
            raise ModelFileError(path, f"malformed model description ({one_line(exc, 120)})") from None
        check_depth(config, path, "its config")
        chat = None if data.get("chat") is None else ChatFormat.from_dict(data["chat"], path)
        return cls(
            kind, data["model_type"], batch, seq_len, vocab, data.get("source", ""), config, context, chat
        )


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _stem(program: Path) -> Path:
    return program.with_suffix("") if program.suffix else program


def info_path(program: Path | str) -> Path:
    """`model.model.json` beside `model.pt2` (or `model.aimodel`)."""
    return _stem(Path(program)).with_name(_stem(Path(program)).name + _INFO_SUFFIX)


def tokenizer_path(program: Path | str) -> Path:
    """`model.tokenizer.json` beside `model.pt2` (or `model.aimodel`)."""
    return _stem(Path(program)).with_name(_stem(Path(program)).name + _TOKENIZER_SUFFIX)


def model_info(program: Path | str) -> ModelInfo | None:
    """The description `coreopt export` left beside a program, or None when there is none."""
    path = info_path(program)
    if not os.path.lexists(path):
        return None
    return ModelInfo.from_dict(read_json(path, limit=_INFO_LIMIT), path)


def read_tokenizer(path: Path | str, folder: Path | str | None = None) -> Any:
    """A `tokenizer.json` of `folder` (default: the one it sits in), parsed by the tokenizers
    package (a `tokenizers.Tokenizer`); a file that does not parse is refused in one line."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ImportError(
            "reading a tokenizer needs the tokenizers package: pip install tokenizers"
        ) from None
    path = Path(path)
    data = read_in_folder(path, folder, limit=_TOKENIZER_LIMIT)
    try:
        return Tokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # the tokenizers library raises its own exception types
        raise ModelFileError(path, f"not a readable tokenizer ({one_line(exc, 200)})") from None


def model_tokenizer(program: Path | str) -> Path | None:
    """The tokenizer.json saved beside a program, or None; one that leads out of the program's
    folder is refused here, before anything opens it."""
    path = tokenizer_path(program)
    if not os.path.lexists(path):
        return None
    resolve_in_folder(path)
    return path


@dataclass(frozen=True)
class Sidecars:
    """A program's sidecars as parsed: its description, and its tokenizer as `tokenizer.json` text."""

    info: ModelInfo | None
    tokenizer: str | None

    def tokenizer_file(self, program: Path | str) -> Path | None:
        """The tokenizer sidecar these were read from beside `program`, for what takes a tokenizer
        by path (text calibration); None when there was none - the disk is not asked again."""
        return tokenizer_path(program) if self.tokenizer is not None else None


def read_sidecars(program: Path | str) -> Sidecars:
    """Read and parse the sidecars beside `program` (each may be absent); a harness that writes a
    program from it can call this before any work, so a bad sidecar fails before anything is written."""
    found = tokenizer_path(program)
    tokenizer = read_tokenizer(found).to_str() if os.path.lexists(found) else None
    return Sidecars(model_info(program), tokenizer)


def write_info(program: Path, info: ModelInfo) -> None:
    text = json.dumps(info.to_dict(), indent=1, sort_keys=True) + "\n"
    write_atomically(info_path(program), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_tokenizer(program: Path, text: str) -> Path:
    """`text` (a parsed tokenizer's `to_str()`) as the tokenizer sidecar of `program`."""
    path = tokenizer_path(program)
    write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return path


def copy_sidecars(source: Path | str, target: Path | str) -> list[Path]:
    """Give another program of `source`'s lineage its sidecars, as parsed (`read_sidecars`); the
    files written."""
    return write_sidecars(read_sidecars(source), source, target)


def write_sidecars(sidecars: Sidecars, source: Path | str, target: Path | str) -> list[Path]:
    """Write sidecars read from beside `source` (`read_sidecars`, before any work) beside `target`;
    the files written."""
    written = []
    if sidecars.info is not None and _differ(info_path(source), info_path(target)):
        write_info(Path(target), sidecars.info)
        written.append(info_path(target))
    if sidecars.tokenizer is not None and _differ(tokenizer_path(source), tokenizer_path(target)):
        written.append(write_tokenizer(Path(target), sidecars.tokenizer))
    return written


def _differ(found: Path, into: Path) -> bool:
    return found.resolve() != into.resolve()
