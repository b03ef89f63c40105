"""What a Core AI program holds, with compressed weights read back as one logical tensor each
(`_coreai.program_weights`: a weight is a float value a compute op reads, computed from constants)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coreai_opt import _coreai

from ._report import ModelReport, TensorInfo, WeightInfo


def inspect_ai_program(program: Any, path: Path | str = "") -> ModelReport:
    module = _coreai.mlir_module(program)
    signatures = _coreai.graph_signatures(module)
    found, scalars = _coreai.program_weights(program)
    # functions of one program (a stateful decoder's main and prefill) read the same stored weights
    weights = tuple(dict.fromkeys(WeightInfo(w.name, w.shape, w.encoding, w.nbytes) for w in found))
    main = next((s for s in signatures if s.name == "main"), signatures[0] if signatures else None)
    notes = [f"{scalars} float scalar constants not listed"] if scalars else []
    if len(signatures) > 1:
        notes.append("graphs: " + ", ".join(s.name for s in signatures))
    return ModelReport(
        path=str(path),
        format="aimodel",
        inputs=tuple(TensorInfo(t.name, t.dtype, t.shape) for t in main.inputs) if main else (),
        outputs=tuple(TensorInfo(t.name, t.dtype, t.shape) for t in main.outputs) if main else (),
        ops=dict(_coreai.op_histogram(module).most_common()),
        weights=weights,
        parameters=sum(w.numel for w in weights),
        notes=tuple(notes),
    )
