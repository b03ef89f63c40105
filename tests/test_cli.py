"""CLI contract: help with examples, versions, exit codes, and the real process on bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from coreai_opt import __version__


def test_versions(coreopt, tcast_cli) -> None:  # type: ignore[no-untyped-def]
    result = coreopt("--version")
    assert result.exit_code == 0 and __version__ in result.stdout
    assert tcast_cli("--version").exit_code == 0


@pytest.mark.parametrize("command", ["inspect", "convert", "cast"])
def test_every_subcommand_help_has_an_example(command: str, coreopt) -> None:  # type: ignore[no-untyped-def]
    result = coreopt(command, "--help")
    assert result.exit_code == 0
    assert f"Example: coreopt {command}" in result.stdout


def test_top_level_help_lists_commands(coreopt, tcast_cli) -> None:  # type: ignore[no-untyped-def]
    result = coreopt("--help")
    assert result.exit_code == 0
    assert "inspect" in result.stdout and "convert" in result.stdout
    assert tcast_cli("--help").exit_code == 0


@pytest.mark.parametrize(
    "args",
    [["inspect"], ["inspect", "a.pt2", "--no-such-flag"], ["no-such-command"], ["convert", "a.pt2", "-o"]],
)
def test_usage_errors_exit_2(args: list[str], coreopt) -> None:  # type: ignore[no-untyped-def]
    assert coreopt(*args).exit_code == 2


def test_real_process_reports_one_line_and_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "broken.aimodel"
    bad.mkdir()
    (bad / "metadata.json").write_text('{"assetVersion": "2.0"}')
    (bad / "main.hash").write_bytes(b"\0" * 32)
    (bad / "main.mlirb").write_bytes(b"ML\xefR not really")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, "-m", "cli.coreopt_app", "inspect", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: {bad}: main.hash does not match the SHA-256 of main.mlirb"
    ]
    assert proc.stdout == ""
