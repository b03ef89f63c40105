"""The same input gives byte-identical outputs and reports in every process, whatever its hash seed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _hostile import tree_digest
from conftest import ROOT, SAMPLES

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


def _run(command: str, folder: Path, hash_seed: str) -> tuple[str, dict]:
    folder.mkdir()
    env = dict(os.environ, PYTHONHASHSEED=hash_seed, SOURCE_DATE_EPOCH="1700000000", PYTHONWARNINGS="ignore")
    done = subprocess.run(
        [sys.executable, "-m", "cli.coreopt_app", *COMMANDS[command], "-o", "out.aimodel", "--json"],
        cwd=folder, env=env | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    report = json.loads(done.stdout)
    report.pop("seconds")  # wall time: the one field that may differ
    return tree_digest(folder / "out.aimodel"), report


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_two_processes_with_different_hash_seeds_agree_byte_for_byte(command: str, tmp_path: Path) -> None:
    first = _run(command, tmp_path / "a", "1")
    second = _run(command, tmp_path / "b", "2")
    assert first[0] == second[0]
    assert json.dumps(first[1], sort_keys=True) == json.dumps(second[1], sort_keys=True)


def test_converting_twice_gives_the_same_bytes(tmp_path: Path) -> None:
    """coreai's authoring API names composite graphs with a random suffix at every conversion; the
    converted program renames them by place, so the file is the same each time."""
    from coreai_opt.recipes import convert_file

    first = convert_file(SAMPLES / "transformer.pt2", tmp_path / "a.aimodel").output
    second = convert_file(SAMPLES / "transformer.pt2", tmp_path / "b.aimodel").output
    assert (first / "main.mlirb").read_bytes() == (second / "main.mlirb").read_bytes()
