"""A converted stateful decoder (`coreopt convert` of an `export --kv-cache` program) on the Core AI
runtime, in its worker process: "prefill" takes whole chunks, "main" one token at a time, and both
read and write the cache the worker keeps as the functions' shared state."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ._decoder import NotADecoder, check_fit

if TYPE_CHECKING:
    import torch


class AssetDecoder:
    """The decoder `path` holds, run by `worker` (an `AssetWorker` over the verified asset)."""

    def __init__(self, path: Path, worker: Any) -> None:
        from coreai_opt._coreai import WorkerFailure
        from coreai_opt.io import worker_errors
        from coreai_opt.models import STATE_INPUTS

        self.path, self.worker = path, worker
        with worker_errors(path):
            inputs, _, states = worker.signatures("main")
        if tuple(s.name for s in inputs) != STATE_INPUTS or not states:
            names = ", ".join(s.name for s in inputs) or "nothing"
            raise NotADecoder(f"takes {names} and keeps {len(states)} state tensors, not a key/value cache")
        self.dtypes = {s.name: s.dtype for s in inputs}
        self.context = int(states[0].shape[2])
        self.state_bytes = sum(math.prod(s.shape) * s.dtype.itemsize for s in states)
        try:
            prefill = worker.signatures("prefill")[0]
            self.chunk = int(next(s.shape[1] for s in prefill if s.name == STATE_INPUTS[0]))
        except WorkerFailure:
            self.chunk = 1  # no prefill function: every token through main

    def reset(self) -> None:
        from coreai_opt.io import worker_errors

        with worker_errors(self.path):
            self.worker.reset("main")

    def __call__(self, ids: Sequence[int], position: int) -> torch.Tensor:
        """Logits `[len(ids), vocab]`: whole chunks through prefill, the rest token by token."""
        import torch

        check_fit(ids, position, self.context)
        pieces, at = [], 0
        while at < len(ids):
            function, count = ("prefill", self.chunk) if len(ids) - at >= self.chunk > 1 else ("main", 1)
            pieces.append(self._run(function, ids[at : at + count], position + at))
            at += count
        return torch.from_numpy(np.concatenate(pieces).astype(np.float32, copy=False))

    def _run(self, function: str, ids: Sequence[int], position: int) -> np.ndarray:
        from coreai_opt.io import worker_errors
        from coreai_opt.models import STATE_INPUTS

        tokens, where = STATE_INPUTS
        arrays = {
            tokens: np.asarray([list(ids)], dtype=self.dtypes[tokens]),
            where: np.asarray([position], dtype=self.dtypes[where]),
        }
        with worker_errors(self.path):
            (logits,) = self.worker.run(arrays, function).values()
        return np.asarray(logits)[0]
