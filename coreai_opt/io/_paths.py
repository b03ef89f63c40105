"""Path checks and atomic replacement shared by every model-file writer."""

from __future__ import annotations

import contextlib
import enum
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from ._errors import (
    MissingPathError,
    ModelFileError,
    OutputExistsError,
    SameAsInputError,
    UnwritableOutputError,
    WrongSuffixError,
)


class ModelFormat(enum.Enum):
    """The two model-file formats coreopt reads and writes."""

    PT2 = ".pt2"
    AIMODEL = ".aimodel"


def model_format(path: Path | str, accepted: tuple[ModelFormat, ...] = tuple(ModelFormat)) -> ModelFormat:
    """Return the format a path's suffix names, or raise WrongSuffixError."""
    suffix = Path(path).suffix.lower()
    for fmt in accepted:
        if suffix == fmt.value:
            return fmt
    raise WrongSuffixError(path, tuple(f.value for f in accepted))


def asset_bytes(path: Path) -> int:
    """Bytes on disk: an `.aimodel` directory's files, or a `.pt2` file."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def require_existing(path: Path) -> None:
    if not path.exists():
        raise MissingPathError(path)


def _same_path(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and a.samefile(b))
    except OSError:
        return False


def check_output(path: Path, *, force: bool, inputs: tuple[Path, ...] = ()) -> None:
    """Refuse an output that is an input, that exists without `force`, or whose folder cannot hold it."""
    for source in inputs:
        if _same_path(path, source):
            raise SameAsInputError(path)
    if path.exists() and not force:
        raise OutputExistsError(path)
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise UnwritableOutputError(path, f"parent {parent} is not a directory")
    if parent.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise UnwritableOutputError(path, f"directory {parent} is not writable")


def _temporary_sibling(path: Path, tag: str) -> Path:
    # Keep the suffix: coreai-core insists that an asset path ends in `.aimodel`.
    return path.with_name(f".{path.stem}.{tag}-{uuid.uuid4().hex[:8]}{path.suffix}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling to write; on success it replaces `path` in one rename.

    Works for files and for directories (an `.aimodel` is a directory). On any failure the
    temporary is removed and an existing `path` is left as it was.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UnwritableOutputError(path, f"cannot create directory {path.parent}: {exc.strerror}") from exc
    tmp = _temporary_sibling(path, "tmp")
    try:
        yield tmp
        if not tmp.exists():
            raise UnwritableOutputError(path, "the writer produced no output")
        _replace(tmp, path)
    except PermissionError as exc:
        _remove(tmp)
        raise UnwritableOutputError(path, f"permission denied: {exc.strerror}") from exc
    except BaseException:
        _remove(tmp)
        raise


def _replace(tmp: Path, path: Path) -> None:
    if tmp.is_dir() or (path.exists() and path.is_dir()):
        # os.replace cannot put a directory over another: move the old one aside first.
        old = _temporary_sibling(path, "old") if path.exists() else None
        if old is not None:
            os.replace(path, old)
        try:
            os.replace(tmp, path)
        except BaseException:
            if old is not None:
                os.replace(old, path)
            raise
        if old is not None:
            _remove(old)
    else:
        os.replace(tmp, path)


def write_atomically(path: Path, writer: Callable[[Path], None]) -> None:
    """Call `writer(tmp)` and move its output onto `path` atomically."""
    with atomic_output(path) as tmp:
        writer(tmp)


# A Hugging Face hub cache keeps a repository as models--ORG--NAME/{snapshots/<revision>/, blobs/}: a
# snapshot's files are links to ../../blobs/<hash>, and an older huggingface_hub's `local_dir`
# download links its files to the same blobs. A blob is named by the hash of a public file's bytes.
_HF_REPOSITORY = "models--"
_HF_BLOBS = "blobs"
_FOLDER_ENTRIES = 10_000  # entries `check_links` looks at in one folder tree, at most


def _hf_blob(target: str) -> bool:
    """Whether `target` (every link followed) is a regular file directly inside the blobs folder of
    a Hugging Face hub cache repository: what such a folder holds are public files, stored under
    their hashes, so a link there reads nothing a user keeps for themselves."""
    blobs = os.path.dirname(target)
    repository = os.path.basename(os.path.dirname(blobs))
    named = repository.startswith(_HF_REPOSITORY) and len(repository) > len(_HF_REPOSITORY)
    if os.path.basename(blobs) != _HF_BLOBS or not named:
        return False
    try:
        return stat.S_ISREG(os.stat(target).st_mode)
    except OSError:
        return False


def resolve_in_folder(path: Path | str, folder: Path | str | None = None) -> Path:
    """Where `path` leads, when that is inside `folder` (default: the folder `path` sits in), every
    link followed; `ModelFileError` naming `path` otherwise. A model's files are read only from its
    own folder, so a link planted in a downloaded model (to ~/.ssh/id_ed25519) is never read or
    copied beside an output. The one exception: a link to a file directly inside a Hugging Face hub
    cache repository's blobs folder (`.../models--ORG--NAME/blobs/<hash>`), as the cache's snapshots
    and older `local_dir` downloads link their files.

    The rule is for files found inside a folder. A path the user typed (a GGUF file, a tokenizer,
    the model folder itself) is the user's own: callers follow its links first (`os.path.realpath`)
    and apply the rule to what it holds."""
    path = Path(path)
    home = os.path.realpath(folder if folder is not None else path.parent)
    target = os.path.realpath(path)
    if os.path.commonpath((home, target)) == home or _hf_blob(target):
        return Path(target)
    raise ModelFileError(
        path, "is a link to a file outside its folder; coreopt reads only the folder's own files"
    )


def read_in_folder(
    path: Path | str, folder: Path | str | None = None, *, limit: int, whole: bool = True
) -> bytes:
    """The bytes of a regular file that belongs to `folder` (see `resolve_in_folder`), at most
    `limit`: a larger file is refused (`whole`), or only its first `limit` bytes read. The file is
    opened without following a link (one swapped in after the check fails) and never blocks on a
    FIFO or a device."""
    path = Path(path)
    target = resolve_in_folder(path, folder)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, flags)
    except FileNotFoundError:
        raise MissingPathError(path) from None
    except OSError as exc:
        raise ModelFileError(path, f"cannot be opened ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ModelFileError(path, "is not a regular file")
        if whole and info.st_size > limit:
            raise ModelFileError(path, f"is larger than the {limit} bytes such a file may hold")
        data = handle.read(limit + 1 if whole else limit)
    if len(data) > limit:
        raise ModelFileError(path, f"is larger than the {limit} bytes such a file may hold")
    return data


def check_links(folder: Path | str, *, limit: int = _FOLDER_ENTRIES, hidden: bool = True) -> None:
    """Refuse a folder tree holding a link that leads outside it (`resolve_in_folder`'s rule) or
    anything but files and folders (a FIFO blocks whoever opens it), before anything reads the
    folder: a library that opens its files by name (transformers, coreai-core) would follow it. At
    most `limit` entries are looked at (more: refused); links to folders are not descended, and
    with `hidden=False` neither are hidden folders (a git clone's .git, which no reader opens)."""
    folder = Path(folder)
    pending, seen = [folder], 0
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                seen += 1
                if seen > limit:
                    raise ModelFileError(folder, f"holds more than {limit} files and folders")
                target = resolve_in_folder(entry.path, folder) if entry.is_symlink() else Path(entry.path)
                if not (target.is_file() or target.is_dir() or not target.exists()):
                    raise ModelFileError(entry.path, "is not a regular file or a folder")
                if entry.is_dir(follow_symlinks=False) and (hidden or not entry.name.startswith(".")):
                    pending.append(Path(entry.path))
