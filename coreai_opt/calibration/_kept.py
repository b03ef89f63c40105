"""Squared gradients kept between the steps of one run - on disk - read back a weight at a time.

A Fisher pass hands each weight's squares over as it finishes them; a caller that reads them
again later, one weight at a time (`optimize`'s estimate, then its trials, each choice made by
`sensitive` k-means), need not hold them all: SmolLM2-135M's are 0.54 GB, a 1B model's 4.4 GB.
`KeptSquares.keeping(passing)` writes each weight's float32 values into a private temporary
folder as they go by; the mapping reads one back when asked. The folder is this process's own
(`tempfile`: created for it alone, removed when the last view of it goes), so nothing read back
comes from anyone else. It lies in the calibration cache's folder where that may be written - on
disk, beside the Fisher pass's own files - else in the system's temporary folder (`TMPDIR`),
which some systems keep in memory. Where the squares live on a GPU they are held as they came
(`on_disk=False`): the device's memory is not the host's.
"""

from __future__ import annotations

import tempfile
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from coreai_opt.weights import Statistics

from ._cache import _usable_folder, read_float32, write_float32


@dataclass(frozen=True)
class _Entry:
    """A weight's squares as written: its file in the folder, rows, shape and whole mean."""

    file: str
    rows: int
    shape: tuple[int, ...]
    mean: float


class KeptSquares(Mapping[str, Statistics]):
    """Statistics by name whose squared gradients are read from a private folder each time they
    are asked for (`Statistics.squares_mean` says their mean, so nobody sums them again); a
    weight without squares, and every weight unless `on_disk`, is held as it came."""

    def __init__(self, on_disk: bool = True) -> None:
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        if on_disk:
            try:
                root = _usable_folder(create=True)
            except OSError:
                root = None
            self._folder = tempfile.TemporaryDirectory(prefix=".coreopt-squares-", dir=root)
        self._written: dict[str, _Entry] = {}
        self._held: dict[str, Statistics] = {}
        self._names: list[str] = []

    def keeping(self, passing: Iterator[tuple[str, Statistics]]) -> Iterator[tuple[str, Statistics]]:
        """`passing` as it comes, each weight's squares written to the folder on the way."""
        for name, statistics in passing:
            self._keep(name, statistics)
            yield name, statistics

    def _keep(self, name: str, statistics: Statistics) -> None:
        squares = statistics.gradient_squares
        if name not in self._written and name not in self._held:
            self._names.append(name)
        # in memory; none, only a sample's rows, or not the Fisher pass's float32 (a file would not hold their bits)
        if (self._folder is None or squares is None or statistics.squares_mean is not None
                or str(squares.dtype) != "torch.float32"):  # fmt: skip
            self._held[name] = statistics
            return
        file = f"{len(self._names):05d}.f32"
        try:
            write_float32(squares, self._path(file))
        except OSError:  # a full disk: held in memory, as they were before (only costs memory)
            self._path(file).unlink(missing_ok=True)
            self._held[name] = statistics
            return
        shape = tuple(int(n) for n in squares.shape)
        self._written[name] = _Entry(file, statistics.rows, shape, statistics.gradient_mean())

    def _path(self, file: str) -> Path:
        assert self._folder is not None  # only what was written is read
        return Path(self._folder.name) / file

    def __getitem__(self, name: str) -> Statistics:
        if name in self._held:
            return self._held[name]
        entry = self._written[name]  # KeyError: not kept
        squares = read_float32(self._path(entry.file), entry.shape)
        return Statistics(entry.rows, gradient_squares=squares, squares_mean=entry.mean)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._written or name in self._held

    def narrowed(self, names: Collection[str]) -> KeptSquares:
        """The same folder (kept while either view lives) or memory, of `names` only."""
        wanted = set(names)
        view = KeptSquares.__new__(KeptSquares)
        view._folder = self._folder
        view._names = [name for name in self._names if name in wanted]
        view._written = {name: entry for name, entry in self._written.items() if name in wanted}
        view._held = {name: held for name, held in self._held.items() if name in wanted}
        return view
