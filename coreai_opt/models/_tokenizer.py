"""A source's tokenizer as `tokenizer.json` text: the folder's own file, parsed; else what
transformers builds from the folder's other tokenizer files or from the GGUF metadata.

transformers takes file names from the data of those files: `tokenizer_config.json`'s
`fast_tokenizer_files` and `*_file` keys, and `special_tokens_map.json`'s keys, which it merges into
the same arguments - a name such as `../../.ssh/id_ed25519` or an absolute path is opened as given,
and what it reads becomes the tokenizer written beside the output. A string under `vocab` or
`merges`, or among `init_inputs` (the tokenizer's positional arguments), is a path opened as given,
from wherever coreopt runs. So before transformers builds a tokenizer from a folder, both files are
read from the folder (`read_in_folder`): every file name they hold must be a plain name, a file of
the folder, and no path may stand where those arguments take their data.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from coreai_opt.io import ModelFileError, one_line, read_json

from ._loading import Given, quiet
from ._sidecar import read_tokenizer
from ._source import ModelSource

_OWN = "tokenizer.json"
_ARGUMENT_FILES = ("tokenizer_config.json", "special_tokens_map.json")  # transformers' tokenizer arguments
_ARGUMENTS_LIMIT = 16 << 20  # bytes of one of them (chat templates make a config large)
# Arguments whose string values transformers opens as paths as given, never in the folder: a
# vocabulary or merges file (`vocab`, `merges`), or the positional arguments (`init_inputs`).
_PATH_ARGUMENTS = ("vocab", "merges", "init_inputs")


def source_tokenizer(src: ModelSource, given: Given) -> str | None:
    """The tokenizer of `src` as `tokenizer.json` text, as parsed: the folder's own file (one that
    does not parse is refused - a model published without its tokenizer is a surprise found too
    late), else what transformers builds from `given` (the folder's other tokenizer files, their
    file names checked first, or the GGUF metadata); None when there is none."""
    own = src.path / _OWN
    if not src.gguf and os.path.lexists(own):
        return read_tokenizer(own, src.real).to_str()
    if not src.gguf:
        _check_file_names(src)
    try:
        import transformers

        with quiet():
            made = transformers.AutoTokenizer.from_pretrained(given.folder, **given.options)
        return made.backend_tokenizer.to_str()
    except Exception:  # no tokenizer in the source: the program is still useful without one
        return None


def _check_file_names(src: ModelSource) -> None:
    """Refuse (one line naming the file) tokenizer arguments that name a file other than by a plain
    name of the folder, or that give a path transformers would open wherever it leads."""
    for name in _ARGUMENT_FILES:
        path = src.path / name
        if not os.path.lexists(path):
            continue
        arguments = read_json(path, src.real, limit=_ARGUMENTS_LIMIT)
        if not isinstance(arguments, dict):
            raise ModelFileError(path, "is not a JSON object of tokenizer arguments")
        for key, value in arguments.items():
            found = _outside(key, value)
            if found is not None:
                raise ModelFileError(
                    path, f"{key[:60]} names {one_line(repr(found), 200)}, not a file of its folder"
                )


def _outside(key: str, value: Any) -> Any:
    """The first value under `key` that transformers would open as a file outside the folder, or None."""
    if key.endswith(("_file", "_files")):  # names transformers looks up in the folder, or opens as given
        values = value if key.endswith("_files") and isinstance(value, list) else [value]
        return next((v for v in values if v is not None and not _plain_name(v)), None)
    if key in _PATH_ARGUMENTS:  # every string a path, opened as given (a list or object is inline data)
        values = value if key == "init_inputs" and isinstance(value, list) else [value]
        return next((v for v in values if isinstance(v, str)), None)
    return None


def _plain_name(value: Any) -> bool:
    """A file name with no folder in it: `Path(value).name == value`, no separator, not `.` or `..`."""
    return (
        isinstance(value, str)
        and value not in ("", ".", "..")
        and Path(value).name == value
        and not any(sep in value for sep in ("/", "\\", "\0"))
    )
