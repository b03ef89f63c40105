"""Assets known to be safe to read in this process, remembered across commands.

A `.aimodel` from elsewhere is read first by a worker process (`_aimodel.verify_aimodel`): on a
513 MiB language model that costs ~0.7 CPU seconds (forked; ~1 spawned), a fifth of quantizing
it. Once a worker read
an asset without harm - or coreopt wrote it itself - every later command on the unchanged file
can skip that step. "Unchanged" is the bytecode file's identity: device, inode, size, modification
and change time in nanoseconds (any write to the file, or a new file in its place, moves its
change time, which no unprivileged caller can set back), with the hash main.hash records, the
SHA-256 of the metadata, the coreai-core version and this check's version.

The record is a folder of empty files named by the SHA-256 of such a key: nothing in it is ever
read or parsed, only looked up. It lives in ~/.cache/coreopt/checked-assets, or in the folder
`COREOPT_CHECKED_ASSETS` names; `COREOPT_CHECKED_ASSETS=off` checks every asset in every process.
A folder that another user owns or may write to is not trusted (an entry planted there would
switch the check off) and is neither read nor written: the rule of every cache folder
(`coreai_opt._cache`), with its one warning line; a link of the user's to a folder that keeps the
rule is followed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from pathlib import Path

from coreai_opt._cache import cache_folder_for, user_cache

RECORD_ENV = "COREOPT_CHECKED_ASSETS"
_WITHOUT = "every .aimodel from elsewhere is checked in a worker"  # what a refused record costs
# Raised whenever the worker's check changes what it covers, so older entries stop counting.
_CHECK_VERSION = "1"
_MAX_ENTRIES = 4096
_PRUNED_TO = 3072


def record_folder() -> Path | None:
    """Where passed checks are remembered, or None when the record is off."""
    chosen = os.environ.get(RECORD_ENV, "").strip()
    if chosen.lower() in ("off", "0", "no", "false"):
        return None
    return Path(chosen) if chosen else user_cache("checked-assets")


def file_identity(path: Path) -> tuple[int, ...]:
    """What changes whenever the file's bytes may have: device, inode, size, mtime and ctime (ns)."""
    found = path.stat()
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


def _entry_name(key: tuple[object, ...]) -> str | None:
    identity = key[0]
    if not isinstance(identity, tuple) or identity[-1] % 1_000_000_000 == 0:
        return None  # a file system with whole-second times: a quick rewrite could look unchanged
    return hashlib.sha256(repr((_CHECK_VERSION, _coreai_version(), key)).encode()).hexdigest()


@functools.cache
def _coreai_version() -> str:
    """A newer coreai-core may crash where this one did not: its checks are its own."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("coreai-core")
    except PackageNotFoundError:
        return "unknown"


def was_checked(key: tuple[object, ...]) -> bool:
    """Whether an asset with this key passed the check (or was written by coreopt) before."""
    chosen, name = record_folder(), _entry_name(key)
    if chosen is None or name is None:
        return False
    folder = cache_folder_for(chosen, create=False, without=_WITHOUT)  # where a link of the user's leads
    return folder is not None and (folder / name).is_file()


def remember(key: tuple[object, ...]) -> None:
    """Record a passed check; a record that cannot be written only costs the next command time."""
    chosen, name = record_folder(), _entry_name(key)
    if chosen is None or name is None:
        return
    with contextlib.suppress(OSError):
        folder = cache_folder_for(chosen, create=True, without=_WITHOUT)
        if folder is None:
            return
        with contextlib.suppress(FileExistsError):
            os.close(os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        _prune(folder)


def _prune(folder: Path) -> None:
    """Keep the newest entries once there are too many (each is an empty file)."""
    entries = list(os.scandir(folder))
    if len(entries) <= _MAX_ENTRIES:
        return
    entries.sort(key=lambda entry: entry.stat().st_mtime_ns)
    for entry in entries[: len(entries) - _PRUNED_TO]:
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
