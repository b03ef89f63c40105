"""`coreopt eval`: perplexity, KL and top-1 of exported language models on a text, checked against
transformers' own model and against the numbers computed here from the programs' logits."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

import torch

from tests._hf import TEXT, VOCAB, hf_folder, tiny_model

SEQ = 16


@pytest.fixture(scope="module")
def lineage(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny LLaMA exported (fp32), a 2-bit palettized copy, the text, its ids as safetensors."""
    from safetensors.numpy import save_file

    from coreai_opt.compression import PalettizeConfig
    from coreai_opt.models import export_file, model_tokenizer
    from coreai_opt.recipes import compress_file
    from tests._hf import tokenizer_json

    root = tmp_path_factory.mktemp("eval")
    folder = hf_folder("llama", root)
    ref = export_file(folder, root / "ref.pt2", seq_len=SEQ).output
    lut = root / "ref.lut2.pt2"
    compress_file(ref, lut, PalettizeConfig(n_bits=2, weight_num_threshold=0))
    text = root / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    from tokenizers import Tokenizer

    ids = np.asarray(
        Tokenizer.from_str(tokenizer_json()).encode(TEXT, add_special_tokens=False).ids, np.int64
    )
    save_file({"tokens": ids}, str(root / "ids.safetensors"))
    assert model_tokenizer(lut) is not None
    return {"folder": folder, "ref": ref, "lut": lut, "text": text, "ids": root / "ids.safetensors"}


def _windows(ids: np.ndarray, stride: int) -> list[tuple[int, int]]:
    """(start, first scored row) per window, as the evaluation's definition says."""
    starts = range(0, len(ids) - SEQ + 1, stride)
    return [(s, 0 if i == 0 else max(0, SEQ - stride - 1)) for i, s in enumerate(starts)]


def _logprobs(run, ids: np.ndarray, stride: int) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    rows, targets = [], []
    for start, first in _windows(ids, stride):
        window = torch.from_numpy(ids[start : start + SEQ])[None]
        with torch.no_grad():
            logits = run(window)[0].double()
        rows.append(torch.log_softmax(logits[first:-1], -1))
        targets.append(window[0, first + 1 :])
    return torch.cat(rows), torch.cat(targets)


@pytest.mark.parametrize("stride", [SEQ, 5])
def test_perplexity_is_transformers_perplexity_on_the_same_windows(lineage, stride: int) -> None:
    from safetensors.numpy import load_file

    from coreai_opt.evaluation import evaluate_text

    result = evaluate_text(lineage["ref"], text=lineage["text"], stride=stride)
    ids = load_file(str(lineage["ids"]))["tokens"]
    model = tiny_model("llama")
    logp, targets = _logprobs(lambda w: model(input_ids=w).logits, ids, stride)
    want = math.exp(-float(logp.gather(1, targets[:, None]).mean()))
    assert result.reference.perplexity == pytest.approx(want, rel=1e-6)
    w = result.windows
    assert (w.tokens, w.length, w.stride) == (len(ids), SEQ, stride)
    assert w.scored == len(targets) and len(w.starts) == len(_windows(ids, stride))
    assert w.dropped == len(ids) - (w.starts[-1] + SEQ)


def test_kl_and_top1_are_those_of_the_programs_logits(lineage) -> None:
    from safetensors.numpy import load_file

    import coreai_opt
    from coreai_opt._export import fold_decompression
    from coreai_opt.evaluation import evaluate_text

    result = evaluate_text(lineage["ref"], [lineage["ref"], lineage["lut"]], tokens=lineage["ids"])
    same, lut = result.candidates
    assert (same.kl_mean, same.kl_p99, same.top1, same.perplexity_increase) == (0.0, 0.0, 1.0, 0.0)
    ids = load_file(str(lineage["ids"]))["tokens"]
    modules = []
    for path in (lineage["ref"], lineage["lut"]):
        module = coreai_opt.load(path).module()
        fold_decompression(module)
        modules.append(module)
    logp, targets = _logprobs(modules[0], ids, SEQ)
    logq, _ = _logprobs(modules[1], ids, SEQ)
    logp, logq = logp.float().double(), logq.float().double()  # as the evaluation keeps them
    kl = (logp.exp() * (logp - logq)).sum(-1)
    assert lut.kl_mean == pytest.approx(float(kl.mean()), rel=1e-6) and lut.kl_mean > 1e-3
    assert lut.kl_p99 == pytest.approx(float(torch.quantile(kl, 0.99)), rel=1e-6)
    assert lut.top1 == float((logp.argmax(-1) == logq.argmax(-1)).double().mean()) and lut.top1 < 1
    ppl = math.exp(-float(logq.gather(1, targets[:, None]).mean()))
    assert lut.perplexity == pytest.approx(ppl, rel=1e-6)
    assert lut.perplexity_increase == pytest.approx(ppl / result.reference.perplexity - 1, rel=1e-9)
    assert lut.bits_per_weight < 8 < result.reference.bits_per_weight == 32
    assert lut.size_bytes < result.reference.size_bytes


