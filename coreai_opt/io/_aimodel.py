"""Reading and writing Core AI assets (`.aimodel` directories) through coreai-core."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coreai_opt._coreai import BYTECODE_FILE

from ._checked import file_identity, remember, was_checked
from ._errors import (
    BadBytecodeError,
    BadMetadataError,
    HashMismatchError,
    IncompleteAssetError,
    ModelFileError,
    UnwritableOutputError,
    one_line,
)
from ._paths import ModelFormat, check_links, check_output, model_format, require_existing, write_atomically

if TYPE_CHECKING:
    from coreai.authoring import AIProgram

    from coreai_opt._coreai import AssetWorker

HASH_FILE = "main.hash"
METADATA_FILE = "metadata.json"
MAX_METADATA_BYTES = 1 << 20
CRASHED = f"{BYTECODE_FILE} is corrupt (the Core AI library crashed reading it)"
HASH_MISMATCH = f"{HASH_FILE} does not match the SHA-256 of {BYTECODE_FILE}"
_SHA256_BYTES = 32
# Assets read without harm (or written by us), by `_asset_key`: this process never pays
# twice for the same asset, and the record in `_checked` spares later processes too.
_verified: set[tuple[object, ...]] = set()


def _asset_key(path: Path, recorded: str, metadata_digest: str) -> tuple[object, ...]:
    return (file_identity(path / BYTECODE_FILE), recorded, metadata_digest)


def _check_files(path: Path) -> tuple[dict[str, Any], str, str]:
    """Layout and metadata, checked in Python: (metadata, the bytecode's SHA-256 hex as main.hash
    records it, SHA-256 hex of the metadata file). The bytecode itself is hashed by the worker that
    reads it (one pass over a file of gigabytes, not two)."""
    require_existing(path)
    model_format(path, (ModelFormat.AIMODEL,))
    if not path.is_dir():
        raise IncompleteAssetError(path, "an .aimodel asset must be a directory")
    check_links(path)  # coreai-core opens the asset's files by name: none may lead out of it
    for name in (BYTECODE_FILE, METADATA_FILE, HASH_FILE):
        if not (path / name).is_file():
            raise IncompleteAssetError(path, f"asset has no {name}")
    if (path / METADATA_FILE).stat().st_size > MAX_METADATA_BYTES:
        raise BadMetadataError(path, f"{METADATA_FILE} is larger than any asset's metadata")
    metadata_bytes = (path / METADATA_FILE).read_bytes()
    try:
        metadata = json.loads(metadata_bytes.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadMetadataError(path, f"{METADATA_FILE} is not valid JSON ({exc})") from None
    if not isinstance(metadata, dict):
        raise BadMetadataError(path, f"{METADATA_FILE} is not a JSON object")
    if not isinstance(metadata.get("assetVersion"), str):
        raise BadMetadataError(path, f"{METADATA_FILE} has no assetVersion string")
    with open(path / HASH_FILE, "rb") as hash_file:
        recorded = hash_file.read(_SHA256_BYTES + 1)
    if len(recorded) != _SHA256_BYTES:
        raise HashMismatchError(path, HASH_MISMATCH)
    return metadata, recorded.hex(), hashlib.sha256(metadata_bytes).hexdigest()


@contextlib.contextmanager
def worker_errors(path: Path) -> Iterator[None]:
    """What a worker reports about an asset, as the typed one-line error it deserves."""
    from coreai_opt._coreai import WorkerFailure

    try:
        yield
    except WorkerFailure as failure:
        if failure.kind == "crash" and failure.stage == "reading":
            raise BadBytecodeError(path, CRASHED) from None
        if failure.kind == "hash":
            raise HashMismatchError(path, HASH_MISMATCH) from None
        if failure.kind == "metadata":
            raise BadMetadataError(path, f"{METADATA_FILE}: {failure}") from None
        if failure.kind == "bytecode":
            raise BadBytecodeError(path, str(failure)) from None
        raise ModelFileError(path, str(failure)) from None


def verify_aimodel(path: Path | str, worker: AssetWorker | None = None) -> dict[str, Any]:
    """Check an asset completely before coreai-core touches it in this process; return its metadata.

    Layout and metadata are checked here; the bytecode's hash against main.hash and every native
    step (parse, verify, conversion, reading every constant, printing) run first in a worker
    process (`worker`, or a fresh one), because coreai-core crashes the process on some damaged
    bytecode instead of raising. The bytecode file must be the same file, unwritten, before and
    after the worker read it. An unchanged asset that passed before, in this process or an earlier
    one, or that coreopt wrote, is not read again (`_checked`).
    """
    from coreai_opt._coreai import AssetWorker

    path = Path(path)
    metadata, recorded, metadata_digest = _check_files(path)
    key = _asset_key(path, recorded, metadata_digest)
    if key in _verified or was_checked(key):
        _verified.add(key)
        return metadata
    with worker_errors(path), contextlib.ExitStack() as stack:
        if worker is None:
            worker = stack.enter_context(AssetWorker(path, runs=False))
        worker.verify(recorded)
    if _asset_key(path, recorded, metadata_digest) != key:
        raise ModelFileError(path, f"{BYTECODE_FILE} changed while it was being read")
    _verified.add(key)
    remember(key)
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
            raise UnwritableOutputError(
                path, f"coreai-core could not save the program ({one_line(cause)})"
            ) from exc
        _settle_metadata(tmp / METADATA_FILE)

    write_atomically(path, write)
    _, recorded, metadata_digest = _check_files(path)
    key = _asset_key(path, recorded, metadata_digest)  # what we wrote needs no worker to read it
    _verified.add(key)
    remember(key)
    return path


def _settle_metadata(path: Path) -> None:
    """Rewrite coreai-core's metadata.json with its keys in a fixed order (coreai-core's order
    varies from run to run) and, with SOURCE_DATE_EPOCH set (reproducible-builds.org), that time as
    creationDate: the same input then gives a byte-identical asset."""
    import os
    import time

    metadata = json.loads(path.read_text(encoding="utf-8"))
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if epoch.isdigit():
        metadata["creationDate"] = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(int(epoch)))
    path.write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n", encoding="utf-8")
