"""The `tcast` CLI: inspect, list, cast and upcast of safetensors files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import tcast


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    generator = torch.Generator().manual_seed(0)
    path = tmp_path / "w.safetensors"
    tensors = {
        "layer.weight": torch.randn(48, 80, generator=generator),
        "layer.bias": torch.randn(80, generator=generator).to(torch.bfloat16),
        "steps": torch.arange(4),
    }
    save_file(tensors, str(path))
    return path


def test_inspect_json_lists_every_code(tcast_cli) -> None:  # type: ignore[no-untyped-def]
    result = tcast_cli("inspect", "float8_e4m3fnuz", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    element = doc["element"]
    assert element["code"] == "e4m3b8fnuz" and element["bias"] == 8 and element["max"] == 240.0
    codes = doc["codes"]
    assert len(codes) == 256
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fnuz).float()
    for entry, value in zip(codes, values.tolist(), strict=True):
        assert (math.isnan(entry["value"]) and math.isnan(value)) or entry["value"] == value
    assert [c["kind"] for c in codes].count("nan") == 1 and codes[128]["kind"] == "nan"
    assert sum(c["kind"] == "subnormal" for c in codes) == 14


def test_inspect_scaled_type_shows_bits_per_value(tcast_cli) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(tcast_cli("inspect", "mxfp4", "--json").stdout)
    assert doc["name"] == "mxfp4e2" and doc["bits_per_value"] == 4.25 and len(doc["codes"]) == 16
    assert "e5m2b16fnuz" in tcast_cli("inspect", "float8_e5m2fnuz").stdout


def test_list_filter(tcast_cli) -> None:  # type: ignore[no-untyped-def]
    rows = json.loads(tcast_cli("list", "--filter", "mx", "--json").stdout)
    names = {r["name"] for r in rows}
    assert names == {n for n in tcast.PREDEFINED if "mx" in n.lower()}
    assert {"mxfp8e5", "mxfp8e4", "mxfp6e3", "mxfp6e2", "mxfp4e2", "mxint8", "mxint4", "mx9"} <= names
    everything = json.loads(tcast_cli("list", "--json").stdout)
    assert len(everything) == len(tcast.PREDEFINED)


def test_virtual_cast_file(weights: Path, tmp_path: Path, tcast_cli) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "v.safetensors"
    result = tcast_cli("cast", weights, "--dtype", "mxfp6e2", "-o", out, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["cast"] == 2
    original, cast = load_file(str(weights)), load_file(str(out))
    assert torch.equal(cast["layer.weight"], tcast.cast(original["layer.weight"], "mxfp6e2"))
    assert cast["layer.bias"].dtype == torch.bfloat16
    assert torch.equal(cast["steps"], original["steps"])
    row = next(t for t in doc["tensors"] if t["name"] == "layer.weight")
    err = cast["layer.weight"].double() - original["layer.weight"].double()
    expected = 10 * math.log10(float((original["layer.weight"].double() ** 2).sum() / (err**2).sum()))
    assert row["sqnr_db"] == pytest.approx(expected, abs=1e-5)  # energies sum float32 squares
    assert row["max_abs_error"] == pytest.approx(float(err.abs().max()))


def test_actual_cast_then_upcast_restores_the_virtual_values(
    weights: Path, tmp_path: Path, tcast_cli
) -> None:  # type: ignore[no-untyped-def]
    packed, restored = tmp_path / "p.safetensors", tmp_path / "r.safetensors"
    assert (
        tcast_cli(
            "cast", weights, "--dtype", "mxfp4e2", "-o", packed, "--mode", "actual", "--only", "weight"
        ).exit_code
        == 0
    )
    stored = load_file(str(packed))
    assert stored["layer.weight.codes"].dtype == torch.uint8
    assert stored["layer.weight.codes"].numel() == 48 * 96 // 2  # 80 padded to 96, two codes a byte
    assert "layer.bias" in stored  # not matched by --only: copied as it was
    assert tcast_cli("upcast", packed, "-o", restored).exit_code == 0
    back = load_file(str(restored))
    original = load_file(str(weights))
    assert torch.equal(back["layer.weight"], tcast.cast(original["layer.weight"], "mxfp4e2"))
    assert torch.equal(back["layer.bias"], original["layer.bias"])


@pytest.mark.parametrize(
    "args, problem",
    [
        (["cast", "{missing}", "--dtype", "mxfp4", "-o", "{out}"], "no such file"),
        (["cast", "{garbage}", "--dtype", "mxfp4", "-o", "{out}"], "not a readable safetensors file"),
        (["cast", "{weights}", "--dtype", "mxfp4", "-o", "{weights}"], "onto the input"),
        (["upcast", "{weights}", "-o", "{out}"], "no tcast metadata"),
    ],
)
def test_bad_input_is_one_line(
    args: list[str], problem: str, weights: Path, tmp_path: Path, tcast_cli
) -> None:  # type: ignore[no-untyped-def]
    garbage = tmp_path / "g.safetensors"
    garbage.write_bytes(b"\xff" * 40)
    paths = {
        "missing": tmp_path / "none.safetensors",
        "garbage": garbage,
        "out": tmp_path / "o.safetensors",
        "weights": weights,
    }
    before = weights.read_bytes()
    result = tcast_cli(*[a.format(**paths) for a in args])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0]
    assert not (tmp_path / "o.safetensors").exists()
    assert weights.read_bytes() == before


def test_import_tcast_and_its_cli_load_no_torch() -> None:
    """`import tcast`, `tcast --help` and `tcast list` never pay for importing torch."""
    import subprocess
    import sys

    script = (
        "import sys, tcast, cli.tcast_app; from typer.testing import CliRunner;"
        "r = CliRunner().invoke(cli.tcast_app.app, ['list']); assert r.exit_code == 0, r.output;"
        "assert 'mxfp4e2' in r.output; assert tcast.mxfp4e2.nspec.bits == 4;"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "False"
