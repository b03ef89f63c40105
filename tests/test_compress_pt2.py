"""Compressing `torch.export` programs through coreai-torch's ops.

The `.pt2` route must store exactly what the `.aimodel` route stores: converting a compressed
`.pt2` gives constants whose bytes (codes, LUTs, scales, masks) equal those of compressing the
converted `.aimodel`, use for use; the compressed `.pt2` runs in PyTorch and its outputs match the
converted program's on the Core AI runtime.
"""

from __future__ import annotations

import collections
import copy
import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from coreai_opt import _coreai
from coreai_opt.compression import (
    CompressionGranularity as G,
)
from coreai_opt.compression import (
    DType,
    PalettizeConfig,
    QScheme,
    QuantizeConfig,
    SkipKind,
    SparsifyConfig,
    compress_,
)
from coreai_opt.conversion import convert_exported_program
from coreai_opt.io import load_aimodel, load_pt2, save_aimodel, save_pt2
from tests.conftest import SAMPLES, run_aimodel, sample_inputs

CONFIGS = {
    "int8-channel": QuantizeConfig(dtype=DType.INT8),
    "int4-block": QuantizeConfig(dtype=DType.INT4, granularity=G.PER_BLOCK),
    "uint4-channel-asym": QuantizeConfig(dtype=DType.UINT4, qscheme=QScheme.ASYMMETRIC),
    "uint4-block-asym": QuantizeConfig(
        dtype=DType.UINT4, qscheme=QScheme.ASYMMETRIC, granularity=G.PER_BLOCK
    ),
    "int2-channel": QuantizeConfig(dtype=DType.INT2),
    "fp8e4m3": QuantizeConfig(dtype=DType.FP8_E4M3FN),
    "fp8e5m2-e8m0": QuantizeConfig(
        dtype=DType.FP8_E5M2, granularity=G.PER_BLOCK, scale_dtype=DType.FP8_E8M0FNU
    ),
    "mxfp4": QuantizeConfig(dtype=DType.FP4_E2M1FN),
    "lut1-tensor": PalettizeConfig(n_bits=1),
    "lut2-channel": PalettizeConfig(n_bits=2, granularity=G.PER_CHANNEL),
    "lut3-tensor": PalettizeConfig(n_bits=3),  # converted through a repeated 16-entry table, narrowed back
    "lut3-grouped": PalettizeConfig(n_bits=3, granularity=G.PER_GROUPED_CHANNEL, group_size=16),
    "lut4-tensor": PalettizeConfig(n_bits=4),
    "lut6-grouped": PalettizeConfig(n_bits=6, granularity=G.PER_GROUPED_CHANNEL, group_size=16),
    "lut8-int8-scale": PalettizeConfig(
        n_bits=8,
        lut_dtype=DType.INT8,
        granularity=G.PER_GROUPED_CHANNEL,
        group_size=16,
        enable_per_channel_scale=True,
    ),
    "lut4-uint8": PalettizeConfig(n_bits=4, lut_dtype=DType.UINT8, granularity=G.PER_CHANNEL),
    "lut2-vector": PalettizeConfig(n_bits=2, cluster_dim=2),
    "sparse50": SparsifyConfig(target_sparsity=0.5),
    "sparse-block4": SparsifyConfig(target_sparsity=0.5, block_size=4),
    "sparse-2of4-int8": SparsifyConfig(n_m_ratio=(2, 4), quantize_dtype=DType.INT8),
    "sparse50-uint8": SparsifyConfig(target_sparsity=0.5, quantize_dtype=DType.UINT8),
    "sparse50-fp8": SparsifyConfig(target_sparsity=0.5, quantize_dtype=DType.FP8_E4M3FN),
    "sparse50-lut4": SparsifyConfig(target_sparsity=0.5, palettize_nbits=4),
    "sparse50-lut3": SparsifyConfig(target_sparsity=0.5, palettize_nbits=3),
}
# cnn is not here: the converter folds its batch norms into the conv weights, so the converted
# .aimodel holds other weights than the .pt2 (its compressed .pt2 is checked on the runtime below)
MODELS = ("transformer", "mlp", "wide_range")


def _quiet_convert(program: torch.export.ExportedProgram):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return convert_exported_program(program)


