"""Weight + activation quantization (W8A8): the seed's Quantizer flow, its numbers in PyTorch and on
the Core AI runtime, the observers, quantization-aware training, and `coreopt quantize --activations`."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SAMPLES, load_sample_builder
from safetensors.torch import save_file

from coreai_opt._agreement import agreement
from coreai_opt._export._ops import coreai_decompositions
from coreai_opt.comparison import compare_files
from coreai_opt.io import load_pt2, save_pt2
from coreai_opt.quantization import (
    ActivationConfig,
    Observer,
    OpConfig,
    QuantizerConfig,
)

BUILD = load_sample_builder()
SAMPLE = {s.name: s for s in BUILD.SAMPLES}


def _model(name: str) -> torch.nn.Module:
    return BUILD.make_model(SAMPLE[name])


def _inputs(name: str, seed: int) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(seed)
    return SAMPLE[name].example_inputs()


def _names(name: str) -> list[str]:
    from coreai_opt.inputs import exported_program_specs

    return [s.name for s in exported_program_specs(load_pt2(SAMPLES / f"{name}.pt2"))]


def _batch_file(name: str, seeds: range, path: Path) -> Path:
    """Samples with a leading sample axis, one tensor per input name."""
    samples = [_inputs(name, s) for s in seeds]
    save_file({n: torch.stack([x[i] for x in samples]) for i, n in enumerate(_names(name))}, str(path))
    return path


def _calibrated(name: str, config: QuantizerConfig | None = None, samples: int = 32):  # type: ignore[no-untyped-def]
    from coreai_opt.quantization import Quantizer

    model = _model(name)
    quantizer = Quantizer(model, config or QuantizerConfig())
    prepared = quantizer.prepare(_inputs(name, 0))
    with quantizer.calibration_mode():
        for seed in range(100, 100 + samples):
            prepared(*_inputs(name, seed))
    return model, quantizer, prepared


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_the_seeds_compressed_model_flow_word_for_word(name: str, tmp_path: Path) -> None:
    """The casting seed's "Casting a compressed model" example, with a sample model and inputs."""
    model = _model(name)
    example_input = _inputs(name, 0)
    calibration = [_inputs(name, seed) for seed in range(100, 116)]

    # --- the seed's example (the model and inputs above are ours) ---
    from coreai_opt import ExportBackend
    from coreai_opt.casting import cast_to_16_bit_precision
    from coreai_opt.quantization import Quantizer, QuantizerConfig

    # 1. Quantize weights and activations to INT8 and finalize for the Core AI backend.
    config = QuantizerConfig()
    quantizer = Quantizer(model, config)
    prepared_model = quantizer.prepare(example_input)

    with quantizer.calibration_mode():
        for batch in calibration:  # forward passes for calibration
            prepared_model(*batch)

    finalized_model = quantizer.finalize(backend=ExportBackend.CoreAI)

    # 2. Export with coreai_torch decompositions
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import coreai_torch

    exported_program = torch.export.export(finalized_model, example_input).run_decompositions(
        coreai_torch.get_decomp_table()
    )
    save_pt2(exported_program, tmp_path / "final.pt2")  # the finalized export, before casting

    # 3. Cast remaining FP32/INT32 portions of the graph. Int8 quantized buffers are preserved.
    codes = {
        k: v.dtype for k, v in exported_program.state_dict.items() if v.dtype in (torch.int8, torch.uint8)
    }
    cast_to_16_bit_precision(exported_program)
    save_pt2(exported_program, tmp_path / "cast.pt2")

    # 4. Convert to a deployable format.
    converter = coreai_torch.TorchConverter()
    converter.add_exported_program(exported_program)
    ai_program = converter.to_coreai()
    assert not hasattr(ai_program, "optimize")  # the seed's ai_program.optimize(): not in coreai 1.0.0b3
    ai_program.save_asset(tmp_path / "model.aimodel")
    # --- end of the seed's example ---

    assert codes and {k: exported_program.state_dict[k].dtype for k in codes} == codes
    floats = [v.dtype for v in exported_program.state_dict.values() if v.is_floating_point()]
    assert floats and set(floats) == {torch.float16}  # activation scales and weight scales too
    targets = [str(n.target) for n in exported_program.graph.nodes if n.op == "call_function"]
    assert targets.count("coreai.quantize.default") == len(quantizer.report.activations) > 0
    assert targets.count("coreai.dequantize.default") == len(quantizer.report.activations)

    held_out = _batch_file(name, range(1000, 1016), tmp_path / "held_out.safetensors")
    reference = SAMPLES / f"{name}.pt2"  # the same seeded model in fp32
    in_torch = compare_files(reference, tmp_path / "final.pt2", inputs=held_out)
    on_runtime = compare_files(reference, tmp_path / "model.aimodel", inputs=held_out)
    runtime_vs_torch = compare_files(tmp_path / "cast.pt2", tmp_path / "model.aimodel", inputs=held_out)
    assert len(in_torch.samples) == 16
    assert in_torch.worst_cosine >= 0.99, in_torch.worst_cosine  # type: ignore[operator]
    assert on_runtime.worst_cosine >= 0.99, on_runtime.worst_cosine  # type: ignore[operator]
    assert runtime_vs_torch.worst_cosine >= 0.999, runtime_vs_torch.worst_cosine  # type: ignore[operator]
    shown = json.loads(_inspect(tmp_path / "model.aimodel"))
    assert shown["ops"].get("coreai.quantize", 0) > 0 and shown["ops"].get("coreai.dequantize", 0) > 0


