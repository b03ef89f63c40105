"""Agreement numbers never look better than the outputs, and check inputs look like real data."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SAMPLES
from torch import nn

from coreai_opt._agreement import agreement
from coreai_opt.casting import check_inputs, first_overflows
from coreai_opt.inputs import Draw
from coreai_opt.io import load_pt2, save_pt2
from coreai_opt.recipes import cast_file

# ----- the metrics ----------------------------------------------------------------------------------


def test_all_nan_on_both_sides_measures_nothing_and_fails() -> None:
    nan = np.full(384, np.nan)
    m = agreement(nan, nan.copy())
    assert (m.positions, m.finite, m.nan_both, m.nonfinite_mismatches) == (384, 0, 384, 0)
    assert m.cosine is None and m.snr_db is None and m.max_abs_error is None and m.relative_error is None
    assert not m.measured and not m.exact
    assert not m.passes(-1.0)
    assert m.nonfinite_summary() == "NaN in both: 384/384"
    doc = m.to_dict()
    assert doc["cosine"] is None and doc["snr_db"] is None and doc["exact"] is False
    assert doc["nonfinite"] == "NaN in both: 384/384"


def test_metrics_cover_only_finite_positions_and_say_so() -> None:
    reference = np.array([1.0, 2.0, np.inf, np.nan, 3.0, -np.inf])
    candidate = np.array([1.0, 2.0, np.inf, 5.0, 3.5, np.inf])
    m = agreement(reference, candidate)
    assert (m.positions, m.finite) == (6, 3)
    assert (m.nonfinite_reference, m.nonfinite_candidate, m.same_nonfinite, m.nan_both) == (3, 2, 1, 0)
    assert m.nonfinite_mismatches == 3  # NaN vs 5, -inf vs inf (counted on both sides), once each
    assert m.max_abs_error == 0.5 and math.isclose(m.relative_error, 0.5 / 3)
    assert m.cosine is not None and m.cosine < 1
    assert not m.passes(0.0)  # inf/NaN anywhere fails any threshold
    assert (
        m.nonfinite_summary()
        == "same inf in both: 1/6; reference-only inf/NaN: 2/6; candidate-only inf/NaN: 1/6"
    )


def test_identical_finite_outputs_are_exact_even_all_zero() -> None:
    zeros = np.zeros(10)
    m = agreement(zeros, zeros)
    assert m.exact and m.cosine == 1.0 and m.snr_db == math.inf and m.passes(0.9999)
    assert m.to_dict()["snr_db"] is None and m.to_dict()["exact"] is True


# ----- compare on all-NaN programs ----------------------------------------------------------------


class AlwaysNaN(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(-(x * x) - 1.0)  # log of a negative number: NaN for every input


def test_compare_fails_min_cosine_when_both_sides_are_nan(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    import coreai_torch

    from coreai_opt.conversion import convert_exported_program
    from coreai_opt.io import save_aimodel

    program = torch.export.export(AlwaysNaN(), (torch.randn(4, 96),)).run_decompositions(
        coreai_torch.get_decomp_table()
    )
    a = save_aimodel(convert_exported_program(program), tmp_path / "a.aimodel")
    b = shutil.copytree(a, tmp_path / "b.aimodel")  # the same program, another file
    result = coreopt("compare", a, b, "--min-cosine", "0.5")
    assert result.exit_code == 1
    assert "NaN in both: 384/384" in result.stdout
    assert "n/a" in result.stdout
    doc = json.loads(coreopt("compare", a, b, "--min-cosine", "0.5", "--json").stdout)
    (out,) = doc["outputs"]
    assert out["ok"] is False and out["cosine"] is None and out["nan_both"] == 384
    assert doc["worst_cosine"] is None


# ----- input policy -------------------------------------------------------------------------------


class BertLikeMask(nn.Module):
    """Hugging Face's extended attention mask: (1 - mask) * finfo.min, added to the scores."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(128, 32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        extended = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        scores = extended.expand(ids.shape[0], 4, ids.shape[1], ids.shape[1]).reshape(
            -1, ids.shape[1], ids.shape[1]
        )
        return self.attn(x, x, x, attn_mask=scores, need_weights=False)[0].mean(1)


def _export(model: nn.Module, *inputs: torch.Tensor) -> torch.export.ExportedProgram:
    import coreai_torch

    with torch.no_grad():
        return torch.export.export(model.eval(), inputs).run_decompositions(coreai_torch.get_decomp_table())


