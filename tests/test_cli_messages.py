"""Messages a user reads before any work starts: help text as written, one line for a missing extra."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import SAMPLES


def test_help_keeps_the_extras_names(coreopt, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("COLUMNS", "400")  # no box border inside a sentence
    monkeypatch.setenv("TERMINAL_WIDTH", "400")
    assert "pip install 'coreopt[plot]'" in " ".join(coreopt("compare", "--help").stdout.split())
    assert "pip install 'coreopt[ray]'" in " ".join(coreopt("quantize", "--help").stdout.split())


def test_plot_without_matplotlib_is_one_line(coreopt, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    ref, text = SAMPLES / "mlp.pt2", tmp_path / "t.txt"
    text.write_text("some words", encoding="utf-8")
    for args in (("compare", ref, ref, "--plot", tmp_path / "p.png"),
                 ("eval", ref, ref, "--text", text, "--plot", tmp_path / "p.png")):  # fmt: skip
        result = coreopt(*args)
        assert result.exit_code == 1, result.stderr
        assert result.stderr.strip().splitlines() == [
            "error: --plot needs matplotlib: pip install 'coreopt[plot]'"
        ]
        assert not (tmp_path / "p.png").exists()
