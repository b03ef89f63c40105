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


def test_mistakes_are_refused_before_any_model_loads(coreopt, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A method that learns from data with no --calibration, calibration
    or token files of no kind coreopt reads, an empty text, a size budget above float32: each exits 2
    in the words of the flags, and no program is read."""

    def no_load(*_: object, **__: object) -> None:
        raise AssertionError("a program was loaded")

    for module in ("coreai_opt.recipes._apply", "coreai_opt.io"):
        monkeypatch.setattr(f"{module}.load_pt2", no_load)
    monkeypatch.setenv("COLUMNS", "400")  # no box border inside a long path
    monkeypatch.setenv("TERMINAL_WIDTH", "400")
    model, empty, jsonl = SAMPLES / "mlp.pt2", tmp_path / "empty.txt", tmp_path / "calib.jsonl"
    empty.write_text("", encoding="utf-8")
    jsonl.write_text('{"text": "a"}\n', encoding="utf-8")
    out = ["-o", tmp_path / "out.pt2"]
    cases = [
        (["palettize", model, "--method", "gptq", *out], "--method gptq learns from data: give --calibration"),
        (["quantize", model, "--method", "gptq", "--calibration", jsonl, *out],
         f"{jsonl}: not calibration data coreopt reads; give a text file (.txt, .md, .text), a .safetensors"),
        (["eval", model, model, "--text", empty], f"{empty} is empty"),
        (["eval", model, model, "--tokens", jsonl], "give token ids as a .safetensors file"),
        (["optimize", model, "--target-bits", "40", "--calibration", "random", "--eval", "random", *out],
         "--target-bits 40 is not below 32, a float32 weight's bits: no plan compresses to it"),
    ]  # fmt: skip
    for args, said in cases:
        result = coreopt(*args)
        assert result.exit_code == 2, (args, result.stderr)
        assert said in " ".join(result.stderr.replace("│", " ").split()), (args, result.stderr)
    assert not (tmp_path / "out.pt2").exists()


def test_typer_s_pydantic_phrasing_is_said_in_ours(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from cli._common import plain_words, run
    from cli.coreopt_app import app

    assert plain_words("Input should be greater than or equal to 2") == "must be at least 2"
    assert plain_words("Value error, 'x' is not one of 'a', 'b'.") == "'x' is not one of 'a', 'b'."
    for args, said in (
        (["export", "m", "-o", "m.pt2", "--kv-cache", "--context", "1"], "'--context': must be at least 2"),
        (["quantize", "m.pt2", "--block-size", "abc"], "'--block-size': must be a whole number"),
        (["quantize", "m.pt2", "--granularity", "blockwise"], "'--granularity': 'blockwise' is not one of"),
    ):
        monkeypatch.setattr(sys, "argv", ["coreopt", *args])
        with pytest.raises(SystemExit) as stop:
            run(app)
        assert stop.value.code == 2
        err = " ".join(capsys.readouterr().err.replace("│", " ").split())
        assert said in err and "Input should" not in err and "Value error" not in err, err


def test_a_broken_compression_of_a_language_model_is_said_plainly(
    tiny_llama, tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    """After writing a .pt2 language model, a spot check on Python's own documentation: int8 keeps
    the original's predictions; 95% of weights pruned keeps none of its top tokens, and the report
    says the result looks broken and names the sparsify method that learns from data."""
    import json

    from coreai_opt.compression import QuantizeConfig
    from coreai_opt.recipes import compress_file

    kept = compress_file(
        tiny_llama["ref"],
        tmp_path / "int8.pt2",
        QuantizeConfig(dtype="int8", weight_num_threshold=0),
        spot_check=True,
    )
    assert kept.spot_check is not None and not kept.spot_check.broken
    assert kept.spot_check.top1 > 0.9 and kept.spot_check.kl_mean < 1e-5 and kept.spot_check.tokens == 240
    pruned = ["sparsify", tiny_llama["ref"], "--sparsity", "0.95", "--threshold", "0"]
    shown = coreopt(*pruned, "-o", tmp_path / "sp.pt2")
    assert shown.exit_code == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "Spot check (240 tokens of Python's documentation, against the original)" in text
    assert "the result looks broken" in text and "--method sparsegpt --calibration TEXT" in text
    quiet = json.loads(coreopt(*pruned, "-o", tmp_path / "sp2.pt2", "--json").stdout)
    assert quiet["spot_check"]["broken"] is True and quiet["spot_check"]["top1"] < 0.5
    skipped = json.loads(coreopt(*pruned, "-o", tmp_path / "sp3.pt2", "--json", "--no-spot-check").stdout)
    assert skipped["spot_check"] is None


def test_the_commands_let_waiting_openmp_threads_sleep() -> None:
    """Spinning threads took twice the CPU on a shared machine: the command-line package sets
    OMP_WAIT_POLICY=PASSIVE when first imported (before any plugin or command imports torch), and
    leaves a user's own setting alone."""
    import os
    import subprocess

    probe = "import cli.coreopt_app, os, sys; print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)"
    for given, expected in ((None, "PASSIVE False"), ("ACTIVE", "ACTIVE False")):
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | (
            {} if given is None else {"OMP_WAIT_POLICY": given}
        )
        found = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
        )
        assert found.stdout.split()[-2:] == expected.split()
