"""`compare` over several samples: files with a sample axis, directories of files, seeded draws.

Every number is checked against single-sample comparisons of the same data: the reported metric
is the worst sample's, the mean is the mean of the per-sample values, and the worst sample is named.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLES, run_aimodel
from safetensors.numpy import save_file

from coreai_opt._agreement import Agreement, agreement, mean_of, worst_of
from coreai_opt.comparison import compare_files
from coreai_opt.compression import PalettizeConfig, QuantizeConfig, compress_
from coreai_opt.io import load_pt2, save_pt2


def _pt2_candidate(tmp_path: Path, name: str, config: object) -> Path:
    program = load_pt2(SAMPLES / f"{name}.pt2")
    compress_(program, config)  # type: ignore[arg-type]
    path = tmp_path / f"{name}.candidate.pt2"
    save_pt2(program, path)
    return path


@pytest.fixture(scope="module")
def mlp_samples() -> np.ndarray:
    return np.random.default_rng(11).standard_normal((6, 4, 64)).astype(np.float32)


def test_worst_of_takes_each_metric_at_its_worst() -> None:
    a = agreement(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.5]))
    b = agreement(np.array([1.0, -1.0]), np.array([0.5, -1.0]))
    exact = agreement(np.array([4.0]), np.array([4.0]))
    worst = worst_of([a, b, exact])
    assert worst.positions == 6 and worst.finite == 6
    assert worst.max_abs_error == 0.5 and worst.relative_error == max(a.relative_error, b.relative_error)  # type: ignore[type-var]
    assert worst.cosine == min(a.cosine, b.cosine)  # type: ignore[type-var]
    assert worst.snr_db == min(a.snr_db, b.snr_db)  # type: ignore[type-var]
    assert mean_of([a.cosine, b.cosine, exact.cosine]) == pytest.approx((a.cosine + b.cosine + 1.0) / 3)  # type: ignore[operator]
    assert mean_of([a.snr_db, exact.snr_db]) == math.inf and exact.snr_db == math.inf
    # a sample that measured nothing leaves the combined metric unmeasured and failing
    nothing = agreement(np.array([np.nan]), np.array([np.nan]))
    combined = worst_of([a, nothing])
    assert combined.cosine is None and not combined.passes(-1.0) and mean_of([a.cosine, None]) is None


def _single(reference: Path, candidate: Path, x: np.ndarray, tmp_path: Path, name: str) -> Agreement:
    path = tmp_path / f"{name}.safetensors"
    save_file({"x": x}, str(path))
    (output,) = compare_files(reference, candidate, inputs=path).outputs
    return output.metrics


def test_a_file_with_a_sample_axis_reports_worst_and_mean_of_its_samples(
    tmp_path: Path, mlp_samples: np.ndarray
) -> None:
    candidate = _pt2_candidate(tmp_path, "mlp", QuantizeConfig(dtype="int4"))
    batch = tmp_path / "batch.safetensors"
    save_file({"x": mlp_samples}, str(batch))
    result = compare_files(SAMPLES / "mlp.pt2", candidate, inputs=batch, min_cosine=0.9)
    (output,) = result.outputs
    each = [_single(SAMPLES / "mlp.pt2", candidate, x, tmp_path, f"s{i}") for i, x in enumerate(mlp_samples)]
    assert result.samples == [f"batch.safetensors[{i}]" for i in range(6)]
    assert output.metrics == worst_of(each)
    cosines = [m.cosine for m in each]
    assert output.spread.count == 6
    assert output.spread.cosine_mean == pytest.approx(np.mean(cosines), rel=1e-12)
    assert output.spread.snr_db_mean == pytest.approx(np.mean([m.snr_db for m in each]), rel=1e-12)
    assert output.spread.worst == f"batch.safetensors[{int(np.argmin(cosines))}]"
    assert len(set(cosines)) == 6  # the samples really differ
    assert result.ok is True and result.worst_cosine == min(cosines)  # type: ignore[type-var]


def test_a_directory_of_files_is_the_same_samples_in_name_order(
    tmp_path: Path, mlp_samples: np.ndarray
) -> None:
    candidate = _pt2_candidate(tmp_path, "mlp", PalettizeConfig(n_bits=2))
    batch = tmp_path / "batch.safetensors"
    save_file({"x": mlp_samples}, str(batch))
    folder = tmp_path / "samples"
    folder.mkdir()
    save_file({"x": mlp_samples[:2]}, str(folder / "a.safetensors"))  # two samples along an axis
    for i in range(2, 6):
        save_file({"x": mlp_samples[i]}, str(folder / f"b{i}.safetensors"))  # one sample each
    (folder / "notes.txt").write_text("not a sample")
    by_file = compare_files(SAMPLES / "mlp.pt2", candidate, inputs=batch)
    by_folder = compare_files(SAMPLES / "mlp.pt2", candidate, inputs=folder)
    assert by_folder.samples == ["a.safetensors[0]", "a.safetensors[1]"] + [
        f"b{i}.safetensors" for i in range(2, 6)
    ]
    assert by_folder.outputs[0].metrics == by_file.outputs[0].metrics
    assert by_folder.outputs[0].spread.cosine_mean == by_file.outputs[0].spread.cosine_mean


def test_samples_run_on_the_core_ai_runtime_give_the_runtime_numbers(
    tmp_path: Path, mlp_samples: np.ndarray, coreopt
) -> None:  # type: ignore[no-untyped-def]
    candidate = tmp_path / "mlp.int4.aimodel"
    assert coreopt("quantize", SAMPLES / "mlp.aimodel", "--dtype", "int4", "-o", candidate).exit_code == 0
    batch = tmp_path / "batch.safetensors"
    save_file({"x": mlp_samples[:3]}, str(batch))
    result = coreopt("compare", SAMPLES / "mlp.aimodel", candidate, "--inputs", batch, "--json")
    assert result.exit_code == 0, result.stderr
    (output,) = json.loads(result.stdout)["outputs"]
    each = []
    for x in mlp_samples[:3]:
        ref = next(iter(run_aimodel(SAMPLES / "mlp.aimodel", {"x": x}).values()))
        got = next(iter(run_aimodel(candidate, {"x": x}).values()))
        each.append(agreement(ref, got))
    assert output["samples"] == 3
    assert output["cosine"] == pytest.approx(min(m.cosine for m in each), rel=1e-12)  # type: ignore[type-var]
    assert output["max_abs_error"] == pytest.approx(max(m.max_abs_error for m in each), rel=1e-12)  # type: ignore[type-var]
    assert output["cosine_mean"] == pytest.approx(np.mean([m.cosine for m in each]), rel=1e-12)


def test_seeded_samples_are_the_single_seed_draws(tmp_path: Path) -> None:
    candidate = _pt2_candidate(tmp_path, "transformer", QuantizeConfig(dtype="int4"))
    several = compare_files(SAMPLES / "transformer.pt2", candidate, samples=3, seed=5)
    each = [
        compare_files(SAMPLES / "transformer.pt2", candidate, seed=s).outputs[0].metrics for s in (5, 6, 7)
    ]
    assert several.samples == ["seed 5", "seed 6", "seed 7"]
    assert several.inputs_source == "seeded random (seeds 5..7)"
    assert several.outputs[0].metrics == worst_of(each)


def test_the_human_report_shows_the_spread(tmp_path: Path, mlp_samples: np.ndarray, coreopt) -> None:  # type: ignore[no-untyped-def]
    batch = tmp_path / "batch.safetensors"
    save_file({"x": mlp_samples}, str(batch))
    result = coreopt("compare", SAMPLES / "mlp.pt2", SAMPLES / "mlp.aimodel", "--inputs", batch)
    assert result.exit_code == 0, result.stderr
    for text in ("worst of 6 samples", "Over 6 samples", "mean cosine", "batch.safetensors["):
        assert text in result.stdout, result.stdout


def test_n_samples_along_a_batch_dim_of_one_are_n_samples(tmp_path: Path) -> None:
    """A CNN that takes [1, 3, H, W] reads a [N, 3, H, W] file as N samples, the same as
    [N, 1, 3, H, W] (the way people save a batch), in compare and in every calibration."""
    from coreai_opt.calibration import Samples
    from coreai_opt.inputs import exported_program_specs

    program = load_pt2(SAMPLES / "cnn.pt2")
    (spec,) = exported_program_specs(program)
    assert spec.shape[0] == 1
    data = np.random.default_rng(5).standard_normal((4, *spec.shape[1:])).astype(np.float32)
    along = tmp_path / "along.safetensors"
    extra = tmp_path / "extra.safetensors"
    save_file({spec.name: data}, str(along))
    save_file({spec.name: data[:, None]}, str(extra))
    candidate = _pt2_candidate(tmp_path, "cnn", QuantizeConfig(dtype="int4"))
    by_batch = compare_files(SAMPLES / "cnn.pt2", candidate, inputs=along)
    by_axis = compare_files(SAMPLES / "cnn.pt2", candidate, inputs=extra)
    assert by_batch.samples == [f"along.safetensors[{i}]" for i in range(4)]
    assert by_batch.outputs[0].metrics == by_axis.outputs[0].metrics
    assert by_batch.outputs[0].spread.cosine_mean == by_axis.outputs[0].spread.cosine_mean
    drawn = list(Samples.of(along).inputs(program))
    assert len(drawn) == 4
    for i, (_, (x,)) in enumerate(drawn):
        assert x.shape == spec.shape and np.array_equal(x.numpy(), data[i : i + 1])


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("empty-dir", "holds no .safetensors files"),
        ("zero-samples", "holds no samples"),
        ("bad-shape", "has shape [3, 4, 32]; the model takes [4, 64] (or [N, 4, 64] for N samples)"),
        ("bad-batch", "the model takes [1, 16] (or [N, 1, 16] or [N, 16] for N samples)"),
        ("float-ids", "is F32; the model takes integers"),
        ("disagree", "tensors disagree on the number of samples"),
        ("not-safetensors", "not a readable safetensors file"),
    ],
)
def test_bad_sample_files_are_one_line_errors(layout: str, message: str, tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    model = "mlp"
    path = tmp_path / "in.safetensors"
    if layout == "empty-dir":
        path = tmp_path / "empty"
        path.mkdir()
    elif layout == "zero-samples":
        save_file({"x": np.zeros((0, 4, 64), np.float32)}, str(path))
    elif layout == "bad-shape":
        save_file({"x": np.zeros((3, 4, 32), np.float32)}, str(path))
    elif layout == "bad-batch":
        model = "transformer"
        save_file(
            {"input_ids": np.zeros((3, 8), np.int64), "attention_mask": np.ones((3, 16), np.int64)}, str(path)
        )
    elif layout == "not-safetensors":
        path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{bad}")
    else:
        model = "transformer"
        ids = np.zeros((2, 1, 16), np.float32 if layout == "float-ids" else np.int64)
        mask = np.ones((1, 16) if layout == "disagree" else (2, 1, 16), np.int64)
        save_file({"input_ids": ids, "attention_mask": mask}, str(path))
    result = coreopt("compare", SAMPLES / f"{model}.pt2", SAMPLES / f"{model}.pt2", "--inputs", path)
    assert result.exit_code == 1, result.stdout
    assert message in result.stderr and str(path) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_inputs_and_samples_together_are_a_usage_error(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    result = coreopt(
        "compare", SAMPLES / "mlp.pt2", SAMPLES / "mlp.pt2", "--inputs", tmp_path, "--samples", "3"
    )
    assert result.exit_code == 2
    assert coreopt("compare", SAMPLES / "mlp.pt2", SAMPLES / "mlp.pt2", "--samples", "0").exit_code == 2
