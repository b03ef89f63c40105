"""What a source stores: each weight's name and shape, read from the safetensors headers (and the
shard index) or from a GGUF file's tensor list - never the weights themselves - so a config can be
checked against them before transformers builds a model of its sizes."""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coreai_opt.io import ModelFileError, one_line, parse_json, read_in_folder, read_json, resolve_in_folder

SAFETENSORS = "model.safetensors"  # the names transformers loads, in its order
SAFETENSORS_INDEX = "model.safetensors.index.json"
_HEADER_LIMIT = 100_000_000  # bytes of one safetensors header (the safetensors library's own bound)
_HEADERS_LIMIT = 256 << 20  # bytes of all shards' headers together
_INDEX_LIMIT = 64 << 20
_MAX_RANK = 8
# safetensors' element types and the bits each takes (F4 and F6 pack: a tensor's bits fill whole bytes).
_DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "C64": 64, "F64": 64, "I64": 64, "U64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip


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
    tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
    shapes = {name: _shape(path, name, entry) for name, entry in tensors.items()}
    _check_offsets(path, tensors, shapes, os.path.getsize(resolve_in_folder(path, folder)) - 8 - size)
    return shapes, size


def _shape(path: Path, name: str, entry: Any) -> tuple[int, ...]:
    shape = entry.get("shape") if isinstance(entry, dict) else None
    if not (
        isinstance(shape, list)
        and len(shape) <= _MAX_RANK
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise ModelFileError(path, f"weight {name[:80]!r} has no valid shape in the header")
    return tuple(shape)


def _check_offsets(
    path: Path, tensors: dict[str, Any], shapes: dict[str, tuple[int, ...]], data: int
) -> None:
    """Refuse a header whose shapes its bytes do not hold: every weight's `data_offsets` span
    exactly its elements (shape and dtype), within the `data` bytes after the header, no two
    overlapping - the shapes checked against a config are then the weights transformers loads."""
    spans = []
    for name, entry in tensors.items():
        offsets, dtype = entry.get("data_offsets"), entry.get("dtype")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        ):
            raise ModelFileError(
                path, f"not a readable safetensors file (weight {name[:80]!r} has no data_offsets)"
            )
        bits = _DTYPE_BITS.get(dtype) if isinstance(dtype, str) else None
        if bits is None:
            shown = one_line(repr(dtype), 40)
            raise ModelFileError(
                path, f"not a readable safetensors file (weight {name[:80]!r} has dtype {shown})"
            )
        start, end = offsets
        elements = math.prod(shapes[name])
        if not 0 <= start <= end <= data or (end - start) * 8 != elements * bits:
            raise ModelFileError(
                path, f"not a readable safetensors file (weight {name[:80]!r} of {list(shapes[name])} {dtype} "
                f"takes {elements * bits / 8:.15g} bytes, not bytes {start}..{end} of {data})"
            )  # fmt: skip
        spans.append((start, end, name))
    _check_overlaps(path, spans)


def _check_overlaps(path: Path, spans: list[tuple[int, int, str]]) -> None:
    """Refuse weights whose bytes overlap (each weight its own bytes, as safetensors writes them)."""
    spans.sort()
    for (_, end, first), (start, _, second) in itertools.pairwise(spans):
        if start < end:
            raise ModelFileError(
                path, f"not a readable safetensors file (weights {first[:60]!r} and {second[:60]!r} overlap)"
            )


def gguf_stored(path: Path, reader: Any) -> Stored:
    """A GGUF file's tensors (its dimensions are stored innermost first); none is refused."""
    if not reader.tensors:
        raise ModelFileError(path, "holds no tensors")
    return Stored(
        path, {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in reader.tensors}, True
    )
