"""Does the cast program still compute what the original did? Run both on the same inputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from coreai_opt._agreement import Agreement, agreement
from coreai_opt.io import ModelFileError

from . import _graph as g
from ._program import user_inputs

COSINE_MIN = 0.999  # fp16 keeps ~3 decimal digits; a healthy cast agrees far better than this
RELATIVE_MAX = 0.05  # max abs error over the output's max magnitude


@dataclass(frozen=True)
class OutputAgreement:
    name: str
    dtype_before: str
    dtype_after: str
    metrics: Agreement
    ok: bool

    @property
    def max_abs_error(self) -> float:
        return self.metrics.max_abs_error

    @property
    def relative_error(self) -> float:
        return self.metrics.relative_error

    @property
    def cosine(self) -> float:
        return self.metrics.cosine

    def to_dict(self) -> dict[str, Any]:
        head = {"name": self.name, "dtype_before": self.dtype_before, "dtype_after": self.dtype_after}
        return head | self.metrics.to_dict() | {"ok": self.ok}


@dataclass
class CheckResult:
    inputs: str  # where the inputs came from
    outputs: list[OutputAgreement] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": self.inputs, "ok": self.ok, "outputs": [o.to_dict() for o in self.outputs]}


def _index_bound(ep: ExportedProgram) -> int:
    """An exclusive bound for random integer inputs that keeps embedding lookups in range.

    Ids may pass through arithmetic before they index (ids * 2 + 3), so use a quarter of the
    smallest table.
    """
    rows = []
    for node in ep.graph.nodes:
        if node.op == "call_function" and g.packet(node) is torch.ops.aten.embedding:
            weight = node.args[0].meta.get("val")  # type: ignore[union-attr]
            if weight is not None:
                rows.append(int(weight.shape[0]))
    return max(3, min(rows) // 4) if rows else 16


def _concrete(dim: Any) -> int:
    return int(dim.node.hint) if isinstance(dim, torch.SymInt) else int(dim)


def random_inputs(ep: ExportedProgram, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    bound = _index_bound(ep)
    tensors = []
    for node in user_inputs(ep):
        val = node.meta["val"]
        shape = [_concrete(d) for d in val.shape]
        if val.dtype == torch.bool:
            tensors.append(torch.randint(0, 2, shape, generator=generator).bool())
        elif val.dtype.is_floating_point:
            tensors.append(torch.randn(shape, generator=generator).to(val.dtype))
        else:
            # from 1: a zero in an attention mask pads, and a row padded everywhere is where the
            # rule -inf -> -65504 changes softmax by design (fp32 masks it, fp16 spreads it evenly)
            tensors.append(torch.randint(1, bound, shape, generator=generator, dtype=val.dtype))
    return tensors


def file_inputs(ep: ExportedProgram, path: Path) -> list[torch.Tensor]:
    """Inputs from a safetensors file, one tensor per user input, keyed by the input's name."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise ModelFileError(path, f"not a readable safetensors file ({exc})") from None
    names = [node.name for node in user_inputs(ep)]
    missing = [n for n in names if n not in tensors]
    if missing:
        raise ModelFileError(
            path, f"has no tensor for input(s) {', '.join(missing)} (expected {', '.join(names)})"
        )
    return [tensors[n] for n in names]


def _leaves(value: Any) -> list[Any]:
    import torch.utils._pytree as pytree

    return pytree.tree_leaves(value)


def compare_programs(
    original: ExportedProgram, cast: ExportedProgram, inputs: list[torch.Tensor], source: str
) -> CheckResult:
    """Run both programs (the cast one on inputs converted to its new input dtypes) and compare outputs."""
    new_dtypes = [g.dtype_of(n) for n in user_inputs(cast)]
    with torch.no_grad():
        before = _leaves(original.module()(*inputs))
        after = _leaves(
            cast.module()(*[t.to(d) if d is not None else t for t, d in zip(inputs, new_dtypes, strict=True)])
        )
    result = CheckResult(inputs=source)
    for i, (ref, got) in enumerate(zip(before, after, strict=True)):
        if not isinstance(ref, torch.Tensor):
            continue
        metrics = agreement(ref.detach().double().numpy(), got.detach().double().numpy())
        ok = metrics.nonfinite_mismatches == 0 and metrics.cosine >= COSINE_MIN
        ok = ok and metrics.relative_error <= RELATIVE_MAX
        dtypes = (str(t.dtype).removeprefix("torch.") for t in (ref, got))
        result.outputs.append(OutputAgreement(f"output {i}", *dtypes, metrics, ok))
    return result
