"""Where coreopt keeps what it may recompute (calibration statistics, compiled kernels, checked
assets): one folder per kind under ~/.cache/coreopt, and the one rule every such folder keeps.

What a cache holds is read back as trusted (statistics become a compressed model; numba's kernel
files are pickles), so a cache folder is used only when nobody else could have put anything in it:
a folder owned by this user, written by nobody else. A path the user gives may lead there through
their own links (`COREOPT_CACHE=~/cache`, a link to scratch space): the folder it leads to is the
one judged and used. Folders coreopt creates for a cache, each missing parent too, are mode 0700.

A folder under ~/.cache/coreopt that is this user's but that others may write to (made under
umask 002 by an older coreopt, or by numba) is reset - emptied, since what others could have put
there is not trusted, and made 0700 - with one warning line. Any other folder that fails is not
used - the work is done afresh - and one warning line on stderr says why (and, for one others may
write to, the `chmod` that fixes it), once a process."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

from coreai_opt.errors import printable

_warned: set[str] = set()


def user_cache(kind: str) -> Path:
    """~/.cache/coreopt/<kind> (not created here)."""
    return _root() / kind


def folder_problem(folder: Path) -> str | None:
    """Why `folder` may not hold a cache (None: it may) - an entry another user planted would be
    read back as ours."""
    return _examine(folder)[0]


def cache_folder_for(folder: Path, *, create: bool, without: str = "going on without it") -> Path | None:
    """The folder `folder` leads to (every link followed) when it may hold a cache; None when it is
    missing and not `create`d, or when it fails the rule - then a warning line on stderr
    (`without`: what happens instead), once a process. Created folders and their missing parents
    are mode 0700; OSError when that fails. One of ours under ~/.cache/coreopt that others may
    write to is reset first (`_reset`)."""
    real = Path(os.path.realpath(folder))
    if not os.path.lexists(real):
        if not create:
            return None
        _make_private(real)
    problem, shared = _examine(real)
    if problem is None:
        return real
    if shared and _in_own_cache(real):
        return _reset(real, problem, without)
    if shared:
        problem += f"; `chmod go-w {shlex.quote(str(real))}` makes it usable"
    warn_unused(real, problem, without)
    return None


def warn_unused(folder: Path, why: str, without: str) -> None:
    """The one line that says a cache folder is not used, and why (on stderr: never in the way
    of `--json` on stdout); once a process per folder and reason."""
    _warn(f"cache folder {folder} is not used: {why}; {without}")


def plain_name(name: object, pattern: re.Pattern[str]) -> str | None:
    """`name` when it is a string the cache's writer could have made (`pattern`, matched whole),
    else None: an index names files in its own folder, never a path elsewhere."""
    if isinstance(name, str) and pattern.fullmatch(name):
        return name
    return None


def _root() -> Path:
    """~/.cache/coreopt: the folder coreopt's own caches lie in, unless a path is given."""
    return Path.home() / ".cache" / "coreopt"


def _examine(folder: Path) -> tuple[str | None, bool]:
    """Why `folder` may not hold a cache (None: it may), and whether the only reason is that others
    may write to a folder of this user's."""
    try:
        found = os.lstat(folder)
    except FileNotFoundError:
        return "it does not exist", False
    except OSError as exc:
        return f"it cannot be examined ({exc.strerror})", False
    if stat.S_ISLNK(found.st_mode):
        return "it is a symbolic link", False
    if not stat.S_ISDIR(found.st_mode):
        return "it is not a folder", False
    owner = _user(found)
    if found.st_uid != owner:
        return f"it is owned by user {found.st_uid}, not by this one ({owner})", False
    if found.st_mode & 0o022:
        return f"others may write to it (mode {stat.S_IMODE(found.st_mode):04o})", True
    return None, False


def _user(found: os.stat_result) -> int:
    """This process's user (where there are none, the owner of what was found)."""
    return os.getuid() if hasattr(os, "getuid") else found.st_uid


def _in_own_cache(folder: Path) -> bool:
    """Whether `folder` (every link followed) is ~/.cache/coreopt or lies in it: coreopt's own, whose
    contents it may drop. A folder elsewhere (one the user named) is theirs: it is only refused."""
    root = Path(os.path.realpath(_root()))
    return folder == root or root in folder.parents


def _reset(folder: Path, why: str, without: str) -> Path | None:
    """`folder`, emptied and made 0700 (with one warning line), or None where that fails: it is
    this user's, under ~/.cache/coreopt, but others could write to it - so anything in it may be
    theirs. Made private first, so nobody adds an entry while it is emptied; worked on through one
    handle opened without following a link, so a folder swapped in meanwhile is never touched."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        handle = os.open(folder, flags)
        try:
            found = os.fstat(handle)
            if not stat.S_ISDIR(found.st_mode) or found.st_uid != _user(found):
                raise OSError(0, "it changed while being reset")
            os.fchmod(handle, 0o700)
            with os.scandir(handle) as entries:
                inside = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
            for name, is_folder in inside:
                if is_folder:
                    shutil.rmtree(name, dir_fd=handle)
                else:
                    os.unlink(name, dir_fd=handle)
        finally:
            os.close(handle)
    except OSError as exc:
        warn_unused(folder, f"{why}, and it could not be reset ({exc.strerror})", without)
        return None
    _warn(f"cache folder {folder} was reset: {why}, so what it held was removed and it is private now (0700)")
    problem = folder_problem(folder)
    if problem is None:
        return folder
    warn_unused(folder, problem, without)  # swapped for something else meanwhile
    return None


def _warn(line: str) -> None:
    """`warning: <line>` on stderr (never in the way of `--json` on stdout), as it may be printed
    (a path from the environment cannot drive the terminal); once a process per line."""
    line = "warning: " + printable(line)
    if line in _warned:
        return
    _warned.add(line)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


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


def tensor_bytes(tensor: Any) -> bytes:
    """A tensor's elements as raw bytes (on the host, in order): what a cache key or a digest reads."""
    import torch

    return tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
