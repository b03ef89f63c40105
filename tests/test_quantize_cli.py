"""`coreopt quantize` and `coreopt compare` end to end: files, JSON, exit codes, real runtime numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _hostile import tree_digest
from conftest import SAMPLES, copy_sample, run_aimodel


def _json(result) -> dict:  # type: ignore[no-untyped-def]
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)  # stdout is one JSON document, nothing else


def test_quantize_int8_then_compare_the_transformer(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    source = copy_sample("transformer", "aimodel", tmp_path)
    digest = tree_digest(source)
    out = tmp_path / "t.int8.aimodel"
    doc = _json(coreopt("quantize", source, "--dtype", "int8", "-o", out, "--json"))
    assert tree_digest(source) == digest  # the input is never modified
    report = doc["report"]
    assert doc["output"] == str(out) and out.is_dir()
    assert len(report["weights"]) == 9  # token embedding + 8 linear weights above 1024 elements
    assert all(w["encoding"] == "si8 + f32 scale per channel" for w in report["weights"])
    assert report["bytes_before"] == sum(4 * np.prod(w["shape"]) for w in report["weights"])
    assert 3.7 < report["ratio"] < 4.0  # int8 data plus one f32 scale per row
    assert 8.0 < report["bits_per_weight"] < 8.6
    assert all(w["snr_db"] > 40 for w in report["weights"])
    assert {s["kind"] for s in report["skipped"]} == {"small"}
    assert doc["file_bytes_after"] < doc["file_bytes_before"] / 2.5

    # inspect reads the same bytes back from the saved asset
    inspected = _json(coreopt("inspect", out, "--json"))
    stored = {(tuple(w["shape"]), w["nbytes"]) for w in inspected["weights"] if "scale" in w["encoding"]}
    assert stored == {(tuple(w["shape"]), w["bytes_after"]) for w in report["weights"]}

    compared = _json(coreopt("compare", source, out, "--min-cosine", "0.999", "--json"))
    (output,) = compared["outputs"]
    assert compared["ok"] is True and output["ok"] is True
    assert 0.999 <= output["cosine"] < 1.0  # quantized, so not identical
    assert output["snr_db"] > 25


def test_compare_numbers_are_the_runtime_outputs(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    """With --inputs, compare's metrics are exactly those of the two runtime outputs."""
    from safetensors.numpy import save_file

    out = tmp_path / "mlp.int4.aimodel"
    assert coreopt("quantize", SAMPLES / "mlp.aimodel", "--dtype", "int4", "-o", out).exit_code == 0
    x = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    inputs = tmp_path / "x.safetensors"
    save_file({"x": x}, str(inputs))
    doc = _json(coreopt("compare", SAMPLES / "mlp.aimodel", out, "--inputs", inputs, "--json"))
    ref = next(iter(run_aimodel(SAMPLES / "mlp.aimodel", {"x": x}).values())).astype(np.float64).ravel()
    got = next(iter(run_aimodel(out, {"x": x}).values())).astype(np.float64).ravel()
    (output,) = doc["outputs"]
    assert output["max_abs_error"] == pytest.approx(np.abs(ref - got).max(), rel=1e-12)
    cosine = ref @ got / np.linalg.norm(ref) / np.linalg.norm(got)
    assert output["cosine"] == pytest.approx(cosine, rel=1e-12)
    snr = 10 * np.log10((ref @ ref) / ((ref - got) @ (ref - got)))
    assert output["snr_db"] == pytest.approx(snr, rel=1e-9)
    assert doc["ok"] is None and doc["inputs_source"] == str(inputs)


