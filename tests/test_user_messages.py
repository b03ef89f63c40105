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


def test_casts_of_activations_are_not_compressed_weights(tmp_path: Path) -> None:
    """A 16-bit program's activation casts (layer norms) are no decompressions of stored weights:
    nothing is "already compressed" until a weight is, then exactly those."""
    from coreai_opt.compression import QuantizeConfig, compress_, container_of
    from coreai_opt.io import load_aimodel
    from coreai_opt.recipes import cast_file, convert_file

    cast = cast_file(SAMPLES / "transformer.pt2", "fp16", tmp_path / "t16.pt2", check=False).output
    program = load_aimodel(convert_file(cast, tmp_path / "t16.aimodel").output)
    ir = str(program)
    assert ir.count("coreai.cast") >= 2  # the activation casts are there
    assert container_of(program).compressed() == 0
    report = compress_(program, QuantizeConfig(dtype="int8"))
    assert report.already_compressed == 0 and report.weights
    assert container_of(program).compressed() == len(report.weights)


def test_the_header_spells_options_as_the_command_line_does(coreopt, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = coreopt("sparsify", SAMPLES / "mlp.aimodel", "--nm", "2:4", "-o", tmp_path / "out.aimodel")
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert (
        "--nm 2:4" in text
        and "n_m_ratio" not in text
        and "['2', '4']" not in text
        and "overrides" not in text
    )
    assert "3 weights compressed, 3 skipped" in text  # --quiet's line uses the table's word
    quiet = coreopt(
        "sparsify", SAMPLES / "mlp.aimodel", "--nm", "2:4", "-o", tmp_path / "q.aimodel", "--quiet"
    )
    assert "3 weights compressed, 3 skipped;" in quiet.stdout
