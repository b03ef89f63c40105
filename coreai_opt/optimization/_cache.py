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
from coreai_opt.io import ModelFileError, read_json_object, write_atomically

from ._choices import Choice

# The names `entry` makes, and only those are read: `<key>.json` (a column) and
# `<key>.trials-<part>-<part>....json` (measured trials), a key being what `choice_key` makes.
_FILE = re.compile(r"[0-9a-f]{32}(\.trials(-[0-9A-Za-z]+)+)?\.json")
_WITHOUT = "every cost is measured afresh and not stored"
_LIMIT = 256 << 20  # bytes of one entry: a column holds a few hundred bytes a weight


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


def entry(key: str, *trials: str | int) -> Path:
    """The file of the column `key` (`choice_key`) names or, given `trials` (the parts that tell
    one measurement from another: version, mode, tokens), of its measured trials - the one place
    this cache's names are made, so `_FILE` reads back exactly these."""
    suffix = ".trials" + "".join(f"-{part}" for part in trials) if trials else ""
    name = f"{key}{suffix}.json"
    if plain_name(name, _FILE) is None:
        raise ValueError(f"{name!r} is no name the optimize cache reads back")
    return folder() / name


def read(path: Path) -> dict[str, Any] | None:
    """The file's JSON object, or None where it is missing, unreadable, not a name this cache
    writes (`entry`) or in a folder that fails the rule (a cache miss)."""
    here = _usable(path.parent, create=False) if plain_name(path.name, _FILE) else None
    return read_json_object(here / path.name, limit=_LIMIT) if here is not None else None


def write(path: Path, data: dict[str, Any]) -> None:
    """Store `data` in `path`; nothing is written where the folder fails the rule or cannot be
    made (a cache only saves time)."""
    text = json.dumps(data)
    try:
        here = _usable(path.parent, create=True) if plain_name(path.name, _FILE) else None
        if here is not None:
            write_atomically(here / path.name, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    except (OSError, ModelFileError):
        pass


def _usable(optimize: Path, *, create: bool) -> Path | None:
    """The `optimize/` folder (where it leads) when it and the calibration cache both keep the rule."""
    if cache_folder_for(optimize.parent, create=create, without=_WITHOUT) is None:
        return None
    return cache_folder_for(optimize, create=create, without=_WITHOUT)
