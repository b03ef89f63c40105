"""Typed errors for model files: each names the path and the problem in one line; text from outside
as it may be printed (`printable`, kept below every package so the cache rule shares it)."""

from __future__ import annotations

from pathlib import Path

from coreai_opt.errors import printable as printable  # beside `one_line`: the library's text rules


def one_line(text: object, limit: int = 300) -> str:
    """A library's message as one line of at most `limit` characters (native errors can carry a
    whole program's IR)."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 14] + " ... (cut off)"


class ModelFileError(Exception):
    """A model file cannot be read or written; `str()` is one line for the user."""

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class MissingPathError(ModelFileError):
    """The input path does not exist."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(path, "no such file or directory")


class WrongSuffixError(ModelFileError):
    """The path does not carry a suffix this operation accepts."""

    def __init__(self, path: Path | str, expected: tuple[str, ...]) -> None:
        wanted = " or ".join(expected)
        super().__init__(path, f"expected a {wanted} path, got suffix {Path(path).suffix or '(none)'!r}")


class CorruptArchiveError(ModelFileError):
    """A `.pt2` file is not a readable torch.export archive (not a zip, truncated, foreign zip)."""


class UnsafeArchiveError(ModelFileError):
    """A model file holds something that would run code when loaded (a pickle, compiled code)."""


class ProgramRunError(ModelFileError):
    """A program read from a file failed, or died, when run: the node and the reason."""


class IncompleteAssetError(ModelFileError):
    """An `.aimodel` directory lacks one of its files, or is not a directory."""


class HashMismatchError(ModelFileError):
    """`main.hash` does not hold the SHA-256 digest of `main.mlirb`."""


class BadBytecodeError(ModelFileError):
    """`main.mlirb` is not valid Core AI bytecode."""


class BadMetadataError(ModelFileError):
    """`metadata.json` is not a JSON object, or lacks a supported asset version."""


class UnwritableOutputError(ModelFileError):
    """The output cannot be written where it was asked for."""


class OutputExistsError(ModelFileError):
    """The output exists and overwriting was not asked for."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(path, "output already exists (pass --force to overwrite)")


class SameAsInputError(ModelFileError):
    """The output path is the input path; inputs are never modified."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(path, "refusing to write the output onto the input file")


class ConversionError(ModelFileError):
    """coreai-torch could not convert a program; the message is the converter's own."""
