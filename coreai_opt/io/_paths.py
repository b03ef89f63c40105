"""Path checks and atomic replacement shared by every model-file writer."""

from __future__ import annotations

import contextlib
import enum
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from ._errors import (
    MissingPathError,
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
