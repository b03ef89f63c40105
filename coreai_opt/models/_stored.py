"""What a source stores: each weight's name and shape, read from the safetensors headers (and the
shard index) or from a GGUF file's tensor list - never the weights themselves - so a config can be
checked against them before transformers builds a model of its sizes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coreai_opt.io import ModelFileError, read_in_folder

from ._json import parse_json, read_json

SAFETENSORS = "model.safetensors"  # the names transformers loads, in its order
SAFETENSORS_INDEX = "model.safetensors.index.json"
_HEADER_LIMIT = 100_000_000  # bytes of one safetensors header (the safetensors library's own bound)
_HEADERS_LIMIT = 256 << 20  # bytes of all shards' headers together
_INDEX_LIMIT = 64 << 20
_MAX_RANK = 8


@dataclass(frozen=True)
class Stored:
    """The weights a source holds: name -> shape (outermost axis first), and the file named in errors."""

    path: Path
    shapes: dict[str, tuple[int, ...]]
    gguf: bool

    def find(self, name: str) -> tuple[str, tuple[int, ...]] | None:
        """The weight `name` names: in GGUF exactly; in safetensors after any prefix (`model.`,
        `bert.`), the one with the shortest prefix."""
        if self.gguf:
            return (name, self.shapes[name]) if name in self.shapes else None
        found = [n for n in self.shapes if n == name or n.endswith("." + name)]
        return (min(found, key=len), self.shapes[min(found, key=len)]) if found else None


def safetensors_stored(folder: Path) -> Stored | None:
    """The weights of a Hugging Face folder as transformers finds them (model.safetensors, else the
    shards an index names); None when it has neither."""
    single = folder / SAFETENSORS
    if os.path.lexists(single):
        return Stored(single, _header(single, folder, _HEADER_LIMIT)[0], False)
    index = folder / SAFETENSORS_INDEX
    if not os.path.lexists(index):
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    budget = _HEADERS_LIMIT
    for shard in _shards(index, folder):
        found, used = _header(folder / shard, folder, min(budget, _HEADER_LIMIT))
        shapes |= found
        budget -= used
    return Stored(index, shapes, False)


def _shards(index: Path, folder: Path) -> list[str]:
    """The shard files an index names: plain names of files in its folder."""
    data = read_json(index, folder, limit=_INDEX_LIMIT)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if (
        not isinstance(weight_map, dict)
        or not weight_map
        or not all(isinstance(v, str) for v in weight_map.values())
    ):
        raise ModelFileError(index, "has no weight_map naming the shards")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if Path(shard).name != shard or shard in (".", ".."):
            raise ModelFileError(index, f"names a shard outside its folder ({shard[:80]!r})")
    return shards


def _header(path: Path, folder: Path, limit: int) -> tuple[dict[str, tuple[int, ...]], int]:
    """A safetensors file's weight shapes from its header alone, and the header's size."""
    head = read_in_folder(path, folder, limit=8, whole=False)
    size = int.from_bytes(head, "little") if len(head) == 8 else -1
    if not 2 <= size <= limit:
        problem = (
            "is shorter than a safetensors header"
            if size < 0
            else f"declares a {size}-byte header (at most {limit})"
        )
        raise ModelFileError(path, f"not a readable safetensors file ({problem})")
    data = read_in_folder(path, folder, limit=8 + size, whole=False)[8:]
    if len(data) < size:
        raise ModelFileError(path, f"not a readable safetensors file (its {size}-byte header is cut off)")
    header = parse_json(data, path)
    if not isinstance(header, dict):
        raise ModelFileError(path, "not a readable safetensors file (its header is not a JSON object)")
    return {name: _shape(path, name, entry) for name, entry in header.items() if name != "__metadata__"}, size


def _shape(path: Path, name: str, entry: Any) -> tuple[int, ...]:
    shape = entry.get("shape") if isinstance(entry, dict) else None
    if not (
        isinstance(shape, list)
        and len(shape) <= _MAX_RANK
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise ModelFileError(path, f"weight {name[:80]!r} has no valid shape in the header")
    return tuple(shape)


def gguf_stored(path: Path, reader: Any) -> Stored:
    """A GGUF file's tensors (its dimensions are stored innermost first); none is refused."""
    if not reader.tensors:
        raise ModelFileError(path, "holds no tensors")
    return Stored(
        path, {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in reader.tensors}, True
    )