def _inspect(path: Path) -> str:
    from typer.testing import CliRunner

    from cli.coreopt_app import app

    result = CliRunner().invoke(app, ["inspect", str(path), "--json"])
    assert result.exit_code == 0, result.stderr
    return result.stdout


def test_prepared_model_equals_finalized_model_bit_for_bit() -> None:
    """Fake quantization computes exactly what coreai-torch's ops and the weight encoding decode."""
    _, quantizer, prepared = _calibrated("transformer")
    final = quantizer.finalize()
    for seed in (7, 8):
        x = _inputs("transformer", seed)
        with torch.no_grad():
            assert torch.equal(prepared(*x), final(*x))
    report = quantizer.report
    assert len(report.weights.weights) == 9  # every linear weight, however small
    assert all(w.encoding == "si8 + f32 scale per channel" for w in report.weights.weights)


def test_a_programs_quantizer_prepares_its_module_and_finalizes_the_program() -> None:
    """Quantizer.of_program: prepare takes the program's module (unlifted once), finalize_program
    edits and returns the program itself; its module runs as prepared did, bit for bit."""
    from coreai_opt.quantization import Quantizer

    program = torch.export.export(_model("cnn"), _inputs("cnn", 0)).run_decompositions(
        coreai_decompositions()
    )
    quantizer = Quantizer.of_program(program)
    prepared = quantizer.prepare(_inputs("cnn", 0))
    assert prepared is quantizer.model  # the module of_program made: no second unlift
    with quantizer.calibration_mode():
        for seed in range(100, 108):
            prepared(*_inputs("cnn", seed))
    assert quantizer.finalize_program() is program
    final = program.module()
    for seed in (7, 8):
        with torch.no_grad():
            assert torch.equal(prepared(*_inputs("cnn", seed)), final(*_inputs("cnn", seed)))
    assert quantizer.report is not None and len(quantizer.report.weights.weights) > 0


def test_one_quantizer_for_a_value_several_ops_read() -> None:
    """Separate q/k/v projections read the same codes; q @ k^T quantizes both operands."""
    from coreai_opt.quantization import Quantizer

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(16, 16) for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scores = (self.q(x) @ self.k(x).transpose(-1, -2)).softmax(-1)
            return scores @ self.v(x)

    quantizer = Quantizer(Attention())
    prepared = quantizer.prepare((torch.randn(2, 8, 16),))
    with quantizer.calibration_mode():
        prepared(torch.randn(2, 8, 16))
    quantizer.finalize()
    by_value = {a.name: a.consumers for a in quantizer.report.activations}
    assert sorted(by_value["x"]) == ["linear", "linear_1", "linear_2"]
    assert len(by_value) == 5  # x, q, k^T, the softmax and v


