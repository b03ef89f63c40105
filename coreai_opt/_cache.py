"""Where coreopt keeps what it may recompute (calibration statistics, compiled kernels, checked
assets): one folder per kind under ~/.cache/coreopt, and the one rule every such folder keeps.

What a cache holds is read back as trusted (statistics become a compressed model; numba's kernel
files are pickles), so a cache folder is used only when nobody else could have put anything in it:
a folder itself (not a link to one elsewhere), owned by this user, written by nobody else. Folders
coreopt creates for a cache, each missing parent too, are mode 0700. A folder that fails is not
used - the work is done afresh - and one warning line on stderr says so, once a process."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
from pathlib import Path

_warned: set[str] = set()


def user_cache(kind: str) -> Path:
    """~/.cache/coreopt/<kind> (not created here)."""
    return Path.home() / ".cache" / "coreopt" / kind


def folder_problem(folder: Path) -> str | None:
    """Why `folder` may not hold a cache (None: it may) - an entry another user planted would be
    read back as ours."""
    try:
        found = os.lstat(folder)
    except FileNotFoundError:
        return "it does not exist"
    except OSError as exc:
        return f"it cannot be examined ({exc.strerror})"
    if stat.S_ISLNK(found.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(found.st_mode):
        return "it is not a folder"
    owner = os.getuid() if hasattr(os, "getuid") else found.st_uid
    if found.st_uid != owner:
        return f"it is owned by user {found.st_uid}, not by this one ({owner})"
    if found.st_mode & 0o022:
        return f"others may write to it (mode {stat.S_IMODE(found.st_mode):04o})"
    return None


def cache_folder_for(folder: Path, *, create: bool, without: str = "going on without it") -> Path | None:
    """`folder` when it may hold a cache; None when it is missing and not `create`d, or when it
    fails the rule - then a warning line on stderr (`without`: what happens instead), once a
    process. Created folders and their missing parents are mode 0700; OSError when that fails."""
    if not os.path.lexists(folder):
        if not create:
            return None
        _make_private(folder)
    problem = folder_problem(folder)
    if problem is None:
        return folder
    warn_unused(folder, problem, without)
    return None


def warn_unused(folder: Path, why: str, without: str) -> None:
    """The one line that says a cache folder is not used, and why (on stderr: never in the way
    of `--json` on stdout); once a process per folder and reason."""
    line = f"warning: cache folder {_printable(str(folder))} is not used: {why}; {without}"
    if line in _warned:
        return
    _warned.add(line)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def plain_name(name: object, pattern: re.Pattern[str]) -> str | None:
    """`name` when it is a string the cache's writer could have made (`pattern`, matched whole),
    else None: an index names files in its own folder, never a path elsewhere."""
    if isinstance(name, str) and pattern.fullmatch(name):
        return name
    return None


def _make_private(folder: Path) -> None:
    """Create `folder` and each missing parent with mode 0700 (mkdir's `parents` uses 0777)."""
    missing = []
    here = Path(os.path.abspath(folder))
    while not os.path.lexists(here) and here != here.parent:
        missing.append(here)
        here = here.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile: the caller's check judges it
            os.mkdir(path, 0o700)


def _printable(text: str) -> str:
    """Unprintable characters as their escapes, so a path cannot drive the terminal."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
