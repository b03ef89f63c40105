"""What a pickle stream would import, read from its opcodes without unpickling it.

Unpickling runs whatever callables the stream names, so a stream is judged by the globals it
imports: `pickletools` lists the opcodes, and GLOBAL / INST / STACK_GLOBAL name them. A stream
whose STACK_GLOBAL operands are not plain strings pushed by the stream itself (so its imports
cannot be read statically), or that uses the copyreg extension registry, is refused as unreadable.
Streams that pass may then be loaded only by torch's weights-only unpickler, whose own list of
allowed globals is the one used here.
"""

from __future__ import annotations

import io
import pickletools
import zipfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from ._zip import ZIP_ERRORS, audit_zip

_STRING_OPS = frozenset(
    {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
)
_NO_PUSH_OPS = frozenset({"PROTO", "FRAME", "STOP", "MARK"})
_PUT_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_GET_OPS = frozenset({"GET", "BINGET", "LONG_BINGET"})


class UnreadablePickle(ValueError):
    """A stream whose imports cannot be determined without running it."""


def _stream_globals(stream: io.BytesIO) -> Iterator[str]:
    memo: dict[int, object] = {}
    pushed: list[object] = []  # what recent opcodes pushed: str where statically known, else None
    for opcode, arg, position in pickletools.genops(stream):
        name = opcode.name
        if name in ("GLOBAL", "INST"):
            module, _, attribute = str(arg).partition(" ")
            yield f"{module}.{attribute}"
            pushed.append(None)
        elif name == "STACK_GLOBAL":
            if len(pushed) < 2 or not all(isinstance(p, str) for p in pushed[-2:]):
                raise UnreadablePickle(f"an import whose name is computed at load time (byte {position})")
            yield f"{pushed[-2]}.{pushed[-1]}"
            pushed[-2:] = [None]
        elif name in ("EXT1", "EXT2", "EXT4"):
            raise UnreadablePickle(f"an import through the copyreg extension registry (byte {position})")
        elif name in _STRING_OPS:
            pushed.append(arg)
        elif name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif name in _PUT_OPS:
            memo[int(arg)] = pushed[-1] if pushed else None  # type: ignore[arg-type]
        elif name in _GET_OPS:
            pushed.append(memo.get(int(arg)))  # type: ignore[arg-type]
        elif name not in _NO_PUSH_OPS:
            pushed.append(None)
        del pushed[:-2]


def pickle_globals(data: bytes) -> list[str]:
    """Every global ('module.name') the pickle streams in `data` import, in order.

    `data` may hold several pickles back to back (torch's legacy format); each is read to its
    STOP. Raises UnreadablePickle when the imports cannot be read without unpickling.
    """
    stream = io.BytesIO(data)
    found: list[str] = []
    try:
        while stream.tell() < len(data):
            found.extend(_stream_globals(stream))
    except UnreadablePickle:
        raise
    except Exception as exc:  # pickletools raises ValueError, struct.error, ... on garbage
        raise UnreadablePickle(f"not a readable pickle stream ({type(exc).__name__}: {exc})") from None
    return found


def torch_save_globals(data: bytes, label: Path) -> list[str]:
    """The globals a `torch.save` payload imports: the pickles of its zip, or a legacy raw stream."""
    if not zipfile.is_zipfile(io.BytesIO(data)):
        return pickle_globals(data)
    nested = io.BytesIO(data)
    entries = audit_zip(nested, label)
    found: list[str] = []
    with zipfile.ZipFile(nested) as archive:
        for name in entries:
            if name.endswith(".pkl"):
                try:
                    found.extend(pickle_globals(archive.read(name)))
                except ZIP_ERRORS as exc:
                    raise UnreadablePickle(f"damaged nested entry {name} ({exc})") from None
    return found


@cache
def weights_only_globals() -> frozenset[str]:
    """The globals torch's weights-only unpickler accepts (tensors, storages, dtypes, containers)."""
    from torch._weights_only_unpickler import _get_allowed_globals

    return frozenset(_get_allowed_globals())


def forbidden_globals(names: list[str]) -> list[str]:
    """The names outside the weights-only allowlist, each once, in order of appearance."""
    allowed = weights_only_globals()
    return list(dict.fromkeys(name for name in names if name not in allowed))
