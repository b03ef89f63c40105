"""Running a Core AI asset's `main` function on the CPU runtime, synchronously."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    """A function input or output as the runtime describes it."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "dtype": self.dtype.name, "shape": list(self.shape)}


@dataclass(frozen=True)
class RunResult:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    values: dict[str, np.ndarray]  # by output name, in output order


InputsFor = Callable[[tuple[TensorSpec, ...]], Mapping[str, np.ndarray]]


def _specs(names: list[str], describe: Callable[[str], object]) -> tuple[TensorSpec, ...]:
    out = []
    for name in names:
        d = describe(name)
        out.append(TensorSpec(name, np.dtype(d.dtype), tuple(int(s) for s in d.shape)))  # type: ignore[attr-defined]
    return tuple(out)


_CHATTER = (b"ODIE [default]: Loading function",)


@contextlib.contextmanager
def _native_stderr_filtered() -> Iterator[None]:
    """The runtime's native code logs every function load on fd 2; pass on everything else."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield  # no real stderr (an embedding host): nothing to filter
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().splitlines(keepends=True) if not line.startswith(_CHATTER)]
            if kept:
                os.write(fd, b"".join(kept))


def run_asset(path: Path, inputs_for: InputsFor, function: str = "main") -> RunResult:
    """Lower the asset, build its inputs from its descriptors with `inputs_for`, run it once.

    Inputs are converted to the exact descriptor dtype (the runtime demands it) after the caller
    had its say; a shape that differs from the descriptor raises ValueError.
    """
    from coreai.authoring import AIModelAsset
    from coreai.runtime import NDArray

    async def go() -> RunResult:
        async with AIModelAsset.load(path).executable() as model:
            fn = model.load_function(function)
            desc = fn.desc
            ins = _specs(list(desc.input_names), desc.input_descriptor)
            outs = _specs(list(desc.output_names), desc.output_descriptor)
            given = inputs_for(ins)
            arrays = {}
            for spec in ins:
                value = np.asarray(given[spec.name])
                if tuple(value.shape) != spec.shape:
                    raise ValueError(
                        f"input {spec.name} has shape {list(value.shape)}; the model takes {list(spec.shape)}"
                    )
                arrays[spec.name] = NDArray(np.ascontiguousarray(value.astype(spec.dtype, copy=False)))
            result = await fn(arrays)
            values = {spec.name: result[spec.name].numpy().copy() for spec in outs}
            return RunResult(ins, outs, values)

    with _native_stderr_filtered():
        return asyncio.run(go())