def test_compare_min_cosine_fails_a_poor_candidate(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "t.int2.aimodel"
    args = ("--dtype", "int2", "--granularity", "tensor", "-o", out)
    assert coreopt("quantize", SAMPLES / "transformer.aimodel", *args).exit_code == 0
    result = coreopt("compare", SAMPLES / "transformer.aimodel", out, "--min-cosine", "0.999", "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["worst_cosine"] < 0.999
    human = coreopt("compare", SAMPLES / "transformer.aimodel", out, "--min-cosine", "0.999")
    assert human.exit_code == 1 and "below 0.999" in human.stdout


def test_compare_identical_models_is_exact(coreopt) -> None:  # type: ignore[no-untyped-def]
    doc = _json(coreopt("compare", SAMPLES / "cnn.aimodel", SAMPLES / "cnn.aimodel", "--json", "--seed", "7"))
    (output,) = doc["outputs"]
    assert output["max_abs_error"] == 0.0 and output["cosine"] == 1.0 and output["snr_db"] is None
    assert doc["inputs"] == [{"name": "x", "dtype": "float32", "shape": [1, 3, 32, 32]}]


def test_quantize_human_report(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    result = coreopt("quantize", SAMPLES / "mlp.aimodel", "--dtype", "mxfp4", "-o", tmp_path / "m.aimodel")
    assert result.exit_code == 0, result.stderr
    # MX FP4: 4 bits per element plus one 8-bit scale per 32 elements
    words = " ".join(result.stdout.split())  # the totals line wraps at the terminal's width
    for text in (
        "coreopt quantize",
        "f4E2M1FN",
        "Totals",
        "(7.52x)",
        "bits/weight 4.25 over the compressed weights",
    ):
        assert text in words, result.stdout


def test_quantize_default_output_and_no_overwrite(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    source = copy_sample("mlp", "aimodel", tmp_path)
    assert coreopt("quantize", source, "--dtype", "uint4").exit_code == 0
    default = tmp_path / "mlp.uint4.aimodel"
    assert default.is_dir()
    again = coreopt("quantize", source, "--dtype", "uint4")
    assert again.exit_code == 1 and "already exists" in again.stderr
    assert coreopt("quantize", source, "--dtype", "uint4", "--force").exit_code == 0


def test_quantize_with_nothing_eligible_fails_unless_allowed(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "same.aimodel"
    args = ("quantize", SAMPLES / "mlp.aimodel", "--threshold", "1000000", "-o", out)
    refused = coreopt(*args, "--json")
    assert refused.exit_code == 1 and not out.exists()
    assert json.loads(refused.stdout)["error"]["message"].endswith(
        "nothing was compressed (no eligible weight among 6 float tensors): no output written (--allow-empty "
        "writes it anyway)"
    )
    doc = _json(coreopt(*args, "--json", "--allow-empty"))
    assert doc["report"]["weights"] == [] and doc["report"]["warnings"]
    assert (
        doc["report"]["total_bytes_before"]
        == doc["report"]["total_bytes_after"]
        == doc["report"]["kept_bytes"]
    )
    human = coreopt(*args, "--allow-empty", "--force")
    assert human.exit_code == 0 and "warning: nothing was compressed" in human.stdout


def test_quantize_usage_errors_exit_2(coreopt) -> None:  # type: ignore[no-untyped-def]
    assert coreopt("quantize", SAMPLES / "mlp.aimodel", "--dtype", "int3").exit_code == 2
    assert coreopt("compare", SAMPLES / "mlp.aimodel").exit_code == 2


@pytest.mark.parametrize(
    ("candidate", "args", "message"),
    [
        ("transformer", (), "takes inputs"),
        ("mlp", ("--int-range", "5:5"), "is not LOW:HIGH"),
        ("mlp", ("--int-range", "zero:ten"), "is not LOW:HIGH"),
        ("mlp", ("--min-cosine", "1.5"), "is not in [-1, 1]"),
    ],
)
def test_compare_rejects_bad_requests(candidate: str, args: tuple[str, ...], message: str, coreopt) -> None:  # type: ignore[no-untyped-def]
    result = coreopt("compare", SAMPLES / "mlp.aimodel", SAMPLES / f"{candidate}.aimodel", *args)
    if args:  # an invalid option value: a usage error naming the flag
        assert (
            result.exit_code == 2 and args[0] in result.stderr and message in " ".join(result.stderr.split())
        )
    else:
        assert result.exit_code == 1, result.stdout
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        (
            {"y": np.zeros((4, 64), np.float32)},
            "has no tensor for input(s) x (the model takes x; the file holds y)",
        ),
        ({"x": np.zeros((2, 64), np.float32)}, "has shape [2, 64]; the model takes [4, 64]"),
    ],
)
def test_compare_rejects_bad_input_files(tensors: dict, message: str, tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    from safetensors.numpy import save_file

    path = tmp_path / "in.safetensors"
    save_file(tensors, str(path))
    result = coreopt("compare", SAMPLES / "mlp.aimodel", SAMPLES / "mlp.aimodel", "--inputs", path)
    assert result.exit_code == 1 and message in result.stderr and str(path) in result.stderr


def test_compare_integer_inputs_follow_int_range(coreopt) -> None:  # type: ignore[no-untyped-def]
    """Ids beyond the embedding table are an error the runtime may not catch: the range keeps them valid."""
    doc = _json(coreopt("compare", SAMPLES / "int_arith.aimodel", SAMPLES / "int_arith.aimodel",
                        "--int-range", "0:40", "--json"))  # fmt: skip
    assert doc["inputs"][0]["dtype"] == "int32"
    (rule,) = doc["input_policy"]
    assert (rule["draw"], rule["low"], rule["high"]) == ("range", 0, 40)
    assert rule["description"] == "integers in [0, 40) (the range given)"


def test_palettize_then_compare(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    source = copy_sample("transformer", "aimodel", tmp_path)
    digest = tree_digest(source)
    out = tmp_path / "t.lut4.aimodel"
    doc = _json(coreopt("palettize", source, "--nbits", "4", "--granularity", "channel", "-o", out, "--json"))
    assert tree_digest(source) == digest
    report = doc["report"]
    assert len(report["weights"]) == 9
    assert all(
        w["luts"] == w["shape"][0] and w["encoding"].startswith("ui4 LUT(16 x f32)")
        for w in report["weights"]
    )
    inspected = _json(coreopt("inspect", out, "--json"))
    stored = sorted((tuple(w["shape"]), w["nbytes"]) for w in inspected["weights"] if "LUT" in w["encoding"])
    assert stored == sorted((tuple(w["shape"]), w["bytes_after"]) for w in report["weights"])
    compared = _json(coreopt("compare", source, out, "--min-cosine", "0.99", "--json"))
    assert compared["ok"] is True


def test_palettize_options_and_errors(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    args = ("--nbits", "3", "--granularity", "grouped", "--group-size", "16", "--lut-dtype", "int8",
            "--per-channel-scale", "--fast", "-o", tmp_path / "m.aimodel")  # fmt: skip
    doc = _json(coreopt("palettize", SAMPLES / "mlp.aimodel", *args, "--json"))
    encodings = {w["encoding"] for w in doc["report"]["weights"]}
    assert encodings == {"ui3 LUT(8 x si8) x 8 LUTs + f32 scale per channel"}  # 128 channels / 16
    assert [s["reason"] for s in doc["report"]["skipped"] if s["kind"] == "layout"] == [
        "10 output channels are not a multiple of group_size 16 (lut_to_dense needs equal groups)"
    ]
    bad = coreopt("palettize", SAMPLES / "mlp.aimodel", "--nbits", "5", "-o", tmp_path / "x.aimodel")
    assert (
        bad.exit_code == 2
        and "--nbits must be one of" in bad.stderr
        and not (tmp_path / "x.aimodel").exists()
    )
    vector = coreopt("palettize", SAMPLES / "mlp.aimodel", "--cluster-dim", "2", "--granularity", "channel")
    assert vector.exit_code == 2 and "use per-tensor or grouped" in vector.stderr
    assert coreopt("palettize", SAMPLES / "mlp.aimodel", "--granularity", "block").exit_code == 2
