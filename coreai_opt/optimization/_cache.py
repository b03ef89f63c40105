"""The cost table's disk cache, in the calibration cache's folder (`optimize/`): one JSON file a
choice's column and one a choice's measured trials, each named by a digest of the program file's
bytes, the calibration samples, the threshold, the layout and the choice's config."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ._choices import Choice


def folder() -> Path:
    from coreai_opt.calibration import cache_folder

    return cache_folder() / "optimize"


def file_digest(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def choice_key(base: str, choice: Choice, threshold: int) -> str:
    config = choice.config_for(True, threshold)
    text = base + json.dumps(config.to_dict() if config is not None else None, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def read(path: Path) -> dict[str, Any] | None:
    """The file's JSON object, or None where it is missing or unreadable (a cache miss)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write(path: Path, data: dict[str, Any]) -> None:
    from coreai_opt.io import write_atomically

    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data)
    write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
