"""Model files: load and save `.pt2` and `.aimodel`, atomically, with typed errors."""

from ._aimodel import load_aimodel, save_aimodel, verify_aimodel, worker_errors
from ._errors import (
    BadBytecodeError,
    BadMetadataError,
    ConversionError,
    CorruptArchiveError,
    HashMismatchError,
    IncompleteAssetError,
    MissingPathError,
    ModelFileError,
    OutputExistsError,
    SameAsInputError,
    UnsafeArchiveError,
    UnwritableOutputError,
    WrongSuffixError,
    one_line,
)
from ._paths import (
    ModelFormat,
    asset_bytes,
    atomic_output,
    check_output,
    model_format,
    require_existing,
    write_atomically,
)
from ._pt2 import load_pt2, save_pt2
from ._treespec import FlattenedOutput, flattened_outputs

__all__ = [
    "BadBytecodeError",
    "BadMetadataError",
    "ConversionError",
    "CorruptArchiveError",
    "FlattenedOutput",
    "HashMismatchError",
    "IncompleteAssetError",
    "MissingPathError",
    "ModelFileError",
    "ModelFormat",
    "OutputExistsError",
    "SameAsInputError",
    "UnsafeArchiveError",
    "UnwritableOutputError",
    "WrongSuffixError",
    "asset_bytes",
    "atomic_output",
    "check_output",
    "flattened_outputs",
    "load_aimodel",
    "load_pt2",
    "model_format",
    "one_line",
    "require_existing",
    "save_aimodel",
    "save_pt2",
    "verify_aimodel",
    "worker_errors",
    "write_atomically",
]
