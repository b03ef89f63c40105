"""The disk cache of calibration statistics, in the folder `COREOPT_CACHE` names (else
~/.cache/coreopt/calibration), used only where it keeps the rule of every cache folder
(`coreai_opt._cache`: statistics another user planted would shape the compressed model).

An entry's key (`statistics_key`) names everything the statistics depend on: what they are (a
version raised when that changes), the program as it is now (`program_fingerprint`: its code and
every state tensor's bytes, so a replaced weight makes a new key), the samples, the seed and the
weights asked for. Moments and Gram matrices are one safetensors file and a JSON of rows and of
the weights that share another's statistics (stored once, shared again when loaded:
`load_statistics`, `store_statistics`); a Fisher pass's squared gradients are a folder of raw
float32 files that stream in and out as the pass hands them over (`FisherStore`). A cache that is
damaged, refused or cannot be written only costs time: the statistics are taken afresh.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coreai_opt._cache import cache_folder_for, plain_name, tensor_bytes, user_cache
from coreai_opt.io import read_json_object
from coreai_opt.weights import Needs, Statistics

if TYPE_CHECKING:
    import torch
    from torch.fx import GraphModule


CACHE_ENV = "COREOPT_CACHE"
_WITHOUT = "statistics are taken afresh and not stored"  # what a refused cache folder costs
_SQUARES_FILE = re.compile(r"\d{5,}\.f32")  # a Fisher pass's file a weight: what `_squares_file` makes
_FIELDS = ("moments", "gram", "gradient_squares")  # a Statistics' tensors, in its order
_JSON_LIMIT = 64 << 20  # a cache's JSON entry (rows, a Fisher index): a few hundred bytes a weight
# Raised when what statistics a name gets changes (3: an embedding's twin head, `_readers.twins_of`;
# 4: weights that share statistics store them once, the JSON names which; 5: a linear layer that
# reads a lookup's or a convolution's output no longer shares that reader's statistics; 6: a
# language model's squared gradients are of tokens drawn from its own predictions, `_losses`).
_STATISTICS_VERSION = "6"


def cache_folder() -> Path:
    """Where calibration statistics are kept between runs (`COREOPT_CACHE`, else ~/.cache/coreopt)."""
    base = os.environ.get(CACHE_ENV)
    return Path(base) if base else user_cache("calibration")


def _usable_folder(*, create: bool) -> Path | None:
    """The cache folder when it keeps the rule of every cache folder (`coreai_opt._cache`), else
    None: statistics another user planted would shape the compressed model."""
    return cache_folder_for(cache_folder(), create=create, without=_WITHOUT)


def program_fingerprint(gm: GraphModule) -> str:
    """What identifies the program as it is now: its code and every state tensor's bytes."""
    digest = hashlib.sha256(gm.code.encode())
    for name, tensor in sorted({**dict(gm.named_parameters()), **dict(gm.named_buffers())}.items()):
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(tensor_bytes(tensor))
    return digest.hexdigest()


def statistics_key(
    fingerprint: str, samples: str, needs: Needs, seed: int, names: Sequence[str], *, fast: bool
) -> str:
    """The cache key of `names`' statistics of the program `fingerprint` names on the samples of
    digest `samples` (`fast`: the Fisher pass takes its products in bfloat16)."""
    parts = [_STATISTICS_VERSION, fingerprint, samples, needs.value, str(seed), *sorted(names)]
    if needs is Needs.GRADIENT_SQUARES and fast:
        parts.append("bfloat16 products")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def load_statistics(key: str, names: Sequence[str], device: torch.device) -> dict[str, Statistics] | None:
    """The stored statistics of `names` under `key`, on `device`; None unless stored whole (a
    damaged cache entry is recomputed)."""
    from safetensors import SafetensorError

    folder = _usable_folder(create=False)
    if folder is None or not (folder / f"{key}.safetensors").is_file():
        return None
    try:
        index = read_json_object(folder / f"{key}.json", limit=_JSON_LIMIT)
        if index is None:
            return None
        rows, same = index["rows"], index["same"]
        here = read_safetensors(folder / f"{key}.safetensors", device)
        stored = {}
        for name in (n for n in names if n not in same):
            fields = [here.get(f"{name}/{field}") for field in _FIELDS]
            if not _count(rows[name]) or all(f is None for f in fields):
                return None  # a weight's rows not a count, or none of its tensors stored: a miss
            stored[name] = Statistics(rows[name], *fields)
        return {name: stored[same.get(name, name)] for name in names}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, SafetensorError):
        return None  # a damaged cache entry is recomputed