def test_candidates_scored_in_groups_score_as_together(lineage, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every program runs window by window in lockstep; where memory holds one candidate beside the
    reference at a time, the reference runs once a candidate and every number stays the same."""
    from coreai_opt.evaluation import _text, evaluate_text

    runs: list[str] = []
    together = evaluate_text(lineage["ref"], [lineage["ref"], lineage["lut"]], tokens=lineage["ids"])
    monkeypatch.setattr(_text, "_available_bytes", lambda: 1)  # room for one candidate at a time
    apart = evaluate_text(lineage["ref"], [lineage["ref"], lineage["lut"]], tokens=lineage["ids"],
                          progress=lambda done, total, label: runs.append(label))  # fmt: skip
    numbers = ("perplexity", "kl_mean", "kl_p99", "top1", "perplexity_increase", "bits_per_weight")
    for a, b in zip(
        (together.reference, *together.candidates), (apart.reference, *apart.candidates), strict=True
    ):
        assert [getattr(a, n) for n in numbers] == [getattr(b, n) for n in numbers]
    windows = len(together.windows.starts)
    assert len(runs) == windows * 4 and sum(label.startswith("ref.pt2") for label in runs) == windows * 3


def test_the_core_ai_runtime_scores_the_converted_program_alike(lineage, tmp_path: Path) -> None:
    from coreai_opt.evaluation import evaluate_text
    from coreai_opt.recipes import convert_file

    converted = convert_file(lineage["ref"], tmp_path / "ref.aimodel").output
    result = evaluate_text(lineage["ref"], [converted], text=lineage["text"])  # its tokenizer: the sidecar
    row = result.candidates[0]
    assert row.perplexity == pytest.approx(result.reference.perplexity, rel=1e-3)
    assert row.top1 == 1.0 and row.kl_mean < 1e-6


def test_eval_cli_reports_and_gates(lineage, coreopt) -> None:
    result = coreopt("eval", lineage["ref"], lineage["lut"], "--text", lineage["text"], "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["ok"] is True and doc["window"] == SEQ and doc["windows"] == len(doc and range(doc["windows"]))
    kl = doc["candidates"][0]["kl_mean"]
    gated = coreopt("eval", lineage["ref"], lineage["lut"], "--text", lineage["text"], "--max-kl", kl / 2)
    assert gated.exit_code == 1 and "exceeds" in gated.stdout
    csv = coreopt("eval", lineage["ref"], lineage["lut"], "--tokens", lineage["ids"], "--csv")
    assert csv.exit_code == 0 and len(csv.stdout.strip().splitlines()) == 3
    on_cpu = coreopt(
        "eval", lineage["ref"], lineage["lut"], "--tokens", lineage["ids"], "--device", "cpu", "--json"
    )
    assert (
        json.loads(on_cpu.stdout)["candidates"][0]["kl_mean"]
        == json.loads(
            coreopt("eval", lineage["ref"], lineage["lut"], "--tokens", lineage["ids"], "--json").stdout
        )["candidates"][0]["kl_mean"]
    )
    quiet = coreopt("eval", lineage["ref"], lineage["lut"], "--tokens", lineage["ids"], "--quiet",
                    "--max-ppl-increase", 1e9)  # fmt: skip
    assert quiet.exit_code == 0 and len(quiet.stdout.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--max-tokens", 8], "fewer than one window of 16"),
        (["--tokenizer", "missing.json"], "no such tokenizer file"),
        (["--stride", 17], "--stride"),
        (["--device", "cuda:99"], "--device cuda:99: this machine has "),  # without CUDA, or too few
    ],
)
def test_eval_errors_are_one_line(lineage, coreopt, args: list[object], problem: str) -> None:
    result = coreopt("eval", lineage["ref"], "--text", lineage["text"], *args)
    assert result.exit_code in (1, 2) and problem in result.stderr
    if result.exit_code == 1:
        assert len(result.stderr.strip().splitlines()) == 1


def test_ids_outside_the_vocabulary_are_refused(lineage, tmp_path: Path, coreopt) -> None:
    from safetensors.numpy import save_file

    bad = tmp_path / "bad.safetensors"
    save_file({"tokens": np.full(40, VOCAB, np.int64)}, str(bad))
    result = coreopt("eval", lineage["ref"], "--tokens", bad)
    assert result.exit_code == 1 and "outside the model's vocabulary" in result.stderr


def test_eval_of_a_model_that_is_not_a_language_model_compares_outputs_on_a_dataset(
    tmp_path: Path, coreopt
) -> None:
    from safetensors.torch import save_file

    import coreai_opt
    from coreai_opt.compression import QuantizeConfig
    from coreai_opt.recipes import compress_file
    from tests.conftest import SAMPLES

    ref = SAMPLES / "mlp.pt2"
    program = coreai_opt.load(ref)
    (name,) = program.graph_signature.user_inputs
    shape = next(n.meta["val"].shape for n in program.graph.nodes if n.name == name)
    data = tmp_path / "data.safetensors"
    save_file({name: torch.randn(3, *shape)}, str(data))
    cand = tmp_path / "mlp.int8.pt2"
    compress_file(ref, cand, QuantizeConfig(weight_num_threshold=0))
    result = coreopt("eval", ref, cand, "--inputs", data, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["inputs_source"] == str(data) and len(doc["samples"]) == 3
    assert 0.99 < doc["outputs"][0]["cosine"] <= 1.0


def test_programs_without_a_tokenizer_or_token_ids_are_refused_in_one_line(lineage, coreopt) -> None:
    from tests.conftest import SAMPLES

    result = coreopt("eval", SAMPLES / "transformer.pt2", "--text", lineage["text"])
    assert result.exit_code == 1 and "transformer.pt2: has no tokenizer beside it" in result.stderr
    tokenizer = lineage["ref"].with_name("ref.tokenizer.json")
    result = coreopt("sensitivity", SAMPLES / "mlp.pt2", "--text", lineage["text"], "--tokenizer", tokenizer,
                     "--config", "palettize:n_bits=4")  # fmt: skip
    assert result.exit_code == 1 and result.stderr.strip() == (
        f"error: {SAMPLES / 'mlp.pt2'}: takes no [batch, tokens] ids: not a language model"
    )


def test_the_scoring_settings_are_one_config_that_the_cli_options_come_from(coreopt, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    from coreai_opt.compression import flag_names
    from coreai_opt.errors import ConfigError
    from coreai_opt.evaluation import EvalConfig
    from tests.conftest import SAMPLES

    config = EvalConfig(max_tokens=64, stride=8, max_ppl_increase=1.5, max_kl=0.01)
    assert EvalConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    for bad, field in (({"max_tokens": 1}, "max_tokens"), ({"stride": 0}, "stride"), ({"max_kl": -1.0}, "max_kl"),
                       ({"max_ppl_increase": float("nan")}, "max_ppl_increase")):  # fmt: skip
        with pytest.raises(ConfigError) as refused:
            dataclasses.replace(config, **bad)
        assert field in refused.value.fields
    assert all(flag in coreopt("eval", "--help").stdout for flag in flag_names(EvalConfig).values())
    text = tmp_path / "t.txt"
    text.write_text("some words")
    for args, flag in ((["--max-tokens", "1"], "--max-tokens"), (["--max-kl", "-1"], "--max-kl")):
        done = coreopt("eval", SAMPLES / "mlp.pt2", "--text", text, *args)
        assert done.exit_code == 2 and flag in done.stderr, (args, done.stderr)


def test_the_plot_draws_the_reference_as_a_line_and_stacks_labels_of_equal_size(
    tmp_path: Path, monkeypatch
) -> None:
    pytest.importorskip("matplotlib")
    from coreai_opt import _plot
    from coreai_opt.evaluation import TextEvaluation, TextScore, Windows, plot_evaluation

    drawn = []
    monkeypatch.setattr(_plot, "save_figure", lambda figure, path: drawn.append(figure))
    reference = TextScore(Path("ref.pt2"), 100, 32.0, 10.0, 1.0, 1.0)
    candidates = [TextScore(Path(f"{n}.pt2"), 10, bits, ppl, 1.0, 1.0, kl_mean=0.1)
                  for n, bits, ppl in (("a", 4.0, 11.0), ("b", 4.0, 11.5), ("c", 3.0, 14.0))]  # fmt: skip
    plot_evaluation(TextEvaluation("t.txt", Windows(64, 16, 16), reference, candidates), tmp_path / "p.png")
    axes = drawn[0].axes[0]
    offsets = {a.get_text(): a.xyann for a in axes.texts}
    assert offsets["a.pt2"] != offsets["b.pt2"] and offsets["c.pt2"] == (4, 4)  # stacked in the 4-bit column
    assert [line.get_ydata()[0] for line in axes.lines] == [10.0] and "ref.pt2: 10.000" in offsets
    assert max(axes.get_xlim()) < 8  # no point at the reference's 32 bits


def test_a_window_compared_in_pieces_of_rows_equals_the_whole_windows_formula() -> None:
    """KL per token, top-1 agreements and log-likelihoods of a 200-row window, scored 64 rows at
    a time, are the whole-window float64 formula's bit for bit."""
    from coreai_opt.evaluation._text import _log_probabilities, _Tally

    g = torch.Generator().manual_seed(0)
    reference = torch.randn(200, 3000, generator=g) * 4
    candidate = reference + torch.randn(200, 3000, generator=g) * 0.3
    targets = torch.randint(0, 3000, (200,), generator=g)
    logp = torch.log_softmax(reference.double(), dim=-1).float().double()
    logq = torch.log_softmax(candidate.double(), dim=-1).float().double()
    tally = _Tally()
    tally.add(_log_probabilities(reference), candidate, targets)
    assert torch.equal(_log_probabilities(reference), logp)
    assert torch.equal(torch.cat(tally.kls), (logp.exp() * (logp - logq)).sum(-1).float())
    assert tally.agree == int((logp.argmax(-1) == logq.argmax(-1)).sum())
    assert tally.nll == pytest.approx(-float(logq.gather(1, targets[:, None]).sum()), rel=1e-15)
