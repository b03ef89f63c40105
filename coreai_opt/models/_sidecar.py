"""What an exported model is, kept beside its program: `<stem>.model.json` and `<stem>.tokenizer.json`.

`coreopt export model.pt2` writes both; every command that writes a program from one (compress,
cast, convert, apply) copies them to its output, so `eval`, `sensitivity` and text calibration
find the tokenizer and the model's kind from any program of the lineage. Sidecars work for both
containers (an `.aimodel` is a folder whose files coreai owns) and are plain JSON.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coreai_opt.io import ModelFileError, one_line, write_atomically

from ._families import ModelKind

FORMAT = "coreopt-model"
VERSION = 1
_INFO_SUFFIX = ".model.json"
_TOKENIZER_SUFFIX = ".tokenizer.json"
_INFO_LIMIT = 8 << 20


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION, "kind": self.kind.value, "model_type": self.model_type,
            "batch": self.batch, "seq_len": self.seq_len, "vocab_size": self.vocab_size,
            "source": self.source, "config": self.config,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Any, path: Path) -> ModelInfo:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ModelFileError(path, f"not a {FORMAT} file")
        if data.get("version") != VERSION:
            raise ModelFileError(path, f"version {data.get('version')!r} is not one this coreopt reads")
        try:
            kind = ModelKind(data["kind"])
            batch, seq_len, vocab = data["batch"], data["seq_len"], data.get("vocab_size")
            ints = [batch, seq_len] + ([] if vocab is None else [vocab])
            if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in ints):
                raise ValueError("batch, seq_len and vocab_size must be positive integers")
            config = data.get("config", {})
            if not isinstance(config, dict) or not isinstance(data["model_type"], str):
                raise ValueError("model_type must be a string and config an object")
        except (KeyError, ValueError) as exc:
            raise ModelFileError(path, f"malformed model description ({one_line(exc, 120)})") from None
        return cls(kind, data["model_type"], batch, seq_len, vocab, str(data.get("source", "")), config)


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
    if not path.is_file():
        return None
    if path.stat().st_size > _INFO_LIMIT:
        raise ModelFileError(path, "is too large for a model description")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(path, f"not a readable JSON file ({one_line(exc, 120)})") from None
    return ModelInfo.from_dict(data, path)


def model_tokenizer(program: Path | str) -> Path | None:
    """The tokenizer.json saved beside a program, or None."""
    path = tokenizer_path(program)
    return path if path.is_file() else None


def write_info(program: Path, info: ModelInfo) -> None:
    text = json.dumps(info.to_dict(), indent=1, sort_keys=True) + "\n"
    write_atomically(info_path(program), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def copy_sidecars(source: Path | str, target: Path | str) -> list[Path]:
    """Copy a program's sidecars to sit beside another program of its lineage; the copies made."""
    copied = []
    for place in (info_path, tokenizer_path):
        found, into = place(source), place(target)
        if found.is_file() and found.resolve() != into.resolve():
            write_atomically(into, lambda tmp, found=found: shutil.copyfile(found, tmp))
            copied.append(into)
    return copied