def store_statistics(key: str, found: dict[str, Statistics]) -> None:
    """Keep `found` under `key` (a cache that cannot be written only costs time)."""
    from coreai_opt.io import ModelFileError, write_atomically

    tensors, first, same = {}, {}, {}
    for name, statistics in found.items():
        if id(statistics) in first:
            same[name] = first[id(statistics)]
            continue
        first[id(statistics)] = name
        for field in _FIELDS:
            value = getattr(statistics, field)
            if value is not None:
                tensors[f"{name}/{field}"] = value
    try:
        folder = _usable_folder(create=True)
        if folder is None:
            return
        write_atomically(folder / f"{key}.safetensors", lambda tmp: write_safetensors(tmp, tensors))
        text = json.dumps({"rows": {name: s.rows for name, s in found.items()}, "same": same})
        write_atomically(folder / f"{key}.json", lambda tmp: tmp.write_text(text))
    except (OSError, ModelFileError, KeyError):  # KeyError: a dtype safetensors has no name for
        pass  # a cache that cannot be written only costs time


_SAFETENSORS_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """`tensors` (on any device) as a safetensors file, one tensor copied to the host at a time
    (safetensors' own `save_file` takes them all there first: ~8 GB of a 1B model's Gram matrices).
    The header, from shapes and dtypes alone, is padded to 8 bytes as safetensors writes it."""
    import struct

    header, offset = {}, 0
    for name, value in tensors.items():
        size = value.numel() * value.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[str(value.dtype).removeprefix("torch.")],
                        "shape": list(value.shape), "data_offsets": [offset, offset + size]}  # fmt: skip
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text)
        for value in tensors.values():
            handle.write(tensor_bytes(value))


_TORCH_DTYPES = {code: name for name, code in _SAFETENSORS_DTYPES.items()}


