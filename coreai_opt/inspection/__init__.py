"""What a model file holds: signature, op histogram, weights and how they are stored."""

from __future__ import annotations

from pathlib import Path

from ._aimodel import inspect_ai_program
from ._pt2 import inspect_exported_program, torch_dtype_name
from ._report import ModelReport, TensorInfo, WeightInfo

__all__ = [
    "ModelReport",
    "TensorInfo",
    "WeightInfo",
    "inspect_ai_program",
    "inspect_exported_program",
    "inspect_model",
    "torch_dtype_name",
]


def inspect_model(path: Path | str, *, trust_pickle: bool = False) -> ModelReport:
    """Inspect a `.pt2` or `.aimodel` file; bad files raise `coreai_opt.io.ModelFileError`.

    `trust_pickle` lets a `.pt2` run the pickles it holds (see `coreai_opt.io.load_pt2`).
    """
    from coreai_opt.io import ModelFormat, load_aimodel, load_pt2, model_format, require_existing

    path = Path(path)
    require_existing(path)
    if model_format(path) is ModelFormat.PT2:
        return inspect_exported_program(load_pt2(path, trust_pickle=trust_pickle), path)
    return inspect_ai_program(load_aimodel(path), path)