def test_an_int64_attention_mask_passes_the_default_cast_check(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ids, mask = torch.randint(0, 128, (2, 16)), torch.ones(2, 16, dtype=torch.int64)
    source = save_pt2(_export(BertLikeMask(), ids, mask), tmp_path / "bert.pt2")
    result = cast_file(source, "fp16", tmp_path / "bert.fp16.pt2")
    assert result.check is not None and result.check.ok, result.check.to_dict()
    rules = {r.name: r for r in result.check.rules}
    assert (rules["ids"].draw, rules["ids"].high) == (Draw.INDEX, 128)
    assert (rules["mask"].draw, rules["mask"].low, rules["mask"].high) == (Draw.BINARY, 0, 2)
    # the values ids took under the old policy (the mask drawn like the ids) overflow fp16 here:
    # (1 - 60) * -65504 is -inf, and a row of -inf scores is NaN
    program = load_pt2(source)
    wide = [torch.randint(1, 32, (2, 16)), torch.randint(1, 32, (2, 16))]
    from coreai_opt.casting import cast_fp32_to_fp16, compare_programs

    cast = cast_fp32_to_fp16(load_pt2(source))
    assert not compare_programs(program, cast, wide, "wide").ok


def test_policy_draws_ids_inside_their_table_and_masks_from_zero_one() -> None:
    program = load_pt2(SAMPLES / "transformer.pt2")
    tensors, source, rules = check_inputs(program, seed=7)
    by_name = dict(zip([r.name for r in rules], tensors, strict=True))
    assert source == "seeded random (seed 7)"
    assert [(r.name, r.draw) for r in rules] == [("input_ids", Draw.INDEX), ("attention_mask", Draw.BINARY)]
    assert int(by_name["input_ids"].min()) >= 0 and int(by_name["input_ids"].max()) < 256
    assert set(by_name["attention_mask"].unique().tolist()) <= {0, 1}
    assert by_name["input_ids"].dtype == torch.int64  # the program's own dtype


def test_ids_that_pass_through_arithmetic_stay_in_a_quarter_of_the_table() -> None:
    program = load_pt2(SAMPLES / "int_arith.pt2")  # index = ids + 1 before the embedding
    _, _, rules = check_inputs(program)
    (rule,) = [r for r in rules if r.draw is Draw.INDEX]
    assert (rule.low, rule.high) == (0, 32) and "after arithmetic" in rule.reason


def test_the_sample_transformer_shows_its_input_policy(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    cast = coreopt("cast", SAMPLES / "transformer.pt2", "-o", tmp_path / "t.pt2")
    assert cast.exit_code == 0
    assert "input_ids: integers in [0, 256) (indexes a table of 256 rows)" in cast.stdout
    assert "attention_mask: values in {0, 1}" in cast.stdout
    compare = coreopt("compare", SAMPLES / "transformer.aimodel", SAMPLES / "transformer.aimodel")
    assert compare.exit_code == 0
    assert "input_ids: integers in [0, 256) (indexes a table of 256 rows)" in compare.stdout
    assert "attention_mask: values in {0, 1}" in compare.stdout


# ----- naming the ops that overflow ---------------------------------------------------------------


class Overflowing(nn.Module):
    """exp of activations around 12: fine in fp32, beyond fp16's 65504 after the cast."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.fc(x) + 12.0).sum(-1)


def test_a_cast_that_overflows_names_the_op_and_suggests_ignore_op(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    source = save_pt2(_export(Overflowing(), torch.randn(4, 16)), tmp_path / "exp.pt2")
    result = coreopt("cast", source, "--to", "fp16", "-o", tmp_path / "exp.fp16.pt2")
    assert result.exit_code == 1
    assert "fp16 overflows first at:" in result.stdout and "aten.exp.default" in result.stdout
    assert "--ignore-op aten.exp.default" in result.stdout
    # with exp in fp32 its values still cannot become the fp16 input of the sum: run the sum in fp32
    second = coreopt(
        "cast", source, "--to", "fp16", "--ignore-op", "aten.exp.default", "-o", tmp_path / "b.pt2", "--json"
    )
    assert second.exit_code == 1
    (overflow,) = json.loads(second.stdout)["check"]["overflows"]
    assert overflow == {
        "node": "exp_to_fp16",
        "op": "aten.exp.default",
        "module": "",  # the top-level module
        "ignore_ops": ["aten.sum.dim_IntList"],
        "output": False,
    }
    # with both in fp32 the output itself exceeds fp16: no --ignore-op can help, and it says so
    third = coreopt(
        "cast",
        source,
        "--to",
        "fp16",
        "--ignore-op",
        "aten.exp.default",
        "--ignore-op",
        "aten.sum.dim_IntList",
        "-o",
        tmp_path / "c.pt2",
    )
    assert third.exit_code == 1
    assert "a program output whose values exceed fp16's range" in third.stdout


def test_first_overflows_finds_the_first_node_only() -> None:
    from coreai_opt.casting import cast_fp32_to_fp16

    torch.manual_seed(0)
    program = _export(Overflowing(), torch.randn(4, 16))
    original = _export(Overflowing(), torch.randn(4, 16))
    original.state_dict.update(program.state_dict)
    cast = cast_fp32_to_fp16(program)
    found = first_overflows(original, cast, [torch.randn(4, 16)])
    assert [o.op for o in found] == ["aten.exp.default"]  # not the sum that carries its inf


def test_an_overflow_names_the_module_it_happens_in() -> None:
    from coreai_opt.casting import cast_fp32_to_fp16

    class Nested(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Sequential(nn.Identity(), Overflowing())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(x)

    torch.manual_seed(0)
    model, x = Nested(), torch.randn(4, 16)
    original, program = _export(model, x), _export(model, x)
    (found,) = first_overflows(original, cast_fp32_to_fp16(program), [x])
    assert (found.op, found.module) == ("aten.exp.default", "head.1")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_cast_check_fails_when_the_reference_itself_is_not_finite(value: float, tmp_path: Path) -> None:
    class Constant(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 0 + value

    source = save_pt2(_export(Constant(), torch.randn(2, 3)), tmp_path / "c.pt2")
    result = cast_file(source, "fp16", tmp_path / "c.fp16.pt2")
    assert result.check is not None and not result.check.ok
    (out,) = result.check.outputs
    assert out.metrics.finite == 0 and out.cosine is None
    assert not result.written and not (tmp_path / "c.fp16.pt2").exists()  # a failed program is not kept
    kept = cast_file(source, "fp16", tmp_path / "c.fp16.pt2", keep_failed=True)
    assert kept.written and (tmp_path / "c.fp16.pt2").exists()
