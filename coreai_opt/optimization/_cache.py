"""The cost table's disk cache, in the calibration cache's folder (`optimize/`): one JSON file a
choice's column and one a choice's measured trials, each named by a digest of the program file's
bytes, the calibration samples, the threshold, the layout and the choice's config. Both folders
keep the rule of every cache folder (`coreai_opt._cache`): one that fails is neither read nor
written (a column another user planted would decide the plan)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from coreai_opt._cache import cache_folder_for, plain_name

from ._choices import Choice

# What `choice_key` names and the suffixes `_costs` and `_trials` add: `<key>.json`,
# `<key>.trials-<version>-<mode>-<tokens>.json`.
_FILE = re.compile(r"[0-9a-f]{32}(\.trials-[\w.-]+)?\.json")
_WITHOUT = "every cost is measured afresh and not stored"


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
    """The file's JSON object, or None where it is missing, unreadable, not a name this cache
    writes or in a folder that fails the rule (a cache miss)."""
    if plain_name(path.name, _FILE) is None or not _usable(path.parent, create=False):
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def write(path: Path, data: dict[str, Any]) -> None:
    """Store `data` in `path`; nothing is written where the folder fails the rule or cannot be
    made (a cache only saves time)."""
    from coreai_opt.io import ModelFileError, write_atomically

    text = json.dumps(data)
    try:
        if _usable(path.parent, create=True):
            write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    except (OSError, ModelFileError):
        pass


def _usable(optimize: Path, *, create: bool) -> bool:
    """Whether the calibration cache and its `optimize/` folder both keep the rule."""
    return all(
        cache_folder_for(each, create=create, without=_WITHOUT) is not None
        for each in (optimize.parent, optimize)
    )
