"""What transformers is given of a checked source: its files only, quietly, from local files, with
no remote code.

transformers opens files by name in the folder it is given: config.json, generation_config.json,
tokenizer files, even beside a GGUF file it was told to read. A GGUF file's folder is nobody's
model folder (~/Downloads), so a GGUF file is handed over alone: a private temporary folder holding
one link, named like the file, to the file `open_source` checked. A Hugging Face folder is handed
over as checked (`check_links`), where its own links lead.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ._source import ModelSource


@dataclass(frozen=True)
class Given:
    """The folder transformers is pointed at, and the options every loader takes with it."""

    folder: str
    options: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def given_folder(src: ModelSource) -> Iterator[Given]:
    """The folder and options to load `src` from, for as long as the block runs; a GGUF file's
    private folder (made by `tempfile.mkdtemp`: the user's alone) is removed afterwards."""
    options: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}
    if not src.gguf:
        yield Given(str(src.real), options)
        return
    private = tempfile.mkdtemp(prefix="coreopt-gguf-")
    try:
        os.symlink(src.real, os.path.join(private, src.path.name))
        yield Given(private, options | {"gguf_file": src.path.name})
    finally:
        shutil.rmtree(private, ignore_errors=True)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """transformers' own progress bars and advice are not ours to print."""
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        transformers.logging.set_verbosity(level)
