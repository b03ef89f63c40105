"""A new algorithm is one module and one registry line: installed as a package's `coreopt.plugins`
entry point it is a `--method` of its pass on the command line, a method in a recipe file and a
candidate of `optimize`, and what it encodes is what the output holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from coreai_opt._export import fold_decompression
from coreai_opt.io import load_pt2
from tests.conftest import ROOT, SAMPLES, CliResult, cli_runs_in_one_child

# The whole plugin: round to nearest of the negated weight (int8 codes are odd-symmetric, so the
# output's weights are exactly the negatives of round to nearest's: what the toy did shows).
TOY = """
from coreai_opt.compression import Algorithm, QuantizeConfig, register

def negated(w, site, config, statistics):
    from coreai_opt.compression.algorithms._rtn import quantize
    return quantize(-w, site, config)

register(Algorithm(QuantizeConfig, "toy", negated, summary="round to nearest of -w"))
"""


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder that holds the toy module and its installed distribution's metadata."""
    folder = tmp_path_factory.mktemp("site")
    (folder / "coreopt_toy.py").write_text(TOY)
    info = folder / "coreopt_toy-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: coreopt-toy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[coreopt.plugins]\ntoy = coreopt_toy\n")
    return folder


def _env(plugin: Path) -> dict[str, str]:
    """The environment of a process that finds the plugin's folder installed."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(plugin), str(ROOT)]), PYTHONWARNINGS="ignore")


def _coreopt(plugin: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.coreopt_app", *args], cwd=cwd, env=_env(plugin),
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def toy_runs(plugin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[CliResult, Path]]:
    """The command line, a recipe file and `optimize`, each naming the toy, run in one child (a
    process loads torch and the plugins: ~4 CPU-s)."""
    folders = {name: tmp_path_factory.mktemp(name) for name in ("command", "recipe", "optimize")}
    (folders["recipe"] / "toy.yaml").write_text(
        textwrap.dedent("""\
        steps:
          - compress:
              config: {kind: quantize, method: toy, weight_num_threshold: 0}
    """)
    )
    mlp = str(SAMPLES / "mlp.pt2")
    commands = {
        "command": ["quantize", mlp, "--method", "toy", "--threshold", "0", "-o", "out.pt2", "--json"],
        "recipe": ["apply", "toy.yaml", mlp, "-o", "out.pt2"],
        "optimize": ["optimize", mlp, "--calibration", "random", "--target-bits", "9", "--candidates",
                     "keep,toy8=quantize:method=toy,dtype=int8", "--dry-run", "--json"],
    }  # fmt: skip
    cases = [(["coreopt", *args], folders[name]) for name, args in commands.items()]
    _, results = cli_runs_in_one_child(cases, _env(plugin))
    return {name: (result, folders[name]) for name, result in zip(commands, results, strict=True)}


def _dense(path: Path) -> dict[tuple[int, ...], torch.Tensor]:
    module = load_pt2(path).module()
    fold_decompression(module)
    return {tuple(b.shape): b for n, b in module.named_buffers() if n.startswith("_coreopt_dense")}


def _negated_rtn(output: Path, rtn: Path) -> None:
    toy, plain = _dense(output), _dense(rtn)
    assert toy.keys() == plain.keys() and len(toy) == 3
    for shape, values in plain.items():
        assert torch.equal(toy[shape], -values), shape


@pytest.fixture(scope="module")
def rtn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from coreai_opt.compression import QuantizeConfig
    from coreai_opt.recipes import compress_file

    out = tmp_path_factory.mktemp("rtn") / "mlp.int8.pt2"
    compress_file(SAMPLES / "mlp.pt2", out, QuantizeConfig(weight_num_threshold=0))
    return out


def test_the_plugin_is_a_method_on_the_command_line(toy_runs, rtn: Path) -> None:  # type: ignore[no-untyped-def]
    done, folder = toy_runs["command"]
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["options"]["method"] == "toy"
    _negated_rtn(folder / "out.pt2", rtn)


def test_the_plugin_is_a_method_in_a_recipe_file(toy_runs, rtn: Path) -> None:  # type: ignore[no-untyped-def]
    done, folder = toy_runs["recipe"]
    assert done.exit_code == 0, done.stderr
    _negated_rtn(folder / "out.pt2", rtn)


def test_the_plugin_is_a_candidate_of_optimize(toy_runs) -> None:  # type: ignore[no-untyped-def]
    done, _ = toy_runs["optimize"]
    assert done.exit_code == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["counts"] == {"toy8": 3}
    assert plan["recipe"]["steps"][0]["compress"]["config"]["method"] == "toy"


def test_without_the_plugin_the_method_is_refused_naming_the_flag(tmp_path: Path) -> None:
    done = _coreopt(tmp_path, tmp_path, "quantize", str(SAMPLES / "mlp.pt2"), "--method", "toy")
    assert done.returncode == 2 and "--method" in done.stderr and "'toy'" in done.stderr


def test_a_broken_plugin_is_one_line_and_the_rest_works(tmp_path: Path) -> None:
    (tmp_path / "coreopt_bad.py").write_text("raise RuntimeError('no luck')\n")
    info = tmp_path / "coreopt_bad-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: coreopt-bad\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[coreopt.plugins]\nbad = coreopt_bad\n")
    done = _coreopt(tmp_path, tmp_path, "inspect", str(SAMPLES / "mlp.pt2"), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)
    assert done.stderr.strip() == "coreopt: plugin 'bad' was not loaded (RuntimeError: no luck)"
