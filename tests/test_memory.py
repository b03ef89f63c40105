"""Memory handed back between weights: read pages of a mapped file leave the resident set."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest

from coreai_opt._memory import EveryBytes, page_out_mapped, release_file_pages, trim_heap

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise through libc: Linux")
SIZE = 32 << 20


def _resident_file_bytes() -> int:
    with open("/proc/self/status", encoding="utf-8") as status:
        line = next(line for line in status if line.startswith("RssFile:"))
    return int(line.split()[1]) * 1024


def test_read_pages_of_a_mapped_file_are_released_and_read_again(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    pattern = bytes(range(256)) * (SIZE // 256)
    path.write_bytes(pattern)
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        before = _resident_file_bytes()
        assert sum(mapped[i] for i in range(7, SIZE, 4096)) == 7 * (SIZE // 4096)  # a byte of every page
        touched = _resident_file_bytes()
        assert touched - before > SIZE // 2  # every page was read in
        assert release_file_pages("weights.bin") == 1
        assert touched - _resident_file_bytes() > SIZE // 2  # and handed back
        assert mapped[:SIZE] == pattern  # the data is read again from the file
    assert release_file_pages("no-such-file.bin") == 0
    trim_heap()  # harmless at any time


def test_a_weights_file_mapping_is_paged_out_and_a_written_page_kept(tmp_path: Path) -> None:
    """A private writable mapping (as torch maps a `.pt2`'s records) holding a tensor's address:
    its clean pages leave the resident set and are read again from the file; a page written to
    keeps what was written (MADV_PAGEOUT never discards data); other addresses page nothing out."""
    import torch

    path = tmp_path / "weights.bin"
    pattern = bytes(range(256)) * (SIZE // 256)
    path.write_bytes(pattern)
    with open(path, "r+b") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
        tensor = torch.frombuffer(mapped, dtype=torch.uint8)
        before = _resident_file_bytes()
        assert int(tensor[7::4096].sum()) == 7 * (SIZE // 4096)  # a byte of every page
        touched = _resident_file_bytes()
        assert touched - before > SIZE // 2
        tensor[5] = 99  # one page written: private to this process now
        assert page_out_mapped([torch.zeros(1).data_ptr()]) == 0  # not a file's
        assert page_out_mapped([tensor.data_ptr() + 4096]) == 1
        assert touched - _resident_file_bytes() > SIZE // 2
        assert int(tensor[5]) == 99 and bytes(tensor[4096:8192].numpy()) == pattern[4096:8192]
        del tensor


def test_hand_backs_run_once_per_so_many_bytes() -> None:
    runs: list[int] = []
    every = EveryBytes(lambda: runs.append(1), every=100)
    for nbytes in (40, 40, 40, 99, 1, 250):
        every.passed(nbytes)
    assert len(runs) == 3  # after 120, after 100 more, and after the 250


def test_a_programs_host_tensors_copied_to_a_device_leave_the_resident_set(tmp_path: Path) -> None:
    """`runnable` copies a program read from a file to its device tensor by tensor (`_Copier`):
    each host tensor's pages, read for the copy, are paged out, yet the program still reads the
    same values from its file (a meta device stands in for a GPU: a copy, no data)."""
    import torch

    from coreai_opt._export._runnable import _Copier
    from coreai_opt.io import load_pt2, save_pt2

    class Held(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("codes", torch.arange(SIZE, dtype=torch.int32).to(torch.uint8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.codes[:4]

    program = torch.export.export(Held(), (torch.zeros(4, dtype=torch.uint8),)).run_decompositions({})
    save_pt2(program, tmp_path / "held.pt2")
    codes = load_pt2(tmp_path / "held.pt2").state_dict["codes"]
    before = _resident_file_bytes()
    assert int(codes[7::4096].sum()) == 7 * (SIZE // 4096)  # a byte of every page
    touched = _resident_file_bytes()
    assert touched - before > SIZE // 2
    copy = _Copier(torch.device("meta"))
    assert copy(codes).device.type == "meta"
    copy.page_out()
    assert touched - _resident_file_bytes() > SIZE // 2
    assert torch.equal(codes[:256], torch.arange(256, dtype=torch.uint8))  # read again from the file


def test_release_garbage_frees_a_cycle_where_the_program_is_large_enough() -> None:
    """A program let go sits in a reference cycle (a GraphModule and its graph): `release_garbage`
    frees it at a phase boundary, and leaves a small one to the collector's own time (a walk over
    every object costs more than it would give back)."""
    import gc
    import weakref

    from coreai_opt._memory import RELEASE_EVERY, release_garbage

    class Node:
        pass

    def cycle() -> weakref.ref:
        a, b = Node(), Node()
        a.other, b.other, a.weight = b, a, bytearray(16)
        return weakref.ref(a)

    gc.disable()
    try:
        small = cycle()
        release_garbage(RELEASE_EVERY - 1)
        assert small() is not None
        release_garbage(RELEASE_EVERY)
        assert small() is None
    finally:
        gc.enable()
