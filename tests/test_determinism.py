"""The same input gives byte-identical outputs and reports in every process, whatever its hash seed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _hostile import tree_digest
from conftest import ROOT, SAMPLES, cli_runs_in_one_child

COMMANDS = {
    "quantize": [
        "quantize",
        str(SAMPLES / "cnn.aimodel"),
        "--dtype",
        "int4",
        "--granularity",
        "block",
        "--threshold",
        "0",
    ],
    "palettize": [
        "palettize",
        str(SAMPLES / "transformer.aimodel"),
        "--nbits",
        "3",
        "--granularity",
        "channel",
        "--workers",
        "2",
    ],
    "sparsify": ["sparsify", str(SAMPLES / "mlp.aimodel"), "--nm", "2:4", "--quantize", "int8"],
}


Outcome = dict[str, tuple[str, dict]]  # command -> (digest of its output, its report)


def _run_all(folder: Path, hash_seed: str) -> Outcome:
    """Every command of COMMANDS in one child process with this hash seed, each in a folder of its
    own (a process loads torch and the CLI once: ~4 CPU-s)."""
    env = dict(os.environ, PYTHONHASHSEED=hash_seed, SOURCE_DATE_EPOCH="1700000000", PYTHONWARNINGS="ignore")
    cases = []
    for command, args in sorted(COMMANDS.items()):
        (folder / command).mkdir(parents=True)
        cases.append((["coreopt", *args, "-o", "out.aimodel", "--json"], folder / command))
    _, results = cli_runs_in_one_child(cases, env | {"PYTHONPATH": str(ROOT)})
    outcome = {}
    for (command, _), result in zip(sorted(COMMANDS.items()), results, strict=True):
        assert result.exit_code == 0, (command, result.stderr)
        report = json.loads(result.stdout)
        report.pop("seconds")  # wall time: the one field that may differ
        outcome[command] = (tree_digest(folder / command / "out.aimodel"), report)
    return outcome


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Outcome, Outcome]:
    root = tmp_path_factory.mktemp("determinism")
    return _run_all(root / "a", "1"), _run_all(root / "b", "2")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_two_processes_with_different_hash_seeds_agree_byte_for_byte(
    command: str, outcomes: tuple[Outcome, Outcome]
) -> None:
    first, second = (outcome[command] for outcome in outcomes)
    assert first[0] == second[0]
    assert json.dumps(first[1], sort_keys=True) == json.dumps(second[1], sort_keys=True)


def test_converting_twice_gives_the_same_bytes(tmp_path: Path) -> None:
    """coreai's authoring API names composite graphs with a random suffix at every conversion; the
    converted program renames them by place, so the file is the same each time."""
    from coreai_opt.recipes import convert_file

    first = convert_file(SAMPLES / "transformer.pt2", tmp_path / "a.aimodel").output
    second = convert_file(SAMPLES / "transformer.pt2", tmp_path / "b.aimodel").output
    assert (first / "main.mlirb").read_bytes() == (second / "main.mlirb").read_bytes()
