"""Checkpoints of a long pass over the calibration samples (the tables tuned end to end), kept in
the calibration cache's folder (`checkpoints/<key>.safetensors`) so that a run stopped part way
takes up again where its last checkpoint was, and ends with the bytes an unbroken run writes.

A checkpoint is tensors only (safetensors: never unpickled) with a digest of their bytes in its
header, and it is read back only when the digest holds and every tensor the pass expects is there
with the expected shape and dtype (`expected`); anything else is ignored and the pass starts
afresh. The digest finds damage, not intent: what keeps others' files out is the folder's rule. The folder keeps the rule of every cache folder
(`coreai_opt._cache`): one that fails is neither read nor written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from coreai_opt._cache import cache_folder_for, plain_name, tensor_bytes

if TYPE_CHECKING:
    import torch

_KEY = re.compile(r"[0-9a-f]{64}")
_WITHOUT = "a long pass keeps no checkpoints and starts afresh when stopped"


def _file(key: str, *, create: bool) -> Path | None:
    from ._cache import cache_folder

    if plain_name(key, _KEY) is None:
        raise ValueError(f"not a checkpoint key: {key!r}")
    folder = cache_folder_for(cache_folder() / "checkpoints", create=create, without=_WITHOUT)
    return None if folder is None else folder / f"{key}.safetensors"


def load_checkpoint(key: str, expected: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> dict[str, torch.Tensor] | None:  # fmt: skip
    """The tensors stored under `key` when they are exactly the `expected` names, shapes and dtypes;
    None otherwise (none stored, a damaged or foreign file: the pass starts afresh)."""
    from safetensors import SafetensorError, safe_open

    path = _file(key, create=False)
    if path is None or not path.is_file():
        return None
    try:
        with safe_open(str(path), "pt") as opened:  # each tensor's bytes fit its shape
            stated = (opened.metadata() or {}).get("digest")
            tensors = {name: opened.get_tensor(name) for name in opened.keys()}  # noqa: SIM118
    except (OSError, ValueError, SafetensorError):
        return None
    if set(tensors) != set(expected) or stated != _digest(tensors):
        return None
    if any((tuple(t.shape), t.dtype) != expected[name] for name, t in tensors.items()):
        return None
    return tensors


def store_checkpoint(key: str, tensors: dict[str, torch.Tensor]) -> None:
    """Keep `tensors` under `key`, replacing the checkpoint before it (atomically: a run stopped
    while writing leaves the older one whole); a folder that cannot be written only costs the
    resumption."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    from coreai_opt.io import ModelFileError, write_atomically

    try:
        path = _file(key, create=True)
        if path is not None:
            plain = {name: t.detach().contiguous().cpu() for name, t in tensors.items()}
            header = {"digest": _digest(plain)}
            write_atomically(path, lambda tmp: save_file(plain, str(tmp), metadata=header))
    except (OSError, ModelFileError, SafetensorError):
        pass


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 of every tensor's name, dtype, shape and bytes, in name order."""
    import hashlib

    digest = hashlib.sha256()
    for name in sorted(tensors):
        value = tensors[name]
        digest.update(f"{name}\0{value.dtype}\0{tuple(value.shape)}\0".encode())
        digest.update(tensor_bytes(value))
    return digest.hexdigest()


def drop_checkpoint(key: str) -> None:
    """Forget the checkpoint under `key` (its pass finished)."""
    try:
        path = _file(key, create=False)
        if path is not None:
            path.unlink(missing_ok=True)
    except OSError:
        pass


class CacheCheckpoints:
    """The checkpoints of one pass (`weights.Checkpoints`): `load_checkpoint`, `store_checkpoint`
    and `drop_checkpoint` under its key."""

    def __init__(self, key: str) -> None:
        self.key = key

    def load(
        self, expected: dict[str, tuple[tuple[int, ...], torch.dtype]]
    ) -> dict[str, torch.Tensor] | None:
        return load_checkpoint(self.key, expected)

    def store(self, tensors: dict[str, torch.Tensor]) -> None:
        store_checkpoint(self.key, tensors)

    def drop(self) -> None:
        drop_checkpoint(self.key)
