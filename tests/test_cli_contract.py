"""The contract of both CLIs: invalid option values exit 2 naming the flag; with --json every failure
prints a JSON error object on stdout; errors about paths come before torch loads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import CLI_APPS, ROOT, SAMPLES, cli_runs_in_one_child

MLP = str(SAMPLES / "mlp.aimodel")

# (arguments, the flag the error must name, a library parameter name it must not say)
INVALID_VALUES = [
    (["coreopt", "palettize", MLP, "--nbits", "5"], "--nbits", "n_bits"),
    (["coreopt", "palettize", MLP, "--group-size", "0", "--granularity", "grouped"], "--group-size", "group_size"),
    (["coreopt", "palettize", MLP, "--cluster-dim", "2", "--granularity", "channel"], "--cluster-dim", "cluster_dim"),
    (["coreopt", "palettize", MLP, "--workers", "-1"], "--workers", "num_kmeans_workers"),
    (["coreopt", "palettize", MLP, "--rounding-precision", "-1"], "--rounding-precision", "rounding_precision"),
    (["coreopt", "palettize", MLP, "--threshold", "-1"], "--threshold", "weight_num_threshold"),
    (["coreopt", "palettize", MLP, "--override", "fc*:bits=8"], "--override", None),
    (["coreopt", "palettize", MLP, "--override", "fc*:n_bits=5"], "--override", None),
    (["coreopt", "quantize", MLP, "--block-size", "0"], "--block-size", "block_size"),
    (["coreopt", "quantize", MLP, "--dtype", "int8", "--scale-dtype", "e8m0"], "--scale-dtype", "scale_dtype"),
    (["coreopt", "quantize", MLP, "--dtype", "fp8e4m3", "--scheme", "asym"], "--scheme", "qscheme"),
    (["coreopt", "quantize", MLP, "--dtype", "mxfp4", "--block-size", "16"], "--block-size", "block_size"),
    (["coreopt", "quantize", MLP, "--dtype", "mxfp4", "--granularity", "channel"], "--block-size", "granularity"),
    (["coreopt", "quantize", MLP, "--threshold", "-1"], "--threshold", "weight_num_threshold"),
    (["coreopt", "sparsify", MLP, "--sparsity", "1.5"], "--sparsity", "target_sparsity"),
    (["coreopt", "sparsify", MLP, "--nm", "4:2"], "--nm", "n_m_ratio"),
    (["coreopt", "sparsify", MLP, "--block-size", "1"], "--block-size", "block_size"),
    (["coreopt", "sparsify", MLP, "--palettize", "5"], "--palettize", "palettize_nbits"),
    (["coreopt", "cast", str(SAMPLES / "mlp.pt2"), "--ignore-op", "aten.no_such_op"], "--ignore-op", None),
    (["coreopt", "palettize", MLP, "--executor", "dask"], "--executor", None),
    (["tcast", "cast", "w.safetensors", "-o", "o.safetensors", "--dtype", "nofmt"], "--dtype", None),
    (["tcast", "cast", "w.safetensors", "-o", "o.safetensors", "--dtype", "mxfp8e4", "--round", "up"], "--round", None),
    (["tcast", "cast", "w.safetensors", "-o", "o.safetensors", "--dtype", "mxfp8e4", "--only", "["], "--only", None),
]  # fmt: skip


COMMANDS_ON_A_MISSING_FILE = [
    ["coreopt", "inspect", "missing.pt2"],
    ["coreopt", "inspect", "missing.aimodel"],
    ["coreopt", "convert", "missing.pt2"],
    ["coreopt", "cast", "missing.pt2"],
    ["coreopt", "quantize", "missing.aimodel"],
    ["coreopt", "palettize", "missing.pt2"],
    ["coreopt", "sparsify", "missing.aimodel"],
    ["coreopt", "compare", "missing.aimodel", str(SAMPLES / "mlp.aimodel")],
    ["tcast", "cast", "missing.safetensors", "--dtype", "mxfp8e4", "-o", "out.safetensors"],
    ["tcast", "upcast", "missing.safetensors", "-o", "out.safetensors"],
]


@dataclass(frozen=True)
class Answer:
    returncode: int | None
    stdout: str
    stderr: str
    folder: Path


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", COLUMNS="200")


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a console script as users do (`run(app)`, the real exit code), torch importable."""
    code = f"import sys; sys.argv = {args!r}; from {CLI_APPS[args[0]]} import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120
    )