def read_safetensors(path: Path, device: torch.device) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors on `device`, each read by itself with plain reads: one on the
    host at a time, and the file never mapped whole (a mapping's pages count as resident memory:
    8.6 GB at a 1B model's Grams). safetensors' own reader checks the header first."""
    import numpy as np
    import torch
    from safetensors import safe_open

    with safe_open(str(path), "pt"):  # each tensor's bytes within the file and fitting its shape
        pass
    found = {}
    with open(path, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        if size > _JSON_LIMIT:
            raise ValueError(f"a {size}-byte header")
        header = json.loads(handle.read(size))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            start, end = entry["data_offsets"]
            handle.seek(8 + size + start)
            raw = np.fromfile(handle, dtype=np.uint8, count=end - start)
            if raw.size != end - start:
                raise OSError(f"{path} was cut short while being read")
            dtype = getattr(torch, _TORCH_DTYPES[entry["dtype"]])
            flat = torch.from_numpy(raw).view(dtype) if raw.size else torch.empty(0, dtype=dtype)
            if flat.numel() != math.prod(entry["shape"]):  # the file changed since safetensors read it
                raise ValueError(f"{name}: {flat.numel()} values for the shape {entry['shape']}")
            found[name] = flat.reshape(entry["shape"]).to(device)
    return found


class FisherStore:
    """One Fisher pass's squared gradients on disk, a file a weight, so they stream in and out as
    the pass hands them over: `<key>.fisher/` holds each weight's float32 values as raw bytes
    (written from the tensor's own memory and read into one array: a copy through a serialiser
    would be another 0.26 GB at a 1B model's head) and `index.json` (the weights in the pass's
    order with their shapes and rows), written into a temporary sibling renamed into place once
    the pass is done."""

    def __init__(self, key: str) -> None:
        self.name = f"{key}.fisher"

    def load(self, names: Sequence[str], device: torch.device) -> Iterator[tuple[str, Statistics]] | None:
        """The stored weights' statistics, read one at a time; None unless all of `names` are
        stored whole (a damaged entry is recomputed)."""
        root = _usable_folder(create=False)
        folder = cache_folder_for(root / self.name, create=False, without=_WITHOUT) if root else None
        if folder is None:
            return None
        index = read_json_object(folder / "index.json", limit=_JSON_LIMIT)
        entries = _fisher_entries(index) if index is not None else None
        try:
            if entries is None or sorted(entry[0] for entry in entries) != sorted(names):
                return None
            for _, file, _, shape in entries:
                found = os.lstat(folder / file)
                if not stat.S_ISREG(found.st_mode) or found.st_size != 4 * math.prod(shape):
                    return None
        except (OSError, ValueError):
            return None
        return self._read(folder, entries, device)

    def _read(
        self, folder: Path, entries: list[tuple[str, str, int, list[int]]], device: torch.device
    ) -> Iterator[tuple[str, Statistics]]:

        for name, file, rows, shape in entries:
            yield name, Statistics(rows, gradient_squares=read_float32(folder / file, shape).to(device))

    def saving(self, passing: Iterator[tuple[str, Statistics]]) -> Iterator[tuple[str, Statistics]]:
        """`passing`, each weight written as it goes by; stored once the pass is done (a cache
        that cannot be written only costs time)."""
        import shutil
        import tempfile

        try:
            root = _usable_folder(create=True)
            temporary = Path(tempfile.mkdtemp(prefix=f".{self.name}-", dir=root)) if root else None
        except OSError:
            root = temporary = None
        if root is None or temporary is None:  # not ours alone, or not writable: only costs time
            yield from passing
            return
        entries: list[list[Any]] | None = []
        try:
            for name, statistics in passing:
                squares = statistics.gradient_squares
                if entries is not None and squares is not None:
                    file = _squares_file(len(entries))
                    try:
                        write_float32(squares.float(), temporary / file)
                        entries.append([name, file, statistics.rows, list(squares.shape)])
                    except OSError:
                        entries = None
                yield name, statistics
            if entries is not None:
                try:
                    (temporary / "index.json").write_text(json.dumps({"weights": entries}))
                    temporary.rename(root / self.name)
                except OSError:
                    pass  # another run stored the same pass first, or the disk is full
        finally:
            shutil.rmtree(temporary, ignore_errors=True)


def write_float32(values: torch.Tensor, path: Path) -> None:
    """A float32 tensor's values as raw little-endian bytes, from its own memory (no serialiser's copy)."""
    values.detach().contiguous().cpu().numpy().astype("<f4", copy=False).tofile(path)


def read_float32(path: Path, shape: Sequence[int]) -> torch.Tensor:
    """`write_float32`'s values back, of `shape`, into one new array; OSError where the file is short."""
    import numpy as np
    import torch

    count = math.prod(shape)
    values = np.fromfile(path, dtype="<f4", count=count)
    if values.size != count:
        raise OSError(f"{path} was cut short while being read")
    return torch.from_numpy(values.reshape(tuple(shape)))


def _fisher_entries(index: dict[str, Any]) -> list[tuple[str, str, int, list[int]]] | None:
    """The Fisher index's entries, each [name, file, rows, shape] as `FisherStore` writes them;
    None (a miss) for anything else - a file named by a path, above all, is never read."""
    entries = index.get("weights")
    if not isinstance(entries, list):
        return None
    found = []
    for entry in entries:
        if not isinstance(entry, list) or len(entry) != 4:
            return None
        name, file, rows, shape = entry
        file = plain_name(file, _SQUARES_FILE)
        if not isinstance(name, str) or file is None or not _count(rows):
            return None
        if not isinstance(shape, list) or not all(_count(n) for n in shape):
            return None
        found.append((name, file, rows, shape))
    return found


def _count(value: object) -> bool:
    """A whole number of rows or elements (JSON's true is no count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _squares_file(number: int) -> str:
    """The name of a Fisher pass's `number`th weight's file, as `_SQUARES_FILE` reads it back (an
    index may name nothing else)."""
    name = f"{number:05d}.f32"
    if plain_name(name, _SQUARES_FILE) is None:
        raise ValueError(f"{name} is no name a Fisher index may hold")
    return name
