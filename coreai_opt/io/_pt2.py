"""Reading and writing `torch.export` archives (`.pt2`).

Reading never runs what a file contains unless the caller trusts it (see `_pt2_archive`).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import threading
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ._errors import CorruptArchiveError, UnwritableOutputError
from ._paths import ModelFormat, check_output, model_format, require_existing, write_atomically
from ._pt2_archive import Pt2Archive
from ._runs import remember_saved

if TYPE_CHECKING:
    from torch.export import ExportedProgram


class _Collected(logging.Handler):
    """What torch logged while (de)serializing, kept for the error message instead of printed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        self.lines.append(record.getMessage() + (f": {error}" if error is not None else ""))


@contextlib.contextmanager
def _quiet_torch_export() -> Iterator[list[str]]:
    """torch logs tracebacks and warns about its own storage layout while (de)serializing, and
    its errors then say "check the warnings above": the lines are collected (yielded list) for
    the caller's one-line error instead of printed."""
    loggers = [logging.getLogger(name) for name in ("torch.export", "torch._export")]
    previous = [(logger.level, logger.propagate, logger.handlers) for logger in loggers]
    collected = _Collected()
    for logger in loggers:
        logger.setLevel(logging.WARNING)
        logger.propagate = False
        logger.handlers = [collected]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.")
            yield collected.lines
    finally:
        for logger, (level, propagate, handlers) in zip(loggers, previous, strict=True):
            logger.handlers = handlers
            logger.setLevel(level)
            logger.propagate = propagate


def _open_archive(path: Path) -> Pt2Archive:
    if path.is_dir():
        raise CorruptArchiveError(path, "is a directory, not a .pt2 archive")
    if path.stat().st_size == 0:
        raise CorruptArchiveError(path, "file is empty")
    if not zipfile.is_zipfile(path):
        raise CorruptArchiveError(path, "not a zip archive (truncated or not a .pt2 file)")
    return Pt2Archive(path)


def load_pt2(path: Path | str, *, trust_pickle: bool = False) -> ExportedProgram:
    """Load an ExportedProgram; bad or unsafe files raise a ModelFileError with one clear line.

    By default nothing in the file runs: pickled state that imports more than tensors, pickled
    objects and compiled code are refused (`UnsafeArchiveError`), other pickles go through
    torch's weights-only unpickler, the sample inputs are not loaded (the program's
    `example_inputs` is None) and shape expressions are checked before torch evaluates them.
    `trust_pickle=True` hands the (structurally checked) file to `torch.export.load` as it is,
    for files the caller made itself.
    """
    path = Path(path)
    require_existing(path)
    model_format(path, (ModelFormat.PT2,))
    archive = _open_archive(path)
    if trust_pickle:
        import torch

        archive.register_custom_ops()
        with _quiet_torch_export() as logged:
            try:
                return torch.export.load(path)
            except Exception as exc:  # torch raises RuntimeError, KeyError, ... on damaged archives
                failure = exc
        told = "; ".join(logged) or str(failure)  # torch's error says "check the warnings above"
        if "in pytree is not registered" in told:
            told += "; without --trust-pickle coreopt reads such output containers as tuples"
        detail = " ".join(told.split())[:400] or type(failure).__name__
        raise CorruptArchiveError(path, f"cannot read torch.export archive ({detail})")
    archive.audit()
    with _quiet_torch_export():
        return archive.load_program()


def save_pt2(
    program: ExportedProgram, path: Path | str, *, force: bool = False, inputs: tuple[Path, ...] = ()
) -> Path:
    """Save atomically; refuse to overwrite an input, or an existing file unless `force`."""
    path = Path(path)
    model_format(path, (ModelFormat.PT2,))
    check_output(path, force=force, inputs=inputs)
    import torch

    from coreai_opt._memory import PagingWriter

    def write(tmp: Path) -> None:
        # Through a file object: torch names the archive's root folder after a path's file name,
        # which would leak the temporary name and make every save differ.
        with _quiet_torch_export(), _weights_written_once(), open(tmp, "wb") as stream:
            try:
                torch.export.save(program, PagingWriter(stream, _host_addresses(program)))
            except KeyError as missing:  # its serializer's table of dtypes lacks one (older torch)
                if not (missing.args and isinstance(missing.args[0], torch.dtype)):
                    raise
                raise UnwritableOutputError(
                    path,
                    f"torch {torch.__version__} cannot store {missing.args[0]} tensors in a .pt2 "
                    "(torch.export's serializer lacks the dtype; a later torch has it)",
                ) from None

    write_atomically(path, write)
    remember_saved(program, path)
    return path


def _host_addresses(program: ExportedProgram) -> list[int]:
    """Where the program's host tensors lie: those mapped from a file (its source's weights, its
    parked ones) are paged out as the save goes past them."""
    import torch

    tensors = (*program.state_dict.values(), *program.constants.values())
    return [
        t.data_ptr() for t in tensors
        if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.layout == torch.strided and t.numel()
    ]  # fmt: skip


_PATCHING = threading.Lock()


@contextlib.contextmanager
def _weights_written_once(force: bool = False) -> Iterator[None]:
    """torch 2.9-2.12's `torch.export.save` writes each weight to the archive and then, to
    serialize the graph, also pickles the whole state dict and every constant into one buffer
    that it throws away: the program's weights held twice while it saves (1.1 GiB more at the
    1.1B decoder on torch 2.11; docs/benchmarks.md). There (`_discards_pickled_weights`, or with
    `force`), the graph is serialized from a copy of the program whose tensors are meta stand-ins:
    the same archive bytes (tested), without the buffer. Saves in one process take turns."""
    with _PATCHING:
        try:
            from torch.export.pt2_archive import _package
        except ImportError:  # a torch that packages archives another way: saved as it saves them
            yield
            return
        original = getattr(_package, "serialize", None)
        if original is None or not (force or _discards_pickled_weights(_package, original)):
            yield
            return

        def serialize(program: ExportedProgram, *args: object, **kwargs: object) -> object:
            return original(_weightless(program), *args, **kwargs)

        _package.serialize = serialize
        try:
            yield
        finally:
            _package.serialize = original


def _discards_pickled_weights(package: object, serialize: object) -> bool:
    """Whether this torch's packager writes weights and constants a tensor at a time and never
    reads the state dict or constants `serialize` pickles (torch 2.8's wrote that pickle as the
    archive's weights: meta stand-ins there would lose them), while `serialize` still pickles them
    (torch 2.13 has a flag that skips it, and passes it)."""
    writer = getattr(package, "_package_exported_programs", None)
    code = getattr(writer, "__code__", None)
    if code is None or not all(hasattr(package, n) for n in ("_package_state_dict", "_package_constants")):
        return False
    if {"state_dict", "constants"} & set(code.co_names):
        return False
    return "serialize_state_dict" not in inspect.signature(serialize).parameters  # type: ignore[arg-type]


def _weightless(program: ExportedProgram) -> ExportedProgram:
    """A shallow copy of `program` whose state dict and tensor constants are meta tensors of the
    same shapes, dtypes and kinds (what its graph's serialization reads of them)."""
    import torch

    from coreai_opt._memory import meta_stand_in

    def meta(t: object) -> object:
        if not isinstance(t, torch.Tensor):
            return t
        try:
            return meta_stand_in(t)
        except (RuntimeError, NotImplementedError):  # a quantized dtype, a sparse layout: pickled as it is
            return t

    light = copy.copy(program)
    light._state_dict = {k: meta(v) for k, v in program.state_dict.items()}
    light._constants = {k: meta(v) for k, v in program.constants.items()}
    return light
