"""`coreopt inspect` on every sample model and on hand-built compressed programs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from _compressed_programs import IN, OUT, build_compressed_program
from conftest import SAMPLE_NAMES, SAMPLES, load_sample_builder, run_aimodel

from coreai_opt.inspection import inspect_model
from coreai_opt.io import load_pt2, save_aimodel


@pytest.mark.parametrize("name", SAMPLE_NAMES)
@pytest.mark.parametrize("fmt", ["pt2", "aimodel"])
def test_inspect_json_describes_every_sample(name: str, fmt: str, coreopt) -> None:  # type: ignore[no-untyped-def]
    result = coreopt("inspect", SAMPLES / f"{name}.{fmt}", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["format"] == fmt
    assert doc["inputs"] and doc["outputs"] and doc["weights"]
    totals = doc["totals"]
    assert totals["weight_bytes"] == sum(w["nbytes"] for w in doc["weights"])
    assert totals["weight_elements"] == sum(math.prod(w["shape"]) for w in doc["weights"])
    assert totals["mean_bits_per_weight"] == pytest.approx(
        8 * totals["weight_bytes"] / totals["weight_elements"]
    )
    # every sample stores its float weights in fp32 (the CNN also has int64 batch counters)
    float_rows = [w for w in doc["weights"] if w["encoding"] == "f32"]
    assert float_rows and all(w["bits_per_weight"] == 32.0 for w in float_rows)
    # a constant of one repeated value is stored once (wide_range's 1e6 buffer)
    for splat in (w for w in doc["weights"] if w["encoding"] == "f32 splat"):
        assert splat["nbytes"] == 4
    assert {w["encoding"] for w in doc["weights"]} <= {"f32", "f32 splat", "si64"}
    assert sum(doc["ops"].values()) > 0


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_pt2_parameter_count_is_the_models(name: str) -> None:
    builder = load_sample_builder()
    sample = next(s for s in builder.SAMPLES if s.name == name)
    model = sample.factory()
    expected = sum(p.numel() for p in model.parameters())
    assert inspect_model(SAMPLES / f"{name}.pt2").parameters == expected


@pytest.mark.parametrize("name", ["mlp", "transformer", "wide_range", "int_arith"])
def test_aimodel_weights_are_the_exports_float_state(name: str) -> None:
    """Without batchnorm to fold, every float tensor of the export is one weight of the asset."""
    program = load_pt2(SAMPLES / f"{name}.pt2")
    state = list(program.state_dict.values()) + list(program.constants.values())
    expected = sorted(tuple(t.shape) for t in state if t.is_floating_point() and t.numel() > 1)
    report = inspect_model(SAMPLES / f"{name}.aimodel")
    assert sorted(w.shape for w in report.weights) == expected
    assert report.parameters == sum(math.prod(s) for s in expected)


def test_inspect_signature_of_transformer() -> None:
    pt2 = inspect_model(SAMPLES / "transformer.pt2")
    aimodel = inspect_model(SAMPLES / "transformer.aimodel")
    assert [(t.name, t.dtype, t.shape) for t in pt2.inputs] == [
        ("input_ids", "si64", (1, 16)),
        ("attention_mask", "si64", (1, 16)),
    ]
    # coreai-torch turns int64 graph inputs into int32
    assert [(t.name, t.dtype, t.shape) for t in aimodel.inputs] == [
        ("input_ids", "si32", (1, 16)),
        ("attention_mask", "si32", (1, 16)),
    ]
    assert [t.shape for t in aimodel.outputs] == [(1, 8)]
    assert pt2.ops["aten.embedding.default"] == 2
    assert pt2.ops["aten._softmax.default"] == 2


def test_inspect_recognises_compressed_encodings(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    built = build_compressed_program()
    path = save_aimodel(built.program, tmp_path / "compressed.aimodel")

    # The program is real: the runtime reproduces the dense weights the builder packed.
    x = np.random.default_rng(1).standard_normal((2, IN)).astype(np.float16)
    out = run_aimodel(path, {"x": x})["y"].astype(np.float32)
    np.testing.assert_allclose(out, built.reference(x), atol=0.05, rtol=0.01)

    result = coreopt("inspect", path, "--json")
    assert result.exit_code == 0, result.stderr
    weights = json.loads(result.stdout)["weights"]
    by_encoding = {w["encoding"]: w for w in weights}
    numel = IN * OUT
    lut = by_encoding["ui4 LUT(16 x f16)"]
    assert lut["nbytes"] == numel // 2 + 16 * 2 + 2  # packed nibbles + LUT + axis scalar
    assert lut["bits_per_weight"] == pytest.approx(8 * lut["nbytes"] / numel, abs=1e-4)
    int8 = by_encoding["si8 + f16 scale per channel"]
    assert int8["nbytes"] == numel + OUT * 2 + 1 + 2  # data + scale + zero offsets (splats: one value)
    nnz = int(np.count_nonzero(built.dense["sparse"]))
    sparse = next(w for w in weights if w["encoding"].startswith("sparse bitmask"))
    assert sparse["encoding"].endswith("values f16")
    assert sparse["nbytes"] == nnz * 2 + numel // 8
    assert all(w["shape"] == [IN, OUT] for w in weights)
    # the human table shows the same encodings
    table = coreopt("inspect", path)
    assert table.exit_code == 0
    assert "ui4 LUT(16 x f16)" in table.stdout