def _stored_uses(program) -> collections.Counter:  # type: ignore[no-untyped-def]
    """(element, sha of bytes) of every nonzero constant read by decompression ops, once per use
    (the converter shares equal constants between weights; the .aimodel route writes each)."""
    found: collections.Counter = collections.Counter()
    for op in _coreai.constant_ops(_coreai.mlir_module(program)):
        readers = [use.owner.name for use in op.result.uses]
        if not readers or not all(name in _coreai.DECOMPRESSION_OPS for name in readers):
            continue
        data = _coreai.constant_bytes(op)
        if any(data):  # zero offsets: splats in one program, resources in the other
            found[(_coreai.element_name(op.result.type), hashlib.sha256(data).hexdigest())] += len(readers)
    return found


def _compressed_pt2(model: str, config) -> tuple[torch.export.ExportedProgram, object]:  # type: ignore[no-untyped-def]
    program = load_pt2(SAMPLES / f"{model}.pt2")
    return program, compress_(program, config)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_converting_a_compressed_pt2_stores_what_the_aimodel_route_stores(model: str, name: str) -> None:
    config = CONFIGS[name]
    program, report = _compressed_pt2(model, config)
    reference = load_aimodel(SAMPLES / f"{model}.aimodel")
    reference_report = compress_(reference, config)
    assert len(report.weights) == len(reference_report.weights) > 0  # type: ignore[attr-defined]
    assert sorted(w.encoding for w in report.weights) == sorted(w.encoding for w in reference_report.weights)  # type: ignore[attr-defined]
    assert sorted(round(w.snr_db, 9) for w in report.weights) == sorted(  # type: ignore[attr-defined]
        round(w.snr_db, 9) for w in reference_report.weights
    )
    assert _stored_uses(_quiet_convert(program)) == _stored_uses(reference)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_fast_decoding_equals_coreai_torchs_own_ops_bit_for_bit(name: str) -> None:
    from coreai_opt._export import fold_decompression

    program, _ = _compressed_pt2("transformer", CONFIGS[name])
    inputs = (torch.randint(1, 200, (1, 16)), torch.ones(1, 16, dtype=torch.int64))
    eager = program.module()
    folded = program.module()
    assert fold_decompression(folded) == 9
    assert not any(node.op == "call_function" and "coreai" in str(node.target) for node in folded.graph.nodes)
    assert torch.equal(eager(*inputs), folded(*inputs))


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("transformer", "int4-block"),
        ("transformer", "mxfp4"),
        ("transformer", "lut8-int8-scale"),
        ("transformer", "sparse-2of4-int8"),
        ("transformer", "sparse50-lut4"),
        ("transformer", "lut3-grouped"),
        ("cnn", "uint4-channel-asym"),  # the converter folds batch norm into a decoded conv weight
        ("cnn", "lut4-uint8"),
    ],
)
def test_a_compressed_pt2_runs_in_torch_as_its_conversion_runs_on_core_ai(
    model: str, name: str, tmp_path: Path
) -> None:
    program, _ = _compressed_pt2(model, CONFIGS[name])
    save_pt2(program, tmp_path / "c.pt2")
    loaded = load_pt2(tmp_path / "c.pt2")  # the safe reader: registers coreai-torch's ops first
    asset = save_aimodel(_quiet_convert(loaded), tmp_path / "c.aimodel")
    inputs = sample_inputs(asset)
    runtime = run_aimodel(asset, inputs)
    placeholders = [n for n in loaded.graph.nodes if n.op == "placeholder"][-len(inputs) :]
    args = [
        torch.from_numpy(v).to(p.meta["val"].dtype)
        for v, p in zip(inputs.values(), placeholders, strict=True)
    ]
    with torch.no_grad():
        ours = loaded.module()(*args)
    (value,) = runtime.values()
    assert value.dtype == ours.numpy().dtype
    a, b = ours.numpy().ravel().astype(np.float64), value.ravel().astype(np.float64)
    assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) >= 0.9999


