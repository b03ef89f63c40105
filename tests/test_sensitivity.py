"""`coreopt sensitivity`: each weight's trial, resumed from its first reader, measures exactly
what evaluating a program with only that weight compressed measures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from tests._hf import TEXT, hf_folder

SEQ = 16


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from coreai_opt.models import export_file

    root = tmp_path_factory.mktemp("sensitivity")
    ref = export_file(hf_folder("llama", root), root / "ref.pt2", seq_len=SEQ, batch=2).output
    text = root / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    return {"ref": ref, "text": text, "root": root}


def test_each_weights_measure_is_the_evaluation_of_it_alone(exported) -> None:
    from coreai_opt.compression import Override, PalettizeConfig
    from coreai_opt.evaluation import evaluate_text, weight_sensitivity
    from coreai_opt.recipes import compress_file

    config = PalettizeConfig(n_bits=2, weight_num_threshold=0)
    result = weight_sensitivity(exported["ref"], config, text=exported["text"])
    names = [w.name for w in result.weights]
    assert "lm_head.weight" in names and "model.layers.1.mlp.down_proj.weight" in names
    assert len(names) == 2 * 7 + 2  # every projection, the embedding and the head (norms are small vectors)
    assert [w.kl_mean for w in result.weights] == sorted((w.kl_mean for w in result.weights), reverse=True)
    for row in (result.weights[0], next(w for w in result.weights if "layers.1" in w.name)):
        alone = exported["root"] / f"alone.{row.name}.pt2"
        only = PalettizeConfig(n_bits=2, weight_num_threshold=0,
                               overrides=(Override.of(row.name, n_bits=2), Override.of("*", skip=True)))  # fmt: skip
        compress_file(exported["ref"], alone, only)
        measured = evaluate_text(exported["ref"], [alone], text=exported["text"]).candidates[0]
        assert row.kl_mean == pytest.approx(measured.kl_mean, rel=1e-4, abs=1e-7)  # exact float64 vs rounded
        assert row.perplexity_increase == pytest.approx(measured.perplexity_increase, rel=1e-4, abs=1e-7)
        assert row.top1 == measured.top1
        assert row.bytes_saved > 0
    assert result.weights[0].kl_mean > 10 * result.weights[-1].kl_mean
    # the Fisher estimate ranks the weights as the measurement does, roughly
    assert all(w.estimate is not None and w.estimate >= 0 for w in result.weights)
    assert result.rank_correlation is not None and result.rank_correlation > 0.5


def test_sensitivity_cli_json_and_config_forms(exported, coreopt, tmp_path: Path) -> None:
    from coreai_opt.compression import config_from_text

    spec = tmp_path / "int4.yaml"
    spec.write_text(
        "kind: quantize\ndtype: int4\ngranularity: block\nblock_size: 8\nweight_num_threshold: 0\n"
    )
    inline = config_from_text("quantize:dtype=int4,granularity=block,block_size=8,weight_num_threshold=0")
    assert config_from_text(str(spec)) == inline
    result = coreopt("sensitivity", exported["ref"], "--text", exported["text"], "--config", spec, "--json",
                     "--no-estimate", "--max-tokens", 64)  # fmt: skip
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (
        doc["config"]["dtype"] == "int4"
        and len(doc["weights"]) == 16
        and doc["scored_tokens"] == 4 * (SEQ - 1)
    )
    assert doc["weights"][0]["kl_mean"] >= doc["weights"][-1]["kl_mean"] and doc["rank_correlation"] is None
    bad = coreopt("sensitivity", exported["ref"], "--text", exported["text"], "--config", "quantize:nbits=4")
    assert bad.exit_code == 2 and "--config" in bad.stderr


@pytest.mark.parametrize(("scale", "peaked"), [(1e-3, False), (0.1, False), (30.0, False), (0.1, True)])
def test_a_trials_kl_read_off_its_difference_from_the_reference_is_the_textbook_one(
    scale: float, peaked: bool
) -> None:
    """KL, NLL and top-1 from d = z - z_ref in float32 pieces of rows against the textbook float64
    formulas: a tiny change, a small one, one that destroys the prediction, and a reference so sure
    of one token that float32 holds no other token's probability while the candidate moves to one
    of those. Windows overlap, so each scores only the rows after its carried-over context."""
    import torch

    from coreai_opt.evaluation._sensitivity import _Reference
    from coreai_opt.evaluation._tokens import Windows

    generator = torch.Generator().manual_seed(3)
    batch, length, stride, vocab = 3, 11, 6, 300
    windows = Windows(length + stride * 2 * batch, length, stride)
    context = windows.first_row(1)  # the rows windows after the first do not score
    assert context == 4
    ids = torch.randint(0, vocab, (batch, length), generator=generator)
    reference = 4 * torch.randn(batch, length, vocab, generator=generator)
    candidate = reference + scale * torch.randn(batch, length, vocab, generator=generator)
    if peaked:  # every other token below e^-140 for the reference; the candidate's favourite
        reference[..., 7] += 150.0
        candidate[..., 7] += 150.0
        candidate[..., 8] += 200.0
    held = _Reference(reference, ids, batch, windows, first=1)
    held._ROWS = 4  # several pieces a window
    kl, nll, agree = held.against(candidate)

    def scored(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, context:-1].reshape(-1, vocab).double()

    logp = torch.log_softmax(scored(reference), -1)
    logq = torch.log_softmax(scored(candidate), -1)
    targets = ids[:, context + 1 :].reshape(-1, 1)
    rows = len(targets)
    expected = float((logp.exp() * (logp - logq)).sum())
    assert expected > 1e-7 * rows
    assert kl == pytest.approx(expected, rel=1e-4, abs=1e-10 * rows)
    assert nll == pytest.approx(-float(logq.gather(1, targets).sum()), rel=0, abs=1e-6 * rows)
    assert agree == int((logq.argmax(-1) == logp.argmax(-1)).sum())
    assert agree == (0 if peaked else agree) and (scale < 1 or agree < rows)
    assert held.nll == pytest.approx(-float(logp.gather(1, targets).sum()), rel=1e-12)
    assert abs(held.against(reference + 5.0)[0]) < 1e-7 * rows  # a shift of every logit changes nothing
