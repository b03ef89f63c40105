"""palettize_weights on real Core AI programs, checked on the runtime against an independent decoding."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from _decode import assert_runtime_matches_decoding, densify
from conftest import SAMPLES, run_aimodel

from coreai_opt.compression import Override
from coreai_opt.conversion import convert_exported_program
from coreai_opt.coreai_utils import (
    CompressionGranularity,
    DType,
    PalettizeConfig,
    QuantizeConfig,
    SkipKind,
    SparsifyConfig,
    compress_,
    palettize_weights,
)
from coreai_opt.inspection import inspect_model
from coreai_opt.io import load_aimodel, save_aimodel

G = CompressionGranularity
THRESHOLD = 256

PLANS = {
    "4b-tensor": PalettizeConfig(n_bits=4),
    "4b-channel": PalettizeConfig(n_bits=4, granularity=G.PER_CHANNEL),
    "3b-grouped16": PalettizeConfig(n_bits=3, granularity=G.PER_GROUPED_CHANNEL, group_size=16),
    "6b-channel-int8lut-scale": PalettizeConfig(
        n_bits=6, lut_dtype=DType.INT8, granularity=G.PER_CHANNEL, enable_per_channel_scale=True
    ),
    "2b-tensor-uint8lut-scale": PalettizeConfig(
        n_bits=2, lut_dtype=DType.UINT8, enable_per_channel_scale=True
    ),
    "4b-grouped8-fp8lut": PalettizeConfig(
        n_bits=4, lut_dtype=DType.FP8_E4M3FN, granularity=G.PER_GROUPED_CHANNEL, group_size=8
    ),
    "4b-channel-e5m2lut": PalettizeConfig(n_bits=4, lut_dtype=DType.FP8_E5M2, granularity=G.PER_CHANNEL),
    "2b-vector2-tensor": PalettizeConfig(n_bits=2, cluster_dim=2),
    "4b-vector4-grouped8-int8-scale": PalettizeConfig(
        n_bits=4,
        lut_dtype=DType.INT8,
        granularity=G.PER_GROUPED_CHANNEL,
        group_size=8,
        cluster_dim=4,
        enable_per_channel_scale=True,
    ),
    "8b-tensor-fast": PalettizeConfig(n_bits=8, enable_fast_kmeans_mode=True, rounding_precision=3),
    "1b-tensor": PalettizeConfig(n_bits=1),
    "4b-channel-2workers": PalettizeConfig(n_bits=4, granularity=G.PER_CHANNEL, num_kmeans_workers=2),
}


# vector LUTs' k-means is the slow one: on the MLP and the CNN, every other plan on all three
CASES = [(plan, sample) for plan in sorted(PLANS) for sample in ("mlp", "cnn", "transformer")
         if not (PLANS[plan].cluster_dim > 1 and sample == "transformer")]  # fmt: skip


@pytest.mark.parametrize(("plan_id", "sample"), CASES)
def test_runtime_equals_numpy_decoding(plan_id: str, sample: str, tmp_path: Path) -> None:
    plan = PLANS[plan_id]
    program = load_aimodel(SAMPLES / f"{sample}.aimodel")
    report = compress_(program, replace(plan, weight_num_threshold=THRESHOLD))
    assert report.weights
    path = save_aimodel(program, tmp_path / "p.aimodel")
    # inspect sees what the report says, and the bytes add up from the format
    inspected = inspect_model(path)
    lut_weights = sorted((w.shape, w.encoding, w.nbytes) for w in inspected.weights if "LUT" in w.encoding)
    assert lut_weights == sorted((w.shape, w.encoding, w.bytes_after) for w in report.weights)
    entries = 2**plan.n_bits
    for w in report.weights:
        assert w.encoding.startswith(f"ui{plan.n_bits} LUT({entries} x ")
        channels = w.shape[0]  # every sample weight has its output channels on axis 0
        expected_luts = {G.PER_TENSOR: 1, G.PER_CHANNEL: channels}.get(
            plan.granularity, channels // plan.group_size
        )
        assert w.luts == expected_luts
        index_bytes = math.ceil(math.prod(w.shape) // plan.cluster_dim * plan.n_bits / 8)
        lut_bytes = expected_luts * entries * plan.cluster_dim * (4 if plan.lut_dtype is None else 1)
        assert w.bytes_after >= index_bytes + lut_bytes + 2  # + the axis scalar (+ scales)
        if plan.lut_dtype is None and not plan.enable_per_channel_scale:
            assert w.bytes_after == index_bytes + lut_bytes + 2
    for skipped in report.skipped:
        assert skipped.kind.value in ("small", "not-a-weight", "layout", "would-grow")
        if skipped.kind.value == "would-grow":  # one LUT outweighs a small weight: kept in fp32
            index_bytes = math.ceil(math.prod(skipped.shape) * plan.n_bits / 8)
            grown = index_bytes + entries * plan.cluster_dim * 4 * (
                1 if plan.granularity is G.PER_TENSOR else 0
            )
            assert skipped.nbytes == 4 * math.prod(skipped.shape)
            if plan.granularity is G.PER_TENSOR and plan.lut_dtype is None:
                assert skipped.reason == f"kept: would grow ({skipped.nbytes:,} -> {grown:,} bytes)"
    # the runtime decompresses exactly what the numpy decoding of the stored bytes gives
    assert_runtime_matches_decoding(path, len(report.weights), tmp_path)


def test_4_bit_per_channel_transformer_keeps_cosine(tmp_path: Path) -> None:
    program = palettize_weights(load_aimodel(SAMPLES / "transformer.aimodel"), 4, granularity=G.PER_CHANNEL)
    path = save_aimodel(program, tmp_path / "t4.aimodel")
    inputs = {
        "input_ids": np.arange(16, dtype=np.int32)[None] * 7 % 256,
        "attention_mask": np.ones((1, 16), np.int32),
    }
    ref = next(iter(run_aimodel(SAMPLES / "transformer.aimodel", inputs).values())).astype(np.float64).ravel()
    got = next(iter(run_aimodel(path, inputs).values())).astype(np.float64).ravel()
    assert ref @ got / np.linalg.norm(ref) / np.linalg.norm(got) >= 0.99


@pytest.fixture(scope="module")
def fp16_probe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """`_fp16_probe`, built once a module (every test only reads it)."""
    return _fp16_probe(tmp_path_factory.mktemp("fp16_probe"))


def _fp16_probe(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """fp16 linear layer whose weights include values near 7.0 and 300.0 (beyond fp16 rounding's
    6.55), and its weights."""
    import coreai_torch

    rng = np.random.default_rng(3)
    weight = rng.standard_normal((48, 64)) * 0.5
    weight[::5, 3] = 7.0 + rng.standard_normal(10) * 0.01
    weight[::7, 9] = 300.0 + rng.standard_normal(7)
    layer = torch.nn.Linear(64, 48, bias=False).eval().half()
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(weight))
        program = torch.export.export(layer, (torch.eye(64, dtype=torch.float16),))
        program = program.run_decompositions(coreai_torch.get_decomp_table())
    return save_aimodel(convert_exported_program(program), tmp_path / "big.aimodel"), weight


@pytest.mark.parametrize(
    "plan",
    [
        PalettizeConfig(n_bits=4),
        PalettizeConfig(n_bits=4, enable_fast_kmeans_mode=True),
        PalettizeConfig(n_bits=4, enable_fast_kmeans_mode=True, rounding_precision=0),
        PalettizeConfig(n_bits=4, granularity=G.PER_CHANNEL, enable_fast_kmeans_mode=True),
        PalettizeConfig(
            n_bits=4,
            lut_dtype=DType.INT8,
            granularity=G.PER_GROUPED_CHANNEL,
            group_size=16,
            enable_per_channel_scale=True,
            enable_fast_kmeans_mode=True,
        ),
        PalettizeConfig(n_bits=4, lut_dtype=DType.FP8_E4M3FN, enable_fast_kmeans_mode=True),
        PalettizeConfig(n_bits=2, cluster_dim=2),
    ],
    ids=["exact", "fast", "fast-0dp", "fast-channel", "fast-grouped-int8-scale", "fast-fp8", "vector"],
)
def test_large_fp16_weights_never_become_nan(
    plan: PalettizeConfig, tmp_path: Path, fp16_probe: tuple[Path, np.ndarray]
) -> None:
    path, _ = fp16_probe
    program = load_aimodel(path)
    report = compress_(program, replace(plan, weight_num_threshold=0))
    assert len(report.weights) == 1 and np.isfinite(report.weights[0].snr_db)
    out = save_aimodel(program, tmp_path / "p.aimodel")
    got = next(
        iter(run_aimodel(out, {inspect_model(out).inputs[0].name: np.eye(64, dtype=np.float16)}).values())
    )
    assert np.isfinite(got).all()
    assert np.abs(got).max() > 250  # the 300s survive as a cluster of their own


@pytest.mark.parametrize("special", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_a_weight_with_nan_or_inf_is_left_alone_by_every_pass(
    special: float, tmp_path: Path, fp16_probe: tuple[Path, np.ndarray]
) -> None:
    """No scale, LUT or mask carries a NaN or Inf: every pass skips the weight with the count of bad
    values, and the program still computes exactly what it did."""
    _, weight = fp16_probe
    compress = {
        "quantize": lambda p: compress_(p, QuantizeConfig(dtype=DType.INT8, weight_num_threshold=0)),
        "palettize": lambda p: compress_(p, PalettizeConfig(n_bits=4, weight_num_threshold=0)),
        "sparsify": lambda p: compress_(p, SparsifyConfig(weight_num_threshold=0)),
    }
    import coreai_torch

    layer = torch.nn.Linear(64, 48, bias=False).eval().half()
    with torch.no_grad():
        bad = torch.from_numpy(weight).half()
        bad[5, 7], bad[40, 1] = special, special
        layer.weight.copy_(bad)
        exported = torch.export.export(layer, (torch.eye(64, dtype=torch.float16),))
        exported = exported.run_decompositions(coreai_torch.get_decomp_table())
    source = save_aimodel(convert_exported_program(exported), tmp_path / "bad.aimodel")
    probe = {inspect_model(source).inputs[0].name: np.eye(64, dtype=np.float16)}
    reference = next(iter(run_aimodel(source, probe).values()))
    for name, run in compress.items():
        program = load_aimodel(source)
        report = run(program)
        assert not report.weights, name
        assert [(s.kind, s.reason) for s in report.skipped] == [
            (SkipKind.NON_FINITE, "2 NaN or Inf values: left uncompressed")
        ], name
        out = save_aimodel(program, tmp_path / f"{name}.aimodel")
        got = next(iter(run_aimodel(out, probe).values()))
        np.testing.assert_array_equal(got, reference)


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"n_bits": 5}, "n_bits must be one of"),
        ({"lut_dtype": DType.INT4}, "lut_dtype is None"),
        ({"granularity": G.PER_BLOCK}, "per-tensor, per-channel or per-grouped-channel granularity"),
        ({"cluster_dim": 2, "granularity": G.PER_CHANNEL}, "use per-tensor or grouped"),
        (
            {"cluster_dim": 3, "granularity": G.PER_GROUPED_CHANNEL, "group_size": 8},
            "multiple of cluster_dim",
        ),
        ({"num_kmeans_workers": -1}, "num_kmeans_workers"),
    ],
)
def test_invalid_options_name_the_rule(kwargs: dict, rule: str) -> None:
    with pytest.raises(ValueError, match=rule):
        palettize_weights(load_aimodel(SAMPLES / "mlp.aimodel"), **kwargs)


def test_ungroupable_channels_are_skipped_with_a_reason() -> None:
    report = compress_(
        load_aimodel(SAMPLES / "transformer.aimodel"),
        PalettizeConfig(n_bits=4, granularity=G.PER_GROUPED_CHANNEL, group_size=48, weight_num_threshold=256),
    )
    reasons = [s.reason for s in report.skipped if s.kind.value == "layout"]
    assert reasons and all("not a multiple of group_size 48" in r for r in reasons)
    assert {w.shape[0] % 48 for w in report.weights} == {0}


def test_16_bit_histogram_path_equals_the_sorting_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-tensor fp16 groups of >= 65,536 weights are histogrammed by bit pattern: same LUT, same indices."""
    import coreai_torch
    from conftest import constant_records

    from coreai_opt.compression.algorithms import _kmeans as _palettize

    layer = torch.nn.Linear(256, 512, bias=False).eval().half()
    with torch.no_grad():
        program = torch.export.export(layer, (torch.randn(2, 256, dtype=torch.float16),))
        program = program.run_decompositions(coreai_torch.get_decomp_table())
    path = save_aimodel(convert_exported_program(program), tmp_path / "wide.aimodel")
    histogram = load_aimodel(path)
    calls = []
    original = _palettize._clusters_16_bit
    monkeypatch.setattr(_palettize, "_clusters_16_bit", lambda *a: calls.append(1) or original(*a))
    compress_(histogram, PalettizeConfig(n_bits=4, weight_num_threshold=0))
    assert calls, "the histogram path ran"
    monkeypatch.setattr(_palettize, "_MAX_HISTOGRAM_BINS", 0)
    sorting = load_aimodel(path)
    compress_(sorting, PalettizeConfig(n_bits=4, weight_num_threshold=0))
    assert len(calls) == 1
    assert constant_records(histogram) == constant_records(sorting)
    out = save_aimodel(histogram, tmp_path / "h.aimodel")
    dense = load_aimodel(out)
    densify(dense)
    x = {
        inspect_model(out).inputs[0].name: np.random.default_rng(0)
        .standard_normal((2, 256))
        .astype(np.float16)
    }
    got = next(iter(run_aimodel(out, x).values()))
    want = next(iter(run_aimodel(save_aimodel(dense, tmp_path / "d.aimodel"), x).values()))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "text, changes",
    [
        ("head*:n_bits=8", (("n_bits", 8),)),
        ("head*:nbits=8", (("n_bits", 8),)),
        ("head*:--nbits=8,per-channel-scale=true", (("enable_per_channel_scale", True), ("n_bits", 8))),
        ("head*:workers=2,lut-dtype=int8", (("lut_dtype", "int8"), ("num_kmeans_workers", 2))),
    ],
)
def test_an_override_takes_the_flag_or_the_field_name(text: str, changes: tuple) -> None:
    from coreai_opt.compression import parse_override

    assert parse_override(text, PalettizeConfig) == Override("head*", False, changes)
    config = PalettizeConfig(overrides=(parse_override(text, PalettizeConfig),))
    assert config.for_weight("head.weight") != config


def test_an_override_naming_no_option_is_refused() -> None:
    from coreai_opt.compression import parse_override

    with pytest.raises(ValueError, match="'bits' is not an option of PalettizeConfig"):
        parse_override("head*:bits=8", PalettizeConfig)


def test_the_report_names_the_options_as_the_user_typed_them(coreopt, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    done = coreopt("palettize", SAMPLES / "mlp.pt2", "--nbits", "4", "--per-channel-scale", "--threshold", "0",
                   "-o", tmp_path / "out.pt2")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    header = " ".join(done.stdout.split())
    assert "--nbits 4" in header and "--per-channel-scale True" in header and "--workers 0" in header
    assert "n_bits" not in header and "enable_per_channel_scale" not in header and "num_kmeans" not in header