def test_a_compressed_pt2_is_not_compressed_twice() -> None:
    program, first = _compressed_pt2("mlp", QuantizeConfig(dtype=DType.INT8))
    second = compress_(program, PalettizeConfig(n_bits=4))
    assert len(first.weights) == 3 and second.weights == []  # type: ignore[attr-defined]
    assert second.already_compressed == 3
    assert second.warnings[0] == "3 weights were already compressed: left as they were"
    # a large scale tensor is no weight either: it is read by the decode op
    program, _ = _compressed_pt2(
        "transformer", QuantizeConfig(dtype=DType.INT8, granularity=G.PER_BLOCK, block_size=8)
    )
    again = compress_(program, QuantizeConfig(dtype=DType.INT8, weight_num_threshold=1000))
    reasons = {s.reason for s in again.skipped if s.kind is SkipKind.NOT_A_WEIGHT}
    assert "not a weight of conv/matmul/gather (used by coreai.constexpr_blockwise_shift_scale)" in reasons


def test_what_coreai_torch_cannot_carry_is_skipped_with_its_reason() -> None:
    conv = torch.nn.Conv2d(32, 8, 3)  # MX blocks of 32 along the input channels, 3 along the last axis
    program = torch.export.export(conv, (torch.randn(1, 32, 8, 8),))
    report = compress_(program, QuantizeConfig(dtype=DType.FP4_E2M1FN))
    (odd,) = [s for s in report.skipped if s.kind is SkipKind.LAYOUT]
    assert odd.reason == "f4E2M1FN codes pack 2 to a byte along the last axis; its length 3 is not a multiple"


def test_a_weight_read_with_two_layouts_is_left_with_a_reason() -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(64, 48))

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x @ self.w + (y @ self.w.t()).sum()  # [64, 48] read as [K, N] and as [N, K]

    program = torch.export.export(Tied(), (torch.randn(2, 64), torch.randn(2, 48)))
    report = compress_(program, QuantizeConfig(dtype=DType.INT8))
    (skipped,) = report.skipped
    assert skipped.kind is SkipKind.NOT_A_WEIGHT and "different layouts" in skipped.reason


def test_the_seed_functions_take_an_exported_program_and_leave_it_alone() -> None:
    from coreai_opt.coreai_utils import quantize_weights

    program = load_pt2(SAMPLES / "mlp.pt2")
    before = {k: v.clone() for k, v in program.state_dict.items()}
    compressed = quantize_weights(program, DType.INT4, granularity=G.PER_BLOCK)
    assert program.state_dict.keys() == before.keys()
    assert all(torch.equal(program.state_dict[k], v) for k, v in before.items())
    x = torch.randn(4, 64)
    assert torch.allclose(compressed.module()(x), program.module()(x), atol=0.1)
    copy.deepcopy(compressed)  # still an ordinary ExportedProgram


@pytest.mark.parametrize("name", ["int4-block", "lut3-grouped"])
def test_converting_does_not_change_the_callers_program(name: str) -> None:
    program, _ = _compressed_pt2("mlp", CONFIGS[name])
    objects = dict(program.state_dict)
    before = {k: v.clone() for k, v in program.state_dict.items()}
    shapes = {n.name: tuple(n.meta["val"].shape) for n in program.graph.nodes if n.op == "placeholder"}
    _quiet_convert(program)
    assert program.state_dict.keys() == before.keys()
    assert all(program.state_dict[k] is v for k, v in objects.items())  # the tensors themselves, put back
    assert all(
        torch.equal(program.state_dict[k], v) and program.state_dict[k].dtype == v.dtype
        for k, v in before.items()
    )
    assert {
        n.name: tuple(n.meta["val"].shape) for n in program.graph.nodes if n.op == "placeholder"
    } == shapes
    program.module()(torch.randn(4, 64))


def test_3bit_tables_convert_to_3bit_indices_and_repeated_tables_narrow_exactly() -> None:
    program, _ = _compressed_pt2("mlp", CONFIGS["lut3-grouped"])
    converted = _quiet_convert(program)
    luts = [op for op in _coreai.walk_ops(_coreai.mlir_module(converted)) if op.name == "coreai.lut_to_dense"]
    assert [_coreai.element_name(op.operands[0].type) for op in luts] == ["ui3", "ui3"]
    assert [_coreai.tensor_shape(op.operands[1].type) for op in luts] == [(8, 1, 8, 1), (8, 1, 8, 1)]
    assert _coreai.narrow_repeated_luts(converted) == 0  # nothing left to narrow
    # a genuine 4-bit table is left alone: its halves differ
    program, _ = _compressed_pt2("mlp", CONFIGS["lut4-tensor"])
    assert _coreai.narrow_repeated_luts(_quiet_convert(program)) == 0


