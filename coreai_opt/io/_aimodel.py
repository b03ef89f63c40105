"""Reading and writing Core AI assets (`.aimodel` directories) through coreai-core."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._errors import (
    BadBytecodeError,
    BadMetadataError,
    HashMismatchError,
    IncompleteAssetError,
    UnwritableOutputError,
)
from ._paths import ModelFormat, check_output, model_format, require_existing, write_atomically

if TYPE_CHECKING:
    from coreai.authoring import AIProgram

BYTECODE_FILE = "main.mlirb"
HASH_FILE = "main.hash"
METADATA_FILE = "metadata.json"


def verify_aimodel(path: Path | str) -> dict[str, Any]:
    """Check an asset's layout, metadata, hash and bytecode; return its metadata.

    Every check runs before coreai-core sees the files, because its loader crashes the
    interpreter on a damaged asset instead of raising.
    """
    path = Path(path)
    require_existing(path)
    model_format(path, (ModelFormat.AIMODEL,))
    if not path.is_dir():
        raise IncompleteAssetError(path, "an .aimodel asset must be a directory")
    for name in (BYTECODE_FILE, METADATA_FILE, HASH_FILE):
        if not (path / name).is_file():
            raise IncompleteAssetError(path, f"asset has no {name}")
    try:
        metadata = json.loads((path / METADATA_FILE).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadMetadataError(path, f"{METADATA_FILE} is not valid JSON ({exc})") from exc
    if not isinstance(metadata, dict):
        raise BadMetadataError(path, f"{METADATA_FILE} is not a JSON object")
    bytecode = (path / BYTECODE_FILE).read_bytes()
    stored = (path / HASH_FILE).read_bytes()
    if stored != hashlib.sha256(bytecode).digest():
        raise HashMismatchError(path, f"{HASH_FILE} does not match the SHA-256 of {BYTECODE_FILE}")
    from coreai_opt._coreai import parse_bytecode_checked

    try:
        parse_bytecode_checked(bytecode)
    except ValueError as exc:
        raise BadBytecodeError(path, f"{BYTECODE_FILE}: {exc}") from exc
    return metadata


def load_aimodel(path: Path | str) -> AIProgram:
    """Load the program of a verified asset."""
    path = Path(path)
    verify_aimodel(path)
    from coreai.authoring import AIModelAsset

    return AIModelAsset.load(path).program


def save_aimodel(
    program: AIProgram, path: Path | str, *, force: bool = False, inputs: tuple[Path, ...] = ()
) -> Path:
    """Save atomically (coreai-core deletes the target before writing; we never do that)."""
    path = Path(path)
    model_format(path, (ModelFormat.AIMODEL,))
    check_output(path, force=force, inputs=inputs)

    def write(tmp: Path) -> None:
        try:
            program.save_asset(tmp)
        except RuntimeError as exc:
            cause = exc.__cause__ or exc
            raise UnwritableOutputError(path, f"coreai-core could not save the program ({cause})") from exc

    write_atomically(path, write)
    return path
