"""Running a Core AI asset's `main` function on the CPU runtime, in its own worker process."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ._sandbox import AssetWorker, TensorSpec


@dataclass(frozen=True)
class RunResult:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    values: dict[str, np.ndarray]  # by output name, in output order


InputsFor = Callable[[tuple[TensorSpec, ...]], Mapping[str, np.ndarray]]


def run_in(worker: AssetWorker, inputs_for: InputsFor) -> RunResult:
    """Lower the worker's asset, build its inputs from its descriptors with `inputs_for`, run once.

    Inputs are converted to the exact descriptor dtype (the runtime demands it) after the caller
    had its say; a shape that differs from the descriptor raises ValueError.
    """
    ins, outs = worker.signature()
    given = inputs_for(ins)
    arrays = {}
    for spec in ins:
        value = np.asarray(given[spec.name])
        if tuple(value.shape) != spec.shape:
            raise ValueError(
                f"input {spec.name} has shape {list(value.shape)}; the model takes {list(spec.shape)}"
            )
        arrays[spec.name] = np.ascontiguousarray(value.astype(spec.dtype, copy=False))
    values = worker.run(arrays)
    return RunResult(ins, outs, {spec.name: values[spec.name] for spec in outs})
