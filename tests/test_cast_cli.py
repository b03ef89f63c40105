"""`coreopt cast`: default output names, never the input, --json, --ignore-op, --inputs, failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _hostile import tree_digest
from conftest import copy_sample
from safetensors.torch import save_file

from coreai_opt._export._ops import coreai_decompositions
from coreai_opt.io import load_pt2, save_pt2


@pytest.mark.parametrize(("to", "suffix"), [("fp16", "fp16"), ("int16", "int16"), ("16bit", "16bit")])
def test_default_output_beside_the_input(to: str, suffix: str, tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    source = copy_sample("wide_range", "pt2", tmp_path)
    digest = tree_digest(source)
    result = coreopt("cast", source, "--to", to, "--json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    output = tmp_path / f"wide_range.{suffix}.pt2"
    assert document["output"] == str(output) and output.is_file()
    assert tree_digest(source) == digest  # the input is never modified
    program = load_pt2(output)
    fp16 = to in ("fp16", "16bit")
    assert (program.state_dict["fc.weight"].dtype == torch.float16) is fp16
    assert program.state_dict["offset"].dtype == torch.float32  # 1e6 overflows fp16
    assert document["check"]["ok"] is True
    # a second run refuses to overwrite without --force
    again = coreopt("cast", source, "--to", to)
    assert again.exit_code == 1 and "exists" in again.stderr
    assert coreopt("cast", source, "--to", to, "--force", "--no-check", "--json").exit_code == 0


def test_json_report_carries_dtypes_state_ops_and_check(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    source = copy_sample("wide_range", "pt2", tmp_path)
    result = coreopt("cast", source, "--to", "fp16", "-o", tmp_path / "out.pt2", "--json")
    document = json.loads(result.stdout)
    report = document["report"]
    assert {"name": "x", "kind": "input", "before": "float32", "after": "float16"} in report["io"]
    kept = [s for s in report["state"] if s["outcome"] == "kept fp32 (overflow)"]
    assert [(s["name"], s["max_abs"]) for s in kept] == [("offset", 1.0e6)]
    assert report["ops"]["kept fp32 (overflow)"] == {"aten.mul.Tensor": 1}
    assert report["state_bytes_after"] == report["state_bytes_before"] - (64 * 64 + 64) * 2
    assert report["casts_inserted"] == 2
    (output,) = document["check"]["outputs"]
    assert output["dtype_before"] == "float32" and output["dtype_after"] == "float16"
    assert output["cosine"] > 0.9999 and output["ok"]


def test_ignore_op_and_inputs_file(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    source = copy_sample("mlp", "pt2", tmp_path)
    inputs = tmp_path / "inputs.safetensors"
    save_file({"x": torch.randn(4, 64, generator=torch.Generator().manual_seed(2))}, str(inputs))
    out = tmp_path / "mlp.cast.pt2"
    result = coreopt(
        "cast",
        source,
        "--to",
        "fp16",
        "-o",
        out,
        "--ignore-op",
        "aten.gelu.default",
        "--inputs",
        inputs,
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["report"]["ops"]["kept fp32 (ignored op)"] == {"aten.gelu.default": 1}
    assert document["check"]["inputs"] == str(inputs)
    gelu = next(n for n in load_pt2(out).graph.nodes if n.target == torch.ops.aten.gelu.default)
    assert gelu.meta["val"].dtype == torch.float32


def test_rich_report_shows_dtype_changes(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    source = copy_sample("wide_range", "pt2", tmp_path)
    result = coreopt("cast", source, "--to", "16bit")
    assert result.exit_code == 0, result.stderr
    for text in ("float32 -> float16", "kept fp32 (overflow)", "offset (max 1e+06)", "now fp16", "verdict"):
        assert text in result.stdout, text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--inputs", "missing.safetensors"], "missing.safetensors"),
        (["-o", "out.aimodel"], ".pt2"),
    ],
)
def test_bad_arguments_fail_with_one_line(args: list[str], message: str, tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    source = copy_sample("mlp", "pt2", tmp_path)
    args = [str(tmp_path / a) if a.endswith((".safetensors", ".aimodel")) else a for a in args]
    result = coreopt("cast", source, *args)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.pt2"]


def test_inputs_file_without_the_input_names(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    source = copy_sample("mlp", "pt2", tmp_path)
    inputs = tmp_path / "inputs.safetensors"
    save_file({"y": torch.zeros(4, 64)}, str(inputs))
    result = coreopt("cast", source, "--inputs", inputs)
    assert result.exit_code == 1 and "has no tensor for input(s) x" in result.stderr
    assert not (tmp_path / "mlp.16bit.pt2").exists()


def test_never_writes_over_the_input(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    source = copy_sample("mlp", "pt2", tmp_path)
    digest = tree_digest(source)
    result = coreopt("cast", source, "-o", source, "--force")
    assert result.exit_code == 1 and tree_digest(source) == digest


def test_a_cast_that_fails_its_check_says_so_in_one_line_and_writes_nothing(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    class NotFinite(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 0 + float("nan")

    program = torch.export.export(NotFinite(), (torch.randn(2, 3),)).run_decompositions(
        coreai_decompositions()
    )
    source = save_pt2(program, tmp_path / "nan.pt2")
    result = coreopt("cast", source, "--to", "fp16", "-o", tmp_path / "out.pt2")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(source) in lines[0] and "fails its check" in lines[0]
    assert "--keep-failed" in lines[0] and not (tmp_path / "out.pt2").exists()
    kept = coreopt("cast", source, "--to", "fp16", "-o", tmp_path / "out.pt2", "--keep-failed")
    assert kept.exit_code == 1 and (tmp_path / "out.pt2").exists()


def test_the_state_table_names_a_few_tensors_per_outcome(
    tiny_llama, tmp_path: Path, coreopt, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A language model's 20-odd tensors: three named per outcome and a count of the rest, so the
    report stays a screen long at 80 columns (--json lists each)."""
    monkeypatch.setenv("COLUMNS", "80")
    result = coreopt("cast", tiny_llama["ref"], "--to", "fp16", "-o", tmp_path / "c.pt2", "--no-check")
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.replace("│", " ").split())
    assert "more" in text and "model.layers.1.mlp.up_proj.weight" not in text
    assert len(result.stdout.splitlines()) < 60
