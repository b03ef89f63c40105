"""Handing memory back to the operating system between weights (Linux; elsewhere these do nothing).

A compression pass reads each weight once and frees what it made for it, but two things keep the
pages in the process: glibc keeps freed heap memory for later allocations (a weight's float32
copies and codes are freed in pieces, so the heap stays at its high-water mark), and pages of a
file mapped by a native library (coreai-core maps the bytecode it loads) stay resident once read.
Both are harmless to give back: the heap is trimmed, and clean file pages are read again from the
file if anything touches them later. Peak memory then follows the weight in hand, not the model.

A third thing outlives its last use: a program let go is garbage only to the cyclic collector (a
GraphModule and its graph refer to each other), which may not run for minutes, so its weights and
what a pass hung on it stay resident. Between phases `release_garbage` collects (where the program
is large enough to pay for the walk) and then trims.

File pages leave the process's mapping only (MADV_DONTNEED), not the system's page cache: a later
reader of the same file - the parent after the asset check's worker, the save after the pass -
finds them there instead of on the disk (paging them out, MADV_PAGEOUT, made a 0.5 GB asset's
check and quantize read it from the disk three times). Both are done once per `RELEASE_EVERY`
bytes of weights (`EveryBytes`), not after each one: a trim hands back pages the next weight's
temporaries fault in again, which doubled the CPU time of an int8 pass over 211 small weights.
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import gc
import os
import sys
from collections.abc import Callable
from typing import Any

_MADV_DONTNEED = 4  # the mappings are coreai-core's: libc's madvise takes their addresses
_MADV_PAGEOUT = 21  # Linux 5.4+
RELEASE_EVERY = 64 << 20  # bytes of weights between two hand-backs


@functools.cache
def _libc() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    if hasattr(libc, "madvise"):
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def trim_heap() -> None:
    """Return the free memory at the top and inside glibc's heap to the system (malloc_trim)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def release_garbage(nbytes: int) -> None:
    """Free what only reference cycles still hold (a program let go, its graph and weights: about
    `nbytes`), then trim the heap. For phase boundaries, never per weight: a collection walks every
    object (0.2-0.5 s in a process with torch loaded), so a program under `RELEASE_EVERY` bytes is
    left to the collector's own time."""
    if nbytes >= RELEASE_EVERY:
        gc.collect()
    trim_heap()


def _file_mappings() -> list[tuple[int, int, str, str]]:
    """(start, end, permissions, path) of this process's mappings of files (/proc/self/maps)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            lines = maps.readlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue  # anonymous memory (the heap, tensors made here) is no file's
        low, high = (int(v, 16) for v in fields[0].split("-"))
        found.append((low, high, fields[1], fields[5].rstrip("\n")))
    return found


def release_file_pages(file_name: str) -> int:
    """Drop this process's read-only mappings of files named `file_name` from its resident set
    (pages it has read and may read again from the file or the page cache); returns how many.
    Writable mappings are left alone: MADV_DONTNEED discards a private mapping's modified pages,
    and a read-only one (coreai-core maps the bytecode `r--p`) has none."""
    libc = _libc()
    if libc is None or not hasattr(libc, "madvise"):
        return 0
    released = 0
    for low, high, permissions, path in _file_mappings():
        if "w" not in permissions and os.path.basename(path) == file_name:
            released += libc.madvise(low, high - low, _MADV_DONTNEED) == 0
    return released


def page_out_mapped(addresses: list[int]) -> int:
    """Page out the file mappings that hold any of `addresses` (a weight's data mapped from its
    model file): their clean pages leave the resident set, read again from the file when touched;
    a page written to stays (MADV_PAGEOUT never discards data, unlike MADV_DONTNEED). For a pass
    that read every weight once and will next read them one segment at a time. Returns how many
    mappings were paged out."""
    libc = _libc()
    if libc is None or not hasattr(libc, "madvise") or not addresses:
        return 0
    wanted = sorted(addresses)
    paged = 0
    for low, high, _, _ in _file_mappings():
        at = bisect.bisect_left(wanted, low)
        if at < len(wanted) and wanted[at] < high:
            paged += libc.madvise(low, high - low, _MADV_PAGEOUT) == 0
    return paged


class EveryBytes:
    """Runs `action` once `every` bytes (of weights handled) have passed since it last ran."""

    def __init__(self, action: Callable[[], object], every: int = RELEASE_EVERY) -> None:
        self._action = action
        self._every = every
        self._passed = 0

    def passed(self, nbytes: int) -> None:
        self._passed += nbytes
        if self._passed >= self._every:
            self._action()
            self._passed = 0


def meta_stand_in(value: Any) -> Any:
    """A meta tensor of a tensor's shape, strides and dtype (a Parameter for a Parameter): a name
    kept for a graph, its memory let go."""
    import torch

    empty = value.detach().to("meta")
    return torch.nn.Parameter(empty, value.requires_grad) if isinstance(value, torch.nn.Parameter) else empty
