"""What coreai-core's native code writes to file descriptor 2, kept off the user's terminal.

MLIR prints diagnostics (a verifier's complaint, a failed op creation) straight to fd 2, where
Python's own stderr handling never sees them: one failed command would print them as extra,
unreadable lines. Around in-process calls into coreai-core, fd 2 goes to a temporary file;
the caller gets the lines and decides what (if anything) the user sees.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

_DIAGNOSTIC = re.compile(r"\berror: (.+)$")


@contextlib.contextmanager
def native_stderr() -> Iterator[list[str]]:
    """Collect fd-2 output written meanwhile; the yielded list is filled when the block ends."""
    lines: list[str] = []
    try:
        fd = sys.__stderr__.fileno() if sys.__stderr__ is not None else 2
    except (AttributeError, OSError, ValueError):
        yield lines  # no real stderr (an embedding host): nothing to collect
        return
    for stream in (sys.stderr, sys.__stderr__):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield lines
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode("utf-8", "replace").splitlines())


def first_error(lines: list[str]) -> str | None:
    """The message of the first MLIR `error:` diagnostic among `lines`, without its location."""
    for line in lines:
        found = _DIAGNOSTIC.search(line)
        if found:
            return found.group(1).strip()
    return None
