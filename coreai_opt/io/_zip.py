"""Zip archives from strangers: every structural check before a byte of an entry is trusted.

A `.pt2` (and each `torch.save` payload inside one) is a zip. Python's zipfile raises a zoo of
exception types on damage and will happily inflate a bomb; `audit_zip` turns every one of those
cases into a CorruptArchiveError that names the entry, and records where each stored entry's
bytes lie so that they can be mapped instead of read.
"""

from __future__ import annotations

import contextlib
import re
import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ._errors import CorruptArchiveError

# Deflate cannot expand data by more than about 1032:1; a larger declared ratio is a lie or a bomb.
MAX_DEFLATE_RATIO = 1100
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then name and extra-field lengths at 26 and 28
_LOCAL_SIGNATURE = b"PK\x03\x04"
_DRIVE = re.compile(r"^[A-Za-z]:")
# Everything zipfile and zlib raise on damaged input.
ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    EOFError,
    OSError,
    ValueError,
    struct.error,
    NotImplementedError,
    RuntimeError,
    UnicodeDecodeError,
    OverflowError,
)


@dataclass(frozen=True)
class ZipEntry:
    name: str
    size: int  # uncompressed bytes
    stored: bool  # no compression: the bytes lie at `data_offset` as they are
    data_offset: int  # where the entry's (possibly compressed) bytes start in the archive


def _unsafe_name(name: str) -> bool:
    parts = name.split("/")
    return (
        not name
        or "\x00" in name
        or "\\" in name
        or name.startswith("/")
        or bool(_DRIVE.match(name))
        or any(part == ".." for part in parts)
    )


def _entry_problem(info: zipfile.ZipInfo, archive_size: int) -> str | None:
    name = info.filename
    if _unsafe_name(name):
        return f"unsafe entry name {name!r} (absolute, or climbing out of the archive)"
    if info.flag_bits & 0x1:
        return f"entry {name} is encrypted"
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        return f"entry {name} uses unsupported compression method {info.compress_type}"
    if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
        return f"entry {name} is stored but declares {info.file_size} bytes for {info.compress_size}"
    if info.file_size > MAX_DEFLATE_RATIO * info.compress_size + 4096:
        return (
            f"entry {name} declares {info.file_size} bytes from {info.compress_size} compressed "
            "(more than deflate can produce: a zip bomb or a lying header)"
        )
    if info.header_offset + info.compress_size > archive_size:
        return f"entry {name} lies past the end of the archive"
    return None


def _data_offset(handle: IO[bytes], info: zipfile.ZipInfo, archive_size: int) -> int:
    handle.seek(info.header_offset)
    header = handle.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size:
        raise zipfile.BadZipFile(f"entry {info.filename} has a truncated local header")
    signature, name_length, extra_length = _LOCAL_HEADER.unpack(header)
    if signature != _LOCAL_SIGNATURE:
        raise zipfile.BadZipFile(f"entry {info.filename} has no local header")
    offset = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
    if offset + info.compress_size > archive_size:
        raise zipfile.BadZipFile(f"entry {info.filename} lies past the end of the archive")
    return offset


def _verify_entry(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
    """Read the entry to its end: zipfile checks the CRC-32 and the declared size there."""
    with archive.open(info) as stream:
        while stream.read(1 << 22):
            pass


def audit_zip(source: Path | IO[bytes], label: Path, *, verify: bool = True) -> dict[str, ZipEntry]:
    """Every entry of a zip archive by name, after refusing anything unsafe or damaged.

    `source` is a path or a seekable binary stream (a zip nested in another); errors name
    `label`. With `verify`, every entry is read once so CRC and size damage surface here; a caller
    that refuses entries by name or size first passes `verify=False` and calls `verify_zip` after.
    """
    with _opened(source, label) as (handle, archive, archive_size):
        entries: dict[str, ZipEntry] = {}
        for info in archive.infolist():
            problem = _entry_problem(info, archive_size)
            if problem is None and info.filename in entries:
                problem = f"entry {info.filename} appears twice"
            if problem is not None:
                raise CorruptArchiveError(label, problem)
            offset = _data_offset(handle, info, archive_size)
            stored = info.compress_type == zipfile.ZIP_STORED
            entries[info.filename] = ZipEntry(info.filename, info.file_size, stored, offset)
    if verify:
        verify_zip(source, label)
    return entries


def verify_zip(source: Path | IO[bytes], label: Path) -> None:
    """Read every entry of an audited archive once: CRC-32 and size damage surface here."""
    with _opened(source, label) as (_, archive, _):
        for info in archive.infolist():
            try:
                _verify_entry(archive, info)
            except ZIP_ERRORS as exc:
                detail = "bad CRC-32" if "CRC" in str(exc) else _first_line(exc)
                raise CorruptArchiveError(label, f"damaged zip entry {info.filename} ({detail})") from None


@contextlib.contextmanager
def _opened(source: Path | IO[bytes], label: Path) -> Iterator[tuple[IO[bytes], zipfile.ZipFile, int]]:
    """(handle, zip, archive bytes) of a path or stream; zipfile's errors as one typed line."""
    opened = open(source, "rb") if isinstance(source, Path) else None  # noqa: SIM115
    handle = opened if opened is not None else source
    assert not isinstance(handle, Path)
    try:
        handle.seek(0, 2)
        archive_size = handle.tell()
        handle.seek(0)
        with zipfile.ZipFile(handle) as archive:
            yield handle, archive, archive_size
    except CorruptArchiveError:
        raise
    except ZIP_ERRORS as exc:
        raise CorruptArchiveError(label, f"damaged zip archive ({_first_line(exc)})") from None
    finally:
        if opened is not None:
            opened.close()


def read_entry(archive: Path | IO[bytes], name: str, label: Path) -> bytes:
    """The bytes of one (already audited) entry."""
    try:
        with zipfile.ZipFile(archive) as zf:
            return zf.read(name)
    except ZIP_ERRORS as exc:
        raise CorruptArchiveError(label, f"damaged zip entry {name} ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
