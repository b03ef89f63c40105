"""Handing memory back to the operating system between weights (Linux; elsewhere these do nothing).

A compression pass reads each weight once and frees what it made for it, but two things keep the
pages in the process: glibc keeps freed heap memory for later allocations (a weight's float32
copies and codes are freed in pieces, so the heap stays at its high-water mark), and pages of a
file mapped by a native library (coreai-core maps the bytecode it loads) stay resident once read.
Both are harmless to give back: the heap is trimmed, and clean file pages are read again from the
file if anything touches them later. Peak memory then follows the weight in hand, not the model.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from typing import Any

_MADV_PAGEOUT = 21  # Linux >= 5.4 (Python 3.11's mmap module does not name it)


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


def release_file_pages(file_name: str) -> int:
    """Page out this process's read-only mappings of files named `file_name` (resident pages of
    data the process has read and may read again from the file); returns how many mappings."""
    libc = _libc()
    if libc is None or not hasattr(libc, "madvise"):
        return 0
    released = 0
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            lines = maps.readlines()
    except OSError:
        return 0
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or "w" in fields[1] or os.path.basename(fields[5].rstrip("\n")) != file_name:
            continue
        low, high = (int(v, 16) for v in fields[0].split("-"))
        if libc.madvise(low, high - low, _MADV_PAGEOUT) == 0:  # only advice: an old kernel refuses it
            released += 1
    return released
