"""Reading and writing `torch.export` archives (`.pt2`)."""

from __future__ import annotations

import contextlib
import logging
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ._errors import CorruptArchiveError
from ._paths import ModelFormat, check_output, model_format, require_existing, write_atomically

if TYPE_CHECKING:
    from torch.export import ExportedProgram


@contextlib.contextmanager
def _quiet_torch_export() -> Iterator[None]:
    """torch.export.load logs a full traceback before raising; the caller reports the error itself."""
    logger = logging.getLogger("torch.export")
    previous = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(previous)


def _check_archive(path: Path) -> None:
    if path.is_dir():
        raise CorruptArchiveError(path, "is a directory, not a .pt2 archive")
    if path.stat().st_size == 0:
        raise CorruptArchiveError(path, "file is empty")
    if not zipfile.is_zipfile(path):
        raise CorruptArchiveError(path, "not a zip archive (truncated or not a .pt2 file)")
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            broken = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise CorruptArchiveError(path, f"damaged zip archive ({exc})") from exc
    if broken is not None:
        raise CorruptArchiveError(path, f"damaged zip archive (bad CRC in {broken})")
    if not any(name.endswith(".json") and "/models/" in name for name in names):
        raise CorruptArchiveError(path, "zip archive holds no torch.export program")


def load_pt2(path: Path | str) -> ExportedProgram:
    """Load an ExportedProgram, raising a ModelFileError with one clear line on bad input."""
    path = Path(path)
    require_existing(path)
    model_format(path, (ModelFormat.PT2,))
    _check_archive(path)
    import torch

    try:
        with _quiet_torch_export():
            return torch.export.load(path)
    except Exception as exc:  # torch raises RuntimeError, KeyError, ... on damaged archives
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CorruptArchiveError(path, f"cannot read torch.export archive ({detail})") from exc


def save_pt2(
    program: ExportedProgram, path: Path | str, *, force: bool = False, inputs: tuple[Path, ...] = ()
) -> Path:
    """Save atomically; refuse to overwrite an input, or an existing file unless `force`."""
    path = Path(path)
    model_format(path, (ModelFormat.PT2,))
    check_output(path, force=force, inputs=inputs)
    import torch

    write_atomically(path, lambda tmp: torch.export.save(program, tmp))
    return path
