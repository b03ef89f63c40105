"""The 16-bit casts on the architectures people ship: each casts, runs, agrees with fp32 and converts."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import _architectures as arch
import pytest
import torch

from coreai_opt._agreement import agreement
from coreai_opt.casting import (
    cast_fp32_to_fp16,
    cast_int32_to_int16,
    cast_to_16_bit_precision,
    new_input_dtypes,
)
from coreai_opt.conversion import convert_exported_program
from coreai_opt.io import load_pt2, save_pt2

PASSES = {
    "fp16": (cast_fp32_to_fp16, True),
    "int16": (cast_int32_to_int16, False),
    "16bit": (cast_to_16_bit_precision, True),
}
BY_NAME = {a.name: a for a in arch.MATRIX}
_exported: dict[str, torch.export.ExportedProgram] = {}


@pytest.fixture(autouse=True)
def _quiet_export() -> None:
    """torch warns that LSTM/GRU flat weights are assigned during export: about torch, not us."""
    warnings.filterwarnings("ignore", message="The tensor attributes", category=UserWarning)


def _program(name: str) -> torch.export.ExportedProgram:
    """Each architecture is exported once per test process; every test casts its own copy."""
    if name not in _exported:
        _exported[name] = arch.export(BY_NAME[name])
    return copy.deepcopy(_exported[name])


def _outputs(value: object) -> list[torch.Tensor]:
    import torch.utils._pytree as pytree

    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


# Every architecture through both casts together ("16bit") and one of the single casts, taken in
# turn (each single cast still meets half of them): all three passes on every architecture cost
# ~30 CPU-s more of make test, over its 15-minute budget.
CASES = [
    pytest.param(name, cast, id=f"{name}-{cast}")
    for i, name in enumerate(sorted(BY_NAME))
    for cast in ("16bit", ("fp16", "int16")[i % 2])
]


@pytest.mark.parametrize(("name", "cast"), CASES)
def test_cast_runs_agrees_and_converts(name: str, cast: str, tmp_path: Path) -> None:
    architecture = BY_NAME[name]
    program = _program(name)
    inputs = architecture.inputs(1)  # other data than the export saw: 0/1 masks, ids in range
    with torch.no_grad():
        reference = _outputs(program.module()(*inputs))
    function, casts_floats = PASSES[cast]
    assert function(program) is program

    program.graph.lint()
    program.validate()
    # The seed's rules for user inputs: fp32 becomes fp16 under the FP pass; these models' integer
    # inputs are token ids (they index) or masks turned into floats (no integer arithmetic), so
    # the INT pass keeps them as they are.
    expected = [torch.float16 if (x.dtype == torch.float32 and casts_floats) else x.dtype for x in inputs]
    assert new_input_dtypes(program) == expected
    with torch.no_grad():
        got = _outputs(program.module()(*[x.to(d) for x, d in zip(inputs, expected, strict=True)]))

    assert len(got) == len(reference)
    for ref, out in zip(reference, got, strict=True):
        if ref.dtype.is_floating_point:
            assert out.dtype == (torch.float16 if casts_floats else ref.dtype)
        else:
            assert out.dtype == ref.dtype
        if not casts_floats:
            assert torch.equal(out, ref)  # the INT pass leaves float math exactly as it was
            continue
        metrics = agreement(ref.double().numpy(), out.double().numpy())
        assert metrics.nonfinite_mismatches == 0
        assert metrics.cosine >= 0.999, metrics
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convert_exported_program(program)
    # the cast program passes the load check (names, operator allowlist, sizes) and runs as it did
    path = save_pt2(program, tmp_path / "cast.pt2")
    with torch.no_grad():
        loaded = _outputs(load_pt2(path).module()(*[x.to(d) for x, d in zip(inputs, expected, strict=True)]))
    assert all(torch.equal(a, b) for a, b in zip(loaded, got, strict=True))


def test_hugging_face_rmsnorm_on_fp16_weights_keeps_node_order() -> None:
    """The shape that broke: x.float(), normalise, .to(x.dtype) * weight, all on fp16 state.

    The pass keeps the float32 normalisation and reuses the model's own cast back to fp16; torch
    asserts the float32 value's dtype before that cast, and the assert must keep reading it.
    """
    import coreai_torch

    norm = arch.RMSNorm(32).half().eval()
    x = torch.randn(2, 8, 32).half()
    program = torch.export.export(norm, (x,)).run_decompositions(coreai_torch.get_decomp_table())
    cast_fp32_to_fp16(program)
    program.graph.lint()
    order = {node: i for i, node in enumerate(program.graph.nodes)}
    for node in program.graph.nodes:
        assert all(order[arg] < order[node] for arg in node.all_input_nodes), node
    asserts = [n for n in program.graph.nodes if n.target == torch.ops.aten._assert_tensor_metadata.default]
    for check in asserts:
        source = check.args[0]
        assert source.meta["val"].dtype == (check.kwargs.get("dtype") or check.args[3])
    with torch.no_grad():
        assert torch.allclose(program.module()(x).float(), norm(x).float(), atol=2e-3)


def test_llama_shape_counts_its_parameters() -> None:
    """The benches size their decoders by LlamaShape.parameters: it must count what torch counts."""
    for shape in (arch.LlamaShape(), arch.LlamaShape(tied=True, kv_heads=4)):
        model = arch.Llama(shape)
        assert shape.parameters == sum(p.numel() for p in model.parameters())
