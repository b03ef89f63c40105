"""Memory handed back between weights: read pages of a mapped file leave the resident set."""

from __future__ import annotations

import contextlib
import mmap
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from coreai_opt._memory import EveryBytes, page_out_mapped, release_file_pages, trim_heap

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise through libc: Linux")
SIZE = 32 << 20


PATTERN = bytes(range(256)) * (SIZE // 256)


@contextlib.contextmanager
def _mapped_files(folder: Path, *names: str) -> Iterator[list[mmap.mmap]]:
    """Files of `PATTERN` under `folder`, each mapped private and writable (as torch maps a
    `.pt2`'s records)."""
    with contextlib.ExitStack() as stack:
        maps = []
        for name in names:
            (folder / name).write_bytes(PATTERN)
            file = stack.enter_context(open(folder / name, "r+b"))
            maps.append(stack.enter_context(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)))
        yield maps


def _resident_file_bytes() -> int:
    with open("/proc/self/status", encoding="utf-8") as status:
        line = next(line for line in status if line.startswith("RssFile:"))
    return int(line.split()[1]) * 1024


def test_read_pages_of_a_mapped_file_are_released_and_read_again(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(PATTERN)
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        before = _resident_file_bytes()
        assert sum(mapped[i] for i in range(7, SIZE, 4096)) == 7 * (SIZE // 4096)  # a byte of every page
        touched = _resident_file_bytes()
        assert touched - before > SIZE // 2  # every page was read in
        assert release_file_pages("weights.bin") == 1
        assert touched - _resident_file_bytes() > SIZE // 2  # and handed back
        assert mapped[:SIZE] == PATTERN  # the data is read again from the file
    assert release_file_pages("no-such-file.bin") == 0
    trim_heap()  # harmless at any time


def test_a_weights_file_mapping_is_paged_out_and_a_written_page_kept(tmp_path: Path) -> None:
    """A private writable mapping (as torch maps a `.pt2`'s records) holding a tensor's address:
    its clean pages leave the resident set and are read again from the file; a page written to
    keeps what was written (MADV_PAGEOUT never discards data); other addresses page nothing out."""
    import torch

    path = tmp_path / "weights.bin"
    path.write_bytes(PATTERN)
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
        assert int(tensor[5]) == 99 and bytes(tensor[4096:8192].numpy()) == PATTERN[4096:8192]
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


def test_parked_tensors_keep_their_values_and_leave_the_resident_set(tmp_path: Path) -> None:
    """A tensor parked in a spill has the same dtype, shape and values, lies in a file mapping
    whose pages leave the resident set when paged out (read again after), and the file has no
    name in its folder; small or non-CPU tensors, and any outside a `spilling` block, stay as given."""
    import torch

    from coreai_opt._memory import PARK_FROM, Spill, parked, spilling

    generator = torch.Generator().manual_seed(0)
    given = {
        "codes": torch.randint(0, 16, (SIZE // 1024, 1024), dtype=torch.uint8, generator=generator),
        "scales": torch.randn(1024, 513, generator=generator).to(torch.bfloat16),
        "mask": torch.rand(2048, 1024, generator=generator) > 0.5,
        "signed": torch.randint(-8, 8, (4096, 300), dtype=torch.int8, generator=generator),
    }
    spill = Spill(tmp_path)
    before = _resident_file_bytes()
    held = {name: spill.park(t) for name, t in given.items()}
    for name, t in given.items():
        assert held[name].dtype == t.dtype and held[name].shape == t.shape and torch.equal(held[name], t)
        assert held[name].data_ptr() != t.data_ptr()
    touched = _resident_file_bytes()
    assert touched - before > SIZE // 2  # read just now, by the comparisons
    spill.page_out()
    assert touched - _resident_file_bytes() > SIZE // 2
    spill.close()
    assert not list(tmp_path.iterdir())  # an unnamed file
    assert all(torch.equal(held[name], t) for name, t in given.items())  # read again from it
    small = torch.ones(PARK_FROM // 4 - 1)
    assert spill.park(small) is small
    strided = given["codes"].t()  # kept as given: a parked copy would have other strides
    assert spill.park(strided) is strided
    assert parked(given["codes"]) is given["codes"]  # no spill around
    with spilling(tmp_path):
        inside = parked(given["codes"])
        assert parked(inside) is inside  # a parked tensor is not written to the file again
    assert inside is not given["codes"] and torch.equal(inside, given["codes"])


def test_a_save_pages_out_the_mapped_tensors_it_has_written(tmp_path: Path) -> None:
    """`save_pt2` writes through a `PagingWriter`: a program whose weights are mapped from its
    file is saved to the same bytes as through a plain file, and their pages leave the resident
    set as the save goes past them."""
    import torch

    from coreai_opt._memory import PagingWriter
    from coreai_opt.io import load_pt2, save_pt2

    class Held(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for i in range(4):
                self.register_buffer(f"codes{i}", torch.full((SIZE,), i, dtype=torch.uint8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.codes0[:4] + self.codes3[:4]

    program = torch.export.export(Held(), (torch.zeros(4, dtype=torch.uint8),)).run_decompositions({})
    save_pt2(program, tmp_path / "held.pt2")
    loaded = load_pt2(tmp_path / "held.pt2")
    before = _resident_file_bytes()
    save_pt2(loaded, tmp_path / "again.pt2")
    assert _resident_file_bytes() - before < 3 * SIZE  # 4 x 32 MiB read: all but the last 64 MiB paged out
    assert torch.equal(
        load_pt2(tmp_path / "again.pt2").state_dict["codes2"], torch.full((SIZE,), 2, dtype=torch.uint8)
    )
    with open(tmp_path / "plain.pt2", "wb") as plain, open(tmp_path / "paged.pt2", "wb") as paged:
        torch.export.save(loaded, plain)
        torch.export.save(loaded, PagingWriter(paged, []))
    assert (tmp_path / "plain.pt2").read_bytes() == (tmp_path / "paged.pt2").read_bytes()


def test_a_compressed_program_parked_as_it_is_made_saves_to_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`apply_recipe` parks the compressed program's new tensors in a spill beside the output
    (`_memory.spilling`): with every tensor parked, the file written is byte for byte the one
    written with none parked, and no spill file is left in the folder."""
    from conftest import SAMPLES

    from coreai_opt import _memory
    from coreai_opt.compression import PalettizeConfig
    from coreai_opt.recipes import palettize_file

    parks: list[bool] = []
    park = _memory.Spill.park

    def counted(self: _memory.Spill, tensor: object) -> object:
        held = park(self, tensor)
        parks.append(held is not tensor)
        return held

    monkeypatch.setattr(_memory.Spill, "park", counted)
    config = PalettizeConfig(n_bits=4, granularity="grouped", group_size=16)
    monkeypatch.setattr(_memory, "PARK_FROM", 1)
    palettize_file(SAMPLES / "transformer.pt2", tmp_path / "parked.pt2", config)
    assert sum(parks) >= 4  # indices and tables of two weights at least
    monkeypatch.setattr(_memory, "PARK_FROM", 1 << 62)
    palettize_file(SAMPLES / "transformer.pt2", tmp_path / "held.pt2", config)
    assert (tmp_path / "parked.pt2").read_bytes() == (tmp_path / "held.pt2").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["held.pt2", "parked.pt2"]


def test_a_spill_that_cannot_park_keeps_tensors_as_they_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parking is an economy, never a condition: no folder to make the file in, a write that
    fails, or the spill's share of open files spent (each mapping holds a descriptor) leave the
    tensors as given, and the run goes on."""
    import os

    import torch

    from coreai_opt import _memory

    codes = torch.arange(1 << 21, dtype=torch.int32).to(torch.uint8)
    with _memory.spilling(tmp_path / "missing"):
        assert _memory.parked(codes) is codes  # no file could be made there
    monkeypatch.setattr(_memory, "_mappings_allowed", lambda: 3)
    spill = _memory.Spill(tmp_path)
    descriptors = len(os.listdir("/proc/self/fd"))
    held = [spill.park(codes) for _ in range(5)]
    assert [h is codes for h in held] == [False, False, False, True, True]
    assert len(os.listdir("/proc/self/fd")) - descriptors == 3  # one a mapping, no more
    spill.close()
    failing = _memory.Spill(tmp_path)

    def full(*_: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(failing._file, "write", full)
    assert failing.park(codes) is codes and failing.park(codes) is codes
    assert all(torch.equal(h, codes) for h in held)


def test_clean_mappings_leave_the_resident_set_and_written_ones_stay(tmp_path: Path) -> None:
    """`release_clean_mapped` drops a file mapping with no written page (read again from the file,
    the same bytes) and leaves alone one with a written page, whose write MADV_DONTNEED would
    lose; addresses in no file mapping release nothing."""
    import torch

    from coreai_opt._memory import release_clean_mapped

    with _mapped_files(tmp_path, "clean.bin", "written.bin") as (clean_map, written_map):
        clean = torch.frombuffer(clean_map, dtype=torch.uint8)
        written = torch.frombuffer(written_map, dtype=torch.uint8)
        before = _resident_file_bytes()
        assert int(clean[7::4096].sum()) == int(written[7::4096].sum()) == 7 * (SIZE // 4096)
        written[5] = 99  # one page of it is this process's now
        touched = _resident_file_bytes()
        assert touched - before > SIZE
        assert release_clean_mapped([torch.zeros(1).data_ptr()]) == 0
        assert release_clean_mapped([clean.data_ptr() + 4096, written.data_ptr()]) == 1
        left = touched - _resident_file_bytes()
        assert SIZE // 2 < left < SIZE + SIZE // 2  # the clean one went, the written one stayed
        assert int(written[5]) == 99 and bytes(clean[:8192].numpy()) == PATTERN[:8192]
        del clean, written


def test_weights_read_once_leave_the_resident_set_every_so_many_bytes(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`ReadOnce` is given each weight before it is read: once `RELEASE_EVERY` bytes have passed,
    the clean file pages of the weights before the one passed last leave the resident set; that
    one's go at the next hand-back (`release`). They read again the same."""
    import torch

    from coreai_opt import _memory

    monkeypatch.setattr(_memory, "RELEASE_EVERY", SIZE)
    with _mapped_files(tmp_path, "first.bin", "second.bin") as (first_map, second_map):
        read = _memory.ReadOnce()
        before = _resident_file_bytes()
        first = read.passed(torch.frombuffer(first_map, dtype=torch.uint8))
        assert int(first[7::4096].sum()) == 7 * (SIZE // 4096)  # read after it was passed
        second = read.passed(torch.frombuffer(second_map, dtype=torch.uint8))  # the threshold: the first goes
        assert _resident_file_bytes() - before < SIZE // 2
        assert int(second[7::4096].sum()) == 7 * (SIZE // 4096)
        assert _resident_file_bytes() - before > SIZE // 2  # the second stays until the next hand-back
        read.release()
        assert _resident_file_bytes() - before < SIZE // 2
        assert bytes(first[:8192].numpy()) == bytes(second[:8192].numpy()) == PATTERN[:8192]  # read again
        del first, second, read


def test_a_mappings_pages_count_as_written_when_copied_or_swapped() -> None:
    """The pagemap flags `release_clean_mapped` reads: a page in memory that is the file's, or not
    in memory, is clean; one in memory that is not the file's (a private copy) or swapped is written."""
    import numpy as np

    from coreai_opt._memory import _any_written

    present, swapped, file_page = 1 << 63, 1 << 62, 1 << 61
    assert not _any_written(np.array([present | file_page, 0, present | file_page], dtype=np.uint64))
    assert not _any_written(np.array([], dtype=np.uint64))
    assert _any_written(np.array([present | file_page, present], dtype=np.uint64))
    assert _any_written(np.array([0, swapped], dtype=np.uint64))


def test_a_written_page_deep_in_a_mapping_is_found_reading_its_flags_in_pieces(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """The flags are read a bounded piece at a time: a page written in a later piece keeps its
    mapping, and a clean mapping read in pieces is handed back."""
    import torch

    from coreai_opt import _memory

    monkeypatch.setattr(_memory, "_FLAGS_READ", 8)
    with _mapped_files(tmp_path, "clean.bin", "written.bin") as (clean_map, written_map):
        clean = torch.frombuffer(clean_map, dtype=torch.uint8)
        written = torch.frombuffer(written_map, dtype=torch.uint8)
        assert int(clean[7::4096].sum()) == int(written[7::4096].sum()) == 7 * (SIZE // 4096)
        written[37 * 4096 + 5] = 99  # in the fifth piece of eight pages
        assert _memory.release_clean_mapped([written.data_ptr()]) == 0
        assert _memory.release_clean_mapped([clean.data_ptr()]) == 1
        assert int(written[37 * 4096 + 5]) == 99 and bytes(clean[:8192].numpy()) == PATTERN[:8192]
        del clean, written


def _two_linears(folder: Path) -> Path:
    """A `.pt2` of two float32 linear layers of `SIZE` bytes each, as a model file maps them."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2048, 4096, bias=False), nn.Tanh(), nn.Linear(4096, 2048, bias=False))
    path = folder / "two.pt2"
    torch.export.save(torch.export.export(model.eval(), (torch.randn(4, 2048),)).run_decompositions(), path)
    return path


def _untouched(program) -> list:  # type: ignore[no-untyped-def]
    """The program's weights, their file pages out of the resident set (loading read them)."""
    from coreai_opt._memory import release_clean_mapped

    weights = [t for t in program.state_dict.values() if t.dim() == 2]
    assert release_clean_mapped([t.data_ptr() for t in weights]) >= 1  # they are mapped from the file
    return weights


def test_a_fisher_pass_holds_no_file_pages_of_the_weights_it_holds_in_bfloat16(tmp_path: Path) -> None:
    """Weights read only as a product's matrix are held in bfloat16 for a fast Fisher pass: their
    float32 file pages leave the resident set once the copies are made (SmolLM2-135M's 0.5 GB),
    and the squares are those of the same pass over the weights held in memory, bit for bit."""
    import torch

    from coreai_opt.calibration import Samples, Source, calibrate
    from coreai_opt.calibration._fisher import SegmentedBackward
    from coreai_opt.calibration._losses import sample_loss
    from coreai_opt.io import load_pt2

    def squares(held_in_memory: bool) -> tuple[dict[str, torch.Tensor], list[int]]:
        program = load_pt2(_two_linears(tmp_path))
        calibration = calibrate(program, Samples(Source.RANDOM, count=2, seed=0), cache=False)
        names = [name for name, t in program.state_dict.items() if t.dim() == 2]
        if held_in_memory:
            for name in names:
                module, _, attr = name.rpartition(".")
                setattr(calibration.gm.get_submodule(module), attr, torch.nn.Parameter(program.state_dict[name].clone(), requires_grad=False))  # fmt: skip
        _untouched(program)
        before, seen = _resident_file_bytes(), []
        generator = torch.Generator().manual_seed(0)

        def loss(output, inputs):  # type: ignore[no-untyped-def]
            seen.append(_resident_file_bytes() - before)
            return sample_loss(output, inputs, generator)

        passing = SegmentedBackward(calibration.gm, names, fast=True)
        assert passing.narrowed == set(names)
        found = {name: s.gradient_squares for name, s in passing.run(calibration.inputs, loss)}
        return found, seen

    mapped, seen = squares(held_in_memory=False)
    assert len(seen) == 2 and max(seen) < SIZE // 2  # 2 x 32 MiB read into bfloat16, none held as file pages
    held, _ = squares(held_in_memory=True)
    assert mapped.keys() == held.keys() and all(torch.equal(mapped[n], held[n]) for n in mapped)


def test_an_estimates_encodings_hand_back_the_weights_file_pages_as_they_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sampled_trial_encodings` (the cost table's columns, the trials, `sensitivity`) reads each
    weight once a pass: its file pages leave the resident set every `RELEASE_EVERY` bytes, and all
    of them once the pass ends, not the whole program's held to the end of every pass; the
    encodings are those of the weights as they are."""
    import torch

    from coreai_opt import _memory
    from coreai_opt.compression import sampled_trial_encodings
    from coreai_opt.io import load_pt2
    from coreai_opt.optimization import parse_choices
    from coreai_opt.weights import decode

    monkeypatch.setattr(_memory, "RELEASE_EVERY", SIZE)
    program = load_pt2(_two_linears(tmp_path))
    weights = _untouched(program)
    config = parse_choices("int8")[0].config_for(False, 0)
    before, seen, decoded = _resident_file_bytes(), [], []
    for _, encoding, sample in sampled_trial_encodings(program, config):
        seen.append(_resident_file_bytes() - before)
        decoded.append(decode(encoding))
        assert sample is None
    assert len(seen) == 2 and seen[0] > SIZE // 2 and seen[1] < SIZE * 3 // 2  # the first weight's went
    assert _resident_file_bytes() - before < SIZE // 2  # and the last one's at the end
    for weight, values in zip(weights, decoded, strict=True):
        scale = weight.abs().amax(dim=1, keepdim=True) / 127
        assert torch.allclose(values, weight, atol=float(scale.max()) * 0.51)
