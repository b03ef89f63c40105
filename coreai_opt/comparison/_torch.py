"""A `.pt2` side of a comparison: run in PyTorch (seconds even for BERT-base), decompression folded."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from coreai_opt._coreai import RunResult, TensorSpec
from coreai_opt.inputs import InputRule, InputSpec, input_rules, user_input_nodes
from coreai_opt.io import ModelFileError, declared_shape, load_pt2, running

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype a torch dtype's values travel in (bfloat16, which numpy lacks, as float32)."""
    import torch

    return np.dtype(np.float32) if dtype == torch.bfloat16 else torch.empty((), dtype=dtype).numpy().dtype


class ExportedSide:
    """A `.pt2` program ready to run: compressed weights decoded once, inputs by placeholder name;
    on `device` when given (a torch device: inputs go there, outputs come back to the host)."""

    def __init__(self, path: Path, trust_pickle: bool = False, device: str | None = None) -> None:
        from coreai_opt._export import runnable

        self.path, self.device = path, device
        self.program: ExportedProgram = load_pt2(path, trust_pickle=trust_pickle)
        self.module = runnable(self.program, device, page_out=True)  # run, and its graph read: not its values
        users = user_input_nodes(self.program)
        self.dtypes = [n.meta["val"].dtype for n in users]
        self.inputs = tuple(
            TensorSpec(
                n.name, _numpy_dtype(d), tuple(declared_shape(n.meta["val"]))
            )  # hints: int() would pin them
            for n, d in zip(users, self.dtypes, strict=True)
        )

    def release_weights(self) -> int:
        """Let go of the program's tensors the module does not hold (`_export.release_unheld`: the
        codes its decoded weights replaced; on a device, all it copied there), for a side kept for
        running and for its graph; the bytes let go. Nothing reads the program's values after it."""
        from coreai_opt._export import release_unheld

        return release_unheld(self.program, self.module)

    def rules(self, int_range: tuple[int, int] | None) -> tuple[list[InputSpec], list[InputRule]]:
        """How the input policy draws each input, from what the program does with it."""
        from coreai_opt.inputs import exported_program_specs, exported_program_usage

        specs = exported_program_specs(self.program)
        return specs, input_rules(specs, exported_program_usage(self.program), int_range)

    def run(self, arrays: dict[str, np.ndarray]) -> RunResult:
        import torch
        import torch.utils._pytree as pytree

        args = []
        for spec, dtype in zip(self.inputs, self.dtypes, strict=True):
            if spec.name not in arrays:
                raise ModelFileError(self.path, f"takes input {spec.name}, which the other side does not")
            value = np.asarray(arrays[spec.name])
            if tuple(value.shape) != spec.shape:
                raise ModelFileError(
                    self.path, f"input {spec.name} has shape {list(value.shape)}; it takes {list(spec.shape)}"
                )
            args.append(torch.from_numpy(np.ascontiguousarray(value)).to(self.device or "cpu", dtype))
        with torch.no_grad(), running(self.path):
            leaves = [v for v in pytree.tree_leaves(self.module(*args)) if isinstance(v, torch.Tensor)]
        names = [
            s.arg.name for s in self.program.graph_signature.output_specs if s.kind.name == "USER_OUTPUT"
        ]
        values = {
            name: (v.float() if v.dtype == torch.bfloat16 else v).cpu().numpy()
            for name, v in zip(names, leaves, strict=True)
        }
        outputs = tuple(TensorSpec(n, values[n].dtype, tuple(values[n].shape)) for n in names)
        return RunResult(self.inputs, outputs, values)
