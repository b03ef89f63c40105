"""JSON that coreopt reads from files - a model's config.json, a shard index, a safetensors header,
sidecars, its own cache entries - bounded in bytes and in nesting, every failure one typed line
(or, for a cache, a miss).

Python's parser recurses once per level: a file of 100,000 `[` raises RecursionError, which is no
ValueError and would escape every caller's `except` as a crash, so it is caught here, once. What
reads a parsed value later (json.dumps, transformers, a recipe's checks) recurses as well, so a
value is also walked - without recursion - for its depth (`walk_json`, `check_depth`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._errors import ModelFileError, one_line
from ._paths import read_in_folder

MAX_DEPTH = 32  # levels of nesting in a config coreopt keeps (Hugging Face configs use 3 or 4)


def parse_json(data: bytes, path: Path) -> Any:
    """The JSON value of `data`, read from `path`; `ModelFileError` for bytes that are not UTF-8 or
    not JSON, and for nesting too deep for the parser (refused, not raised as RecursionError)."""
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ModelFileError(path, "nests deeper than any JSON file coreopt reads") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ModelFileError(path, f"not a readable JSON file ({one_line(exc, 120)})") from None


def read_json(path: Path, folder: Path | None = None, *, limit: int) -> Any:
    """A JSON file that belongs to `folder` (default: its own; `read_in_folder`), at most `limit`
    bytes; `ModelFileError` for anything else."""
    return parse_json(read_in_folder(path, folder, limit=limit), path)


def read_json_object(path: Path, *, limit: int) -> dict[str, Any] | None:
    """A cache entry's JSON object, or None - missing, unreadable, over `limit` bytes, not JSON,
    nested too deep, not an object: a damaged entry is only a miss, and the work is done again."""
    try:
        value = read_json(path, limit=limit)
    except (ModelFileError, OSError):
        return None
    return value if isinstance(value, dict) else None


def walk_json(value: Any) -> Iterator[tuple[Any, tuple[str | int, ...]]]:
    """Every value in `value` with its place (the keys and indices that lead to it), `value` first,
    depth first - without recursion, so no nesting exhausts the stack. A mapping's or list's items
    are taken only once the caller asks for the next value, so it can refuse a container (its size,
    its keys) before anything in it is looked at; a caller walking data that may loop (YAML aliases)
    stops at a bound of its own."""
    pending: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while pending:
        item, place = pending.pop()
        yield item, place
        if isinstance(item, dict):
            pending.extend((child, (*place, key)) for key, child in item.items())
        elif isinstance(item, list):
            pending.extend((child, (*place, index)) for index, child in enumerate(item))


def check_depth(value: Any, path: Path, what: str, limit: int = MAX_DEPTH) -> None:
    """Refuse `value` (read from `path`; `what` names it) when its mappings and lists nest more than
    `limit` levels: whatever reads it later recurses once per level."""
    for item, place in walk_json(value):
        if len(place) >= limit and isinstance(item, dict | list):
            raise ModelFileError(path, f"{what} nests deeper than {limit} levels")
