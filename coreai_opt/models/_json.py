"""JSON files of a model (config.json, a shard index, a safetensors header, `<stem>.model.json`):
read from their own folder only, bounded in bytes and in depth, every failure one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from coreai_opt.io import ModelFileError, one_line, read_in_folder

MAX_DEPTH = 32  # levels of nesting in a config coreopt keeps (Hugging Face configs use 3 or 4)


def parse_json(data: bytes, path: Path) -> Any:
    """The JSON value of `data`, read from `path`; nesting too deep for the parser is refused, not raised."""
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ModelFileError(path, "nests deeper than any JSON file coreopt reads") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ModelFileError(path, f"not a readable JSON file ({one_line(exc, 120)})") from None


def read_json(path: Path, folder: Path | None = None, *, limit: int) -> Any:
    """A JSON file that belongs to `folder` (default: its own), at most `limit` bytes."""
    return parse_json(read_in_folder(path, folder, limit=limit), path)


def check_depth(value: Any, path: Path, what: str) -> None:
    """Refuse `value` when it nests more than MAX_DEPTH levels: whatever reads it later (json.dumps,
    transformers) recurses once per level. Walks without recursing itself."""
    pending = [(value, 1)]
    while pending:
        item, level = pending.pop()
        if level > MAX_DEPTH:
            raise ModelFileError(path, f"{what} nests deeper than {MAX_DEPTH} levels")
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        pending.extend((child, level + 1) for child in children if isinstance(child, dict | list))