def test_activation_parameters_follow_the_scale_rule() -> None:
    """Golden: int8 asymmetric [-1, 3] -> scale 4/255 in fp32, zero point round(1/scale) - 128;
    symmetric -> amax/127, no zero point; uint8 symmetric carries 128."""
    from coreai_opt.quantization._observers import qparams_of

    lo, hi = torch.tensor([-1.0]), torch.tensor([3.0])
    scale, zero = qparams_of(lo, hi, ActivationConfig())
    assert scale.item() == np.float32(np.float32(4.0) / np.float32(255.0))
    assert zero.item() == round(1 / scale.item()) - 128 == -64
    scale, zero = qparams_of(lo, hi, ActivationConfig(qscheme="sym"))
    assert scale.item() == np.float32(np.float32(3.0) / np.float32(127.0)) and zero.item() == 0
    _, zero = qparams_of(lo, hi, ActivationConfig(dtype="uint8", qscheme="sym"))
    assert zero.item() == 128
    # a range without zero is widened to hold it: zero stays exact
    scale, zero = qparams_of(torch.tensor([0.5]), torch.tensor([2.0]), ActivationConfig())
    assert zero.item() == -128 and scale.item() == np.float32(np.float32(2.0) / np.float32(255.0))


def test_observers_see_what_they_should() -> None:
    from coreai_opt.quantization._observers import RangeObserver

    data = torch.randn(4, 5000, generator=torch.Generator().manual_seed(3))
    data[2, 17] = 30.0  # one outlier
    ranges = {}
    for kind in Observer:
        observer = RangeObserver(ActivationConfig(observer=kind))
        for row in data:
            observer.update(row)
        ranges[kind] = observer.range()
    assert ranges[Observer.MINMAX] == (data.min().item(), data.max().item())
    lo, hi = ranges[Observer.PERCENTILE]  # the outlier is clipped, the bulk kept
    assert 3.0 < hi < 5.0 and -5.0 < lo < -3.0
    first = (data[0].min().item(), data[0].max().item())
    c = 0.01
    expected = list(first)
    for row in data[1:]:
        expected = [
            expected[0] + c * (row.min().item() - expected[0]),
            expected[1] + c * (row.max().item() - expected[1]),
        ]
    assert ranges[Observer.MOVING_AVERAGE] == pytest.approx(tuple(expected), rel=1e-12)
    mse_lo, mse_hi = ranges[Observer.MSE]
    assert data.min().item() <= mse_lo < 0 < mse_hi <= data.max().item()
    with pytest.raises(ValueError, match="NaN or Inf"):
        RangeObserver(ActivationConfig()).update(torch.tensor([1.0, math.nan]))


@pytest.mark.parametrize(("name", "samples", "mse_ranges_kept"), [("cnn", 32, 0), ("transformer", 16, 2)])
def test_mse_observer_is_never_worse_than_min_max(name: str, samples: int, mse_ranges_kept: int) -> None:
    """Mean output SNR over 16 held-out samples: MSE >= min-max (calibrated on 32 samples, 16 for
    the transformer, whose output check costs a pass per candidate range). An activation keeps its MSE range
    only where that brings the calibration batches' output closer to the float model's; on the CNN
    none does (the result is min-max's, bit for bit), on the transformer two do."""
    snrs, outputs, ranges = {}, {}, {}
    for kind in (Observer.MINMAX, Observer.MSE):
        model, quantizer, _ = _calibrated(name, QuantizerConfig.w8a8(kind), samples)
        final = quantizer.finalize()
        values, outputs[kind] = [], []
        with torch.no_grad():
            for seed in range(2000, 2016):
                x = _inputs(name, seed)
                outputs[kind].append(final(*x))
                values.append(agreement(model(*x).numpy(), outputs[kind][-1].numpy()).snr_db)
        snrs[kind] = float(np.mean(values))
        ranges[kind] = [(a.qparams.lo, a.qparams.hi) for a in quantizer.report.activations]
    assert (
        sum(a != b for a, b in zip(ranges[Observer.MINMAX], ranges[Observer.MSE], strict=True))
        == mse_ranges_kept
    )
    if mse_ranges_kept:
        assert snrs[Observer.MSE] > snrs[Observer.MINMAX], snrs
    else:
        assert all(
            torch.equal(a, b) for a, b in zip(outputs[Observer.MINMAX], outputs[Observer.MSE], strict=True)
        )