def test_cli_compresses_a_pt2_into_a_pt2(coreopt, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "t.lut4.pt2"
    result = coreopt("palettize", SAMPLES / "transformer.pt2", "--nbits", "4", "-o", out, "--json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert len(document["report"]["weights"]) == 9 and document["file_bytes_after"] == out.stat().st_size
    shown = coreopt("inspect", out, "--json")
    weights = json.loads(shown.stdout)["weights"]
    compressed = [w for w in weights if w["kind"] == "compressed"]
    assert {w["encoding"] for w in compressed} == {"ui4 LUT(16 x f32)"} and len(compressed) == 9
    assert {w["name"] for w in compressed} == {w["name"] for w in document["report"]["weights"]}


def test_compare_runs_pt2_programs_in_torch_and_mixes_them_with_aimodels(tmp_path: Path) -> None:
    from coreai_opt._agreement import agreement
    from coreai_opt.comparison import compare_files

    program, _ = _compressed_pt2("transformer", PalettizeConfig(n_bits=4))
    save_pt2(program, tmp_path / "t4.pt2")
    result = compare_files(SAMPLES / "transformer.pt2", tmp_path / "t4.pt2", min_cosine=0.99)
    (output,) = result.outputs
    result_inputs = _drawn(result)
    reference = load_pt2(SAMPLES / "transformer.pt2").module()
    args = [torch.from_numpy(result_inputs[n]) for n in ("input_ids", "attention_mask")]
    with torch.no_grad():
        expected = agreement(reference(*args).numpy(), program.module()(*args).numpy())
    assert output.metrics == expected and result.ok is True
    mixed = compare_files(SAMPLES / "transformer.pt2", SAMPLES / "transformer.aimodel")
    assert mixed.outputs[0].metrics.cosine >= 0.99999  # the same program, in torch and on Core AI


def _drawn(result) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    """The inputs a comparison drew, drawn again from its recorded rules (the policy is seeded)."""
    from coreai_opt.inputs import draw_inputs
    from coreai_opt.inputs._usage import exported_program_specs

    specs = exported_program_specs(load_pt2(SAMPLES / "transformer.pt2"))
    return draw_inputs(specs, result.rules, 0)


def test_compare_names_a_pt2_that_cannot_be_read(coreopt, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip")
    result = coreopt("compare", SAMPLES / "transformer.pt2", bad)
    assert result.exit_code == 1 and str(bad) in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "name", ["int4-block", "mxfp4", "fp8e5m2-e8m0", "lut8-int8-scale", "sparse-2of4-int8"]
)
def test_export_compress_cast_convert(name: str, tmp_path: Path) -> None:
    """Export -> compress the .pt2 -> cast to 16 bits -> convert: codes stay integer, LUTs and
    scales follow the fp16 decision, and the program still agrees with its uncast self."""
    from coreai_opt._agreement import agreement
    from coreai_opt.casting import CastTarget, cast_program

    program, _ = _compressed_pt2("transformer", CONFIGS[name])
    codes_before = {k: v.dtype for k, v in program.state_dict.items() if not v.is_floating_point()}
    inputs = (torch.randint(1, 200, (1, 16)), torch.ones(1, 16, dtype=torch.int64))
    with torch.no_grad():
        before = program.module()(*inputs)
    cast_program(program, CastTarget.BOTH)
    after_dtypes = {k: v.dtype for k, v in program.state_dict.items()}
    assert {k: after_dtypes[k] for k in codes_before} == codes_before  # codes, indices, masks untouched
    assert not any(d == torch.float32 for d in after_dtypes.values())
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"][-len(inputs) :]
    with torch.no_grad():  # each input in the dtype the cast program takes now
        after = program.module()(
            *(i.to(p.meta["val"].dtype) for i, p in zip(inputs, placeholders, strict=True))
        )
    assert after.dtype == torch.float16
    assert agreement(before.numpy(), after.float().numpy()).cosine >= 0.999
    save_aimodel(_quiet_convert(program), tmp_path / "c.aimodel")
