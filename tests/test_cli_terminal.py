"""What a CI log shows: tables fit 80 columns with whole rows, and --quiet prints one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", COLUMNS="80")
    return subprocess.run(
        [sys.executable, "-m", f"cli.{args[0]}_app", *args[1:]], cwd=cwd, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip


def test_compression_tables_fit_80_columns_one_line_per_weight(tmp_path: Path) -> None:
    args = ["coreopt", "palettize", str(SAMPLES / "transformer.aimodel"), "--nbits", "4", "--granularity",
            "grouped", "--group-size", "16", "--lut-dtype", "int8", "-o", "t.aimodel"]  # fmt: skip
    done = _run(args, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    rows = [line for line in lines if line.startswith((" tokens.", " layers."))]
    names = ["tokens.weight"] + [
        f"layers.{i}.{p}.weight" for i in (0, 1) for p in ("qkv", "proj", "ff1", "ff2")
    ]
    assert [row.split()[0] for row in rows] == names  # whole names, one row each
    assert all("ui4 LUT(16 x si8)" in row for row in rows)  # the encoding cut at its end, not its start


@pytest.mark.parametrize(
    "args",
    [
        ["coreopt", "inspect", str(SAMPLES / "mlp.aimodel")],
        ["coreopt", "quantize", str(SAMPLES / "mlp.aimodel"), "--dtype", "int8", "-o", "q.aimodel"],
        ["coreopt", "sparsify", str(SAMPLES / "mlp.pt2"), "--nm", "2:4", "-o", "s.pt2"],
        ["coreopt", "cast", str(SAMPLES / "mlp.pt2"), "--to", "fp16", "-o", "c.pt2"],
        [
            "coreopt",
            "compare",
            str(SAMPLES / "mlp.aimodel"),
            str(SAMPLES / "mlp.aimodel"),
            "--min-cosine",
            "0.99",
        ],
    ],
    ids=lambda a: a[1],
)
def test_quiet_prints_one_summary_line(
    args: list[str],
    tmp_path: Path,
    coreopt,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:  # type: ignore[no-untyped-def]
    """In this process (the line's words and count are the same as in a child's: the 80-column
    tables above take a child, whose terminal width is its own), and nothing written past the
    command's streams: no native library or forked first run writes to the file descriptors."""
    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    done = coreopt(*args[1:], "--quiet")
    assert done.exit_code == 0, done.stderr
    assert capfd.readouterr() == ("", "")
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    assert lines[0].startswith(args[1])
    expected = {
        "inspect": "19 ops, 6 weights",
        "quantize": "3 weights compressed",
        "sparsify": "3 weights compressed",
        "cast": "check ok",
        "compare": "worst cosine 1.000000 over 1 outputs x 1 samples, ok",
    }[args[1]]
    assert expected in lines[0]


def test_names_from_a_file_reach_the_terminal_escaped_never_as_markup(tmp_path: Path) -> None:
    """A tensor name carrying terminal escapes, rich markup, a bidi override and a lone surrogate
    is printed as text: no raw control byte reaches stdout or stderr, nothing fails to encode."""
    import torch
    from safetensors.torch import save_file

    name = "w\x1b[2J\x1b]0;owned\x07[bold red]x[/]\u202e\ud800"
    save_file({name.encode("utf-8", "surrogatepass").decode("utf-8", "replace"): torch.randn(64, 64)},
              str(tmp_path / "t.safetensors"))  # fmt: skip
    save_file({"w\x1b[2J[/bold]\u202e": torch.randn(64, 64)}, str(tmp_path / "u.safetensors"))
    for source in ("t.safetensors", "u.safetensors"):
        done = _run(
            ["tcast", "cast", source, "--dtype", "mxfp8e4", "-o", f"{source}.out.safetensors"], tmp_path
        )
        assert done.returncode == 0, done.stderr
        assert "\x1b" not in done.stdout + done.stderr and "\u202e" not in done.stdout
        assert "\\x1b[2J" in done.stdout and "[/" in done.stdout  # shown, as text
    from cli._common import plain, shown

    assert plain("a\x1b[31mb\ud800\u2028") == "a\\x1b[31mb\\ud800\\u2028"
    assert shown("[bold]x[/bold]") == "\\[bold]x\\[/bold]"