def test_output_check_compares_with_the_float_model() -> None:
    """The reference outputs of the MSE output check are the float model's, bit for bit."""
    model, quantizer, _ = _calibrated("cnn", QuantizerConfig.w8a8(Observer.MSE))
    x = _inputs("cnn", 7)
    ((reference,), signal) = quantizer._float_outputs([(x, {})])[0]
    with torch.no_grad():
        assert torch.equal(reference, model(*x))
        assert signal == float((reference.double() ** 2).sum())
        assert not torch.equal(reference, quantizer.prepared(*x))  # quantizers are back on


def test_quantization_aware_training_lowers_the_loss() -> None:
    """Five SGD steps on a prepared (calibrated) model lower its loss on a fixed batch; gradients
    reach the weights through the fake quantization."""
    _, quantizer, prepared = _calibrated("cnn")
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    target = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(6))
    params = [p for p in prepared.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.05)
    losses = []
    for _ in range(6):
        optimizer.zero_grad()
        logits = torch.cat([prepared(image[None]) for image in x])  # exported for one image at a time
        loss = torch.nn.functional.cross_entropy(logits, target)
        loss.backward()
        losses.append(loss.item())
        assert all(p.grad is not None for p in params)
        assert prepared.get_parameter("conv1.weight").grad.abs().sum() > 0  # type: ignore[union-attr]
        optimizer.step()
    assert losses[-1] < losses[0], losses
    final = quantizer.finalize()  # the trained weights are what gets encoded
    with torch.no_grad():
        assert torch.equal(prepared(x[:1]), final(x[:1]))


def test_module_and_op_type_configs_leave_ops_in_float() -> None:
    config = QuantizerConfig(
        module_name_configs={"head": None},
        op_type_configs={"conv": OpConfig(activations=ActivationConfig(observer="percentile"))},
    )
    _, quantizer, _ = _calibrated("cnn", config)
    quantizer.finalize()
    report = quantizer.report
    assert [w.name for w in report.weights.weights] == ["conv1.weight", "conv2.weight"]
    assert {a.observer for a in report.activations} == {"percentile"} and len(report.activations) == 2
    assert len(report.float_ops) == 1
    with pytest.raises(ValueError, match="unknown OpType"):
        QuantizerConfig(op_type_configs={"lstm": None})


def test_finalize_before_calibration_and_nothing_to_quantize_are_errors() -> None:
    from coreai_opt.quantization import NotCalibrated, NothingToQuantize, Quantizer

    quantizer = Quantizer(_model("mlp"))
    quantizer.prepare((torch.randn(4, 64),))
    with pytest.raises(NotCalibrated, match="calibration_mode"):
        quantizer.finalize()

    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 + 1

    with pytest.raises(NothingToQuantize, match="no linear, convolution or matrix-product op"):
        Quantizer(Scale()).prepare((torch.randn(3),))


def test_the_callers_model_is_never_changed() -> None:
    model, _, prepared = _calibrated("mlp")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.optim.SGD(prepared.parameters(), lr=1.0).zero_grad()
    out = prepared(torch.randn(4, 64)).sum()
    out.backward()
    for p in prepared.parameters():
        p.data.add_(1.0)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


# ----- the command line ---------------------------------------------------------------------------