def _key(args: list[str]) -> str:
    return "\0".join(args)


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Answer]:
    """Every case whose checks come before torch loads, keyed by its arguments: answered by one
    child in which torch cannot be imported (a process a case cost ~0.5 CPU-s: 44 of them were
    20 CPU-s of the suite)."""
    cases = [[*args, "--json"] for args, flag, _ in INVALID_VALUES if flag != "--ignore-op"]
    cases += [variant for args in COMMANDS_ON_A_MISSING_FILE for variant in (args, [*args, "--json"])]
    folders = [tmp_path_factory.mktemp("case") for _ in cases]
    imported, results = cli_runs_in_one_child(
        list(zip(cases, folders, strict=True)), _env(), without_torch=True
    )
    assert imported == ""  # loading the CLIs prints nothing
    return {
        _key(args): Answer(r.exit_code, r.stdout, r.stderr, folder)
        for args, r, folder in zip(cases, results, folders, strict=True)
    }


@pytest.mark.parametrize(
    ("args", "flag", "parameter"),
    INVALID_VALUES,
    ids=lambda v: " ".join(v[1:]) if isinstance(v, list) else None,
)
def test_every_invalid_option_value_exits_2_naming_its_flag(
    args: list[str], flag: str, parameter: str | None, tmp_path: Path, answers: dict[str, Answer]
) -> None:
    # values are checked before torch loads, but for op names, which torch resolves
    if flag == "--ignore-op":
        done, folder = _cli([*args, "--json"], tmp_path), tmp_path
    else:
        done = answers[_key([*args, "--json"])]
        folder = done.folder
    assert done.returncode == 2, done.stderr
    assert f"Invalid value for {flag}" in done.stderr or f"Invalid value for '{flag}'" in done.stderr
    document = json.loads(done.stdout)["error"]
    assert document["exit_code"] == 2 and flag in document["message"]
    if parameter is not None:
        assert not re.search(rf"(?<![\w-]){parameter}", done.stderr), done.stderr
    assert not list(folder.iterdir())


@pytest.mark.parametrize("args", COMMANDS_ON_A_MISSING_FILE, ids=lambda a: " ".join(a[:2]))
def test_a_missing_file_is_one_line_and_a_json_error_before_torch_loads(
    args: list[str], answers: dict[str, Answer]
) -> None:
    human = answers[_key(args)]
    assert human.returncode == 1
    assert human.stderr.startswith("error: missing.") and human.stderr.count("\n") == 1, human.stderr
    assert human.stdout == ""
    machine = answers[_key([*args, "--json"])]
    assert machine.returncode == 1
    error = json.loads(machine.stdout)["error"]
    assert error["exit_code"] == 1 and error["message"] == human.stderr.removeprefix("error: ").strip()
    assert not list(human.folder.iterdir()) and not list(machine.folder.iterdir())


def test_tcast_upcast_reports_in_json(tmp_path: Path, tcast_cli) -> None:  # type: ignore[no-untyped-def]
    import torch
    from safetensors.torch import save_file

    weights = tmp_path / "w.safetensors"
    save_file({"a": torch.linspace(-3, 3, 64).reshape(2, 32), "n": torch.arange(4)}, str(weights))
    packed, restored = tmp_path / "p.safetensors", tmp_path / "r.safetensors"
    cast = tcast_cli("cast", weights, "--dtype", "mxfp8e4", "--mode", "actual", "-o", packed, "--json")
    assert cast.exit_code == 0, cast.stderr
    result = tcast_cli("upcast", packed, "-o", restored, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"source": str(packed), "output": str(restored), "restored": ["a"]}
