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

A fourth is what a pass makes and keeps: a compressed `.pt2` holds its new tensors until it is
saved, and sub-byte codes take a byte each there, so the codes of a 1.1B model sat on the heap
(1.1 GiB) beside everything else. Within `spilling(folder)` such tensors are parked in an unnamed
file (`Spill`), held as its mapped pages, paged out as they pass, and a save through a
`PagingWriter` pages out what it has read of them (and of the source's mapped weights) as it goes.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import ctypes
import functools
import gc
import io
import mmap
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

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
    if not addresses:
        return 0
    return _advise_holding(addresses, [(low, high) for low, high, _, _ in _file_mappings()], _MADV_PAGEOUT)


def release_clean_mapped(addresses: list[int]) -> int:
    """Drop from the resident set the file mappings that hold any of `addresses` and have no
    page written (a private mapping's written page would be lost: those are left alone). Their
    pages stay in the page cache, so a later read costs a minor fault, not the disk (unlike
    `page_out_mapped`): for weights read again soon, but not in the meantime. Returns how many."""
    if not addresses:
        return 0
    holding = _holding(addresses, [(low, high) for low, high, _, _ in _file_mappings()])
    return _advise(_unwritten(holding), _MADV_DONTNEED)


def _advise_holding(addresses: list[int], mappings: list[tuple[int, int]], advice: int) -> int:
    """madvise(`advice`) on each of `mappings` (start, end) that holds any of `addresses`; how many
    took it."""
    return _advise(_holding(addresses, mappings), advice)


def _holding(addresses: list[int], mappings: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The `mappings` (start, end) that hold any of `addresses`."""
    wanted = sorted(addresses)
    found = []
    for low, high in mappings:
        at = bisect.bisect_left(wanted, low)
        if at < len(wanted) and wanted[at] < high:
            found.append((low, high))
    return found


def _advise(mappings: list[tuple[int, int]], advice: int) -> int:
    """madvise(`advice`) on each of `mappings`; how many took it."""
    libc = _libc()
    if libc is None or not hasattr(libc, "madvise"):
        return 0
    return sum(libc.madvise(low, high - low, advice) == 0 for low, high in mappings)


_PAGE = mmap.PAGESIZE
_PRESENT, _SWAPPED, _FILE_PAGE = 1 << 63, 1 << 62, 1 << 61  # /proc/self/pagemap's flags of a page
_FLAGS_READ = 1 << 20  # pagemap entries read at a time (8 MiB: a 4 GiB mapping's flags in 1 MiB reads)


def _unwritten(mappings: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Those of `mappings` (file mappings' start, end) without a written page: no page in memory
    that is not the file's own (a private mapping's copy on write) and none swapped out - read
    from /proc/self/pagemap for their own pages only (/proc/self/smaps walks every page of the
    process: 70 ms a call at 5 GiB, 18 s of a tuning run that hands back once a sample). None
    where the flags cannot be read (nothing is handed back: the safe side), nor a mapping whose
    flags read short. A kernel that leaves the file flag off huge file pages keeps those
    mappings (taken as written)."""
    try:
        with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
            return [(low, high) for low, high in mappings if _unwritten_pages(pagemap, low, high)]
    except OSError:
        return []


def _unwritten_pages(pagemap: BinaryIO, low: int, high: int) -> bool:
    """Whether the pages of [low, high) read as unwritten, a bounded piece of flags at a time."""
    import numpy as np

    first, last = low // _PAGE, high // _PAGE
    for start in range(first, last, _FLAGS_READ):
        count = min(_FLAGS_READ, last - start)
        pagemap.seek(start * 8)
        raw = pagemap.read(count * 8)
        if raw is None or len(raw) != count * 8 or _any_written(np.frombuffer(raw, dtype=np.uint64)):
            return False
    return True


def _any_written(flags: Any) -> bool:
    """Whether any of a file mapping's pages (their pagemap entries, uint64) was written: in memory
    but not the file's page, or swapped out (only written pages of a file mapping are swapped)."""
    import numpy as np

    copied = (flags & np.uint64(_PRESENT | _FILE_PAGE)) == np.uint64(_PRESENT)
    return bool(copied.any() or (flags & np.uint64(_SWAPPED)).any())


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


class ReadOnce:
    """Weights read from a mapped file and done with for now: their clean file pages leave the
    resident set once `RELEASE_EVERY` bytes of them have passed (`release_clean_mapped`), as a
    pass that keeps each weight as given for later (tuning's reference) would otherwise hold the
    whole program's pages by its end (a tensor of no file mapping has nothing to hand back). A
    weight is passed as it is read, before it is used: each hand-back takes the ones before it,
    and the tensors are held until then, so no address handed back was freed and reused."""

    def __init__(self) -> None:
        self._held: list[Any] = []
        self._every = EveryBytes(self.release, RELEASE_EVERY)

    def passed(self, tensor: Any) -> Any:
        """`tensor`, about to be read; on the CPU, held for the hand-back after the next."""
        if tensor.device.type == "cpu" and tensor.numel():
            self._every.passed(tensor.numel() * tensor.element_size())  # hands back those before it
            self._held.append(tensor)
        return tensor

    def release(self) -> None:
        if self._held:
            release_clean_mapped([t.data_ptr() for t in self._held])
        self._held = []


def meta_stand_in(value: Any) -> Any:
    """A meta tensor of a tensor's shape, strides and dtype (a Parameter for a Parameter): a name
    kept for a graph, its memory let go."""
    import torch

    empty = value.detach().to("meta")
    return torch.nn.Parameter(empty, value.requires_grad) if isinstance(value, torch.nn.Parameter) else empty


PARK_FROM = 1 << 20  # bytes: a smaller tensor is not worth a mapping of its own
_SPILL: contextvars.ContextVar[Spill | None] = contextvars.ContextVar("coreopt_spill", default=None)


class Spill:
    """Tensors parked in an unnamed file in `folder`: each one's bytes written there and read back
    as a mapping of the file, so a program assembled a weight at a time (a compressed `.pt2`, whose
    sub-byte codes take a byte each) holds its new tensors as clean file pages, which leave the
    resident set when paged out, instead of heap that stays until the program goes: at 1.1B that
    was 1.1 GiB of codes. The file has no name (where the system can make one so) and goes when
    the last mapping of it does. Parking is an economy, never a condition: a tensor that cannot be
    parked (no space left, no mapping possible, the process's share of open files spent: each
    mapping holds one) stays as it is, and so does every later one."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        import tempfile

        self._file = tempfile.TemporaryFile(dir=folder, prefix=".coreopt-spill-")  # noqa: SIM115 (closed by close)
        self._parked: set[int] = set()  # each parked tensor's address: paged out, and never parked twice
        self._every = EveryBytes(self.page_out)
        self._left = _mappings_allowed()

    def park(self, tensor: Any) -> Any:
        """`tensor` with its values in the file (the same dtype, shape, strides and values), or
        `tensor` itself where it is small, not a contiguous CPU tensor, or cannot be parked."""
        import torch

        nbytes = tensor.numel() * tensor.element_size()
        if nbytes < PARK_FROM or self._left <= 0 or tensor.device.type != "cpu":
            return tensor
        if tensor.data_ptr() in self._parked:  # parked already (a tuned weight's codes): not twice
            self._every.passed(nbytes)
            return tensor
        if tensor.layout != torch.strided or not tensor.is_contiguous():
            return tensor
        try:
            parked = self._written(tensor, nbytes)
        except (OSError, ValueError):  # no space, no mapping: held as it is from now on
            self._left = 0
            return tensor
        self._left -= 1
        self._parked.add(parked.data_ptr())
        self._every.passed(nbytes)
        return parked

    def _written(self, tensor: Any, nbytes: int) -> Any:
        import numpy as np
        import torch

        offset = self._file.seek(0, os.SEEK_END)
        self._file.write(memoryview(tensor.detach().reshape(-1).view(torch.uint8).numpy()))
        self._file.write(bytes(-nbytes % mmap.PAGESIZE))  # the next one starts on a page of its own
        self._file.flush()
        mapped = np.memmap(self._file, dtype=np.uint8, mode="c", offset=offset, shape=(nbytes,))
        return torch.from_numpy(mapped).view(tensor.dtype).reshape(tensor.shape)

    def page_out(self) -> None:
        page_out_mapped(list(self._parked))

    def close(self) -> None:
        """Close the file: its parked tensors stay readable through their mappings."""
        try:
            self.page_out()
        finally:
            self._file.close()


def _mappings_allowed() -> int:
    """How many tensors a spill may map: a quarter of the open files this process may hold
    (each mapping keeps a duplicate of the file's descriptor, as each record of a `.pt2` read here
    does), 256 where the limit cannot be read."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 256
    return 1 << 16 if soft == resource.RLIM_INFINITY else soft // 4


@contextlib.contextmanager
def spilling(folder: str | os.PathLike[str]) -> Iterator[None]:
    """Within: `parked` puts tensors in a `Spill` in `folder` (this thread's context only); where
    no file can be made there, nothing is parked."""
    try:
        spill = Spill(folder)
    except OSError:
        yield
        return
    token = _SPILL.set(spill)
    try:
        yield
    finally:
        try:
            _SPILL.reset(token)
        finally:
            spill.close()


def parked(tensor: Any) -> Any:
    """`tensor` parked in the spill of the `spilling` block around, or as it is outside one."""
    spill = _SPILL.get()
    return tensor if spill is None else spill.park(tensor)


class PagingWriter(io.RawIOBase):
    """A binary file that pages out the file mappings holding `addresses` every `RELEASE_EVERY`
    bytes written through it: a save that reads a program's mapped tensors (its source's weights,
    its parked ones) in turn then holds about that many of their pages, not all of them."""

    def __init__(self, stream: BinaryIO, addresses: list[int]) -> None:
        super().__init__()
        self._stream = stream
        self._every = EveryBytes(lambda: page_out_mapped(addresses))

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._stream.seekable()

    def write(self, data: Any) -> int:
        written = self._stream.write(data)
        self._every.passed(written)
        return written

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._stream.seek(offset, whence)

    def tell(self) -> int:
        return self._stream.tell()

    def flush(self) -> None:
        if not self._stream.closed:  # the writer outlived the file (a traceback held it)
            self._stream.flush()