def test_cli_quantizes_activations_on_calibration_samples(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    samples = _batch_file("transformer", range(100, 108), tmp_path / "calibration.safetensors")
    out = tmp_path / "t.w8a8.pt2"
    result = coreopt(
        "quantize",
        SAMPLES / "transformer.pt2",
        "--activations",
        "int8",
        "--calibration",
        samples,
        "--observer",
        "percentile",
        "-o",
        out,
        "--json",
    )  # fmt: skip (mse: its own tests)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["calibration"] == {"source": str(samples), "samples": 8}
    acts = doc["report"]["activations"]
    assert acts and all(a["observer"] == "percentile" and a["dtype"] == "int8" for a in acts)
    assert all(
        a["scale"] > 0 and a["range"][0] <= 0 <= a["range"][1] and -128 <= a["zero_point"] <= 127
        for a in acts
    )
    assert len(doc["report"]["weights"]["weights"]) == 9
    held_out = _batch_file("transformer", range(1000, 1016), tmp_path / "held_out.safetensors")
    compared = compare_files(SAMPLES / "transformer.pt2", out, inputs=held_out)
    assert compared.worst_cosine >= 0.99  # type: ignore[operator]
    human = coreopt("quantize", SAMPLES / "cnn.pt2", "--activations", "int8", "--calibration", "random",
                    "-o", tmp_path / "c.pt2")  # fmt: skip
    assert human.exit_code == 0, human.stderr
    assert "Activations" in human.stdout and "seeded random (seeds 0..31)" in human.stdout


def test_cli_refuses_activations_without_calibration(coreopt, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    counted = coreopt("quantize", SAMPLES / "cnn.pt2", "--activations", "int8", "--calibration", SAMPLES / "cnn.pt2",
                      "--calibration-samples", "4", "-o", tmp_path / "x.pt2")  # fmt: skip
    assert counted.exit_code == 2 and "counts the draws of" in " ".join(counted.stderr.split()), (
        counted.stderr
    )
    result = coreopt("quantize", SAMPLES / "cnn.pt2", "--activations", "int8", "-o", tmp_path / "x.pt2")
    assert result.exit_code == 2 and "--calibration random" in result.stderr
    assert not (tmp_path / "x.pt2").exists()


@pytest.mark.parametrize("case", ["names", "shape", "dtype", "empty", "nan", "no-op", "aimodel"])
def test_cli_bad_calibration_is_a_one_line_error(case: str, tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    model, data = SAMPLES / "cnn.pt2", tmp_path / "cal.safetensors"
    if case == "names":
        save_file({"y": torch.randn(2, 1, 3, 32, 32)}, str(data))
    elif case == "shape":
        save_file({"x": torch.randn(2, 1, 3, 16, 16)}, str(data))
    elif case == "dtype":
        model = SAMPLES / "transformer.pt2"
        save_file(
            {"input_ids": torch.randn(1, 16), "attention_mask": torch.ones(1, 16, dtype=torch.int64)},
            str(data),
        )
    elif case == "empty":
        data = tmp_path / "nothing"
        data.mkdir()
    elif case == "nan":
        x = torch.randn(3, 1, 3, 32, 32)
        x[1, 0, 0, 0, 0] = math.nan
        save_file({"x": x}, str(data))
    elif case == "no-op":

        class Scale(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x * 2 + 1

        model = tmp_path / "scale.pt2"
        save_pt2(
            torch.export.export(Scale(), (torch.randn(4),)).run_decompositions(coreai_decompositions()), model
        )
        save_file({"x": torch.randn(4)}, str(data))
    else:
        model = SAMPLES / "cnn.aimodel"
        save_file({"x": torch.randn(1, 3, 32, 32)}, str(data))
    out = tmp_path / "out.pt2"
    result = coreopt("quantize", model, "--activations", "int8", "--calibration", data, "-o", out)
    assert result.exit_code == 1, result.stdout
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    expected = {"names": "has no tensor for input(s) x", "shape": "has shape [2, 1, 3, 16, 16]",
                "dtype": "the model takes integers", "empty": "holds no .safetensors files",
                "nan": "sample cal.safetensors[1]: input x holds NaN or Inf",
                "no-op": "no linear, convolution or matrix-product op", "aimodel": ".pt2"}[case]  # fmt: skip
    assert expected in result.stderr, result.stderr
    assert not out.exists()
