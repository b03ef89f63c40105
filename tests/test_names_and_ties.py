"""Weights carry their module's qualified name through conversion (reports and overrides use it), and
a tied embedding (one tensor for the lookup and the lm_head) is stored and compressed once."""

from __future__ import annotations

from pathlib import Path

import pytest
from _architectures import MATRIX, export

from coreai_opt.comparison import compare_files
from coreai_opt.compression import Override, PalettizeConfig, SkipKind
from coreai_opt.io import load_pt2, save_pt2
from coreai_opt.recipes import compress_file, convert_file

GPT2 = next(a for a in MATRIX if a.name == "gpt2")  # lm_head.weight = wte.weight


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("gpt2")
    pt2 = save_pt2(export(GPT2), folder / "gpt2.pt2")
    return pt2, convert_file(pt2, folder / "gpt2.aimodel").output


def _float_state(path: Path) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in load_pt2(path).state_dict.items() if v.is_floating_point()}


def test_converted_weights_carry_the_module_names_and_overrides_match_them(
    gpt2: tuple[Path, Path], tmp_path: Path
) -> None:
    pt2, aimodel = gpt2
    state = _float_state(pt2)
    skip = Override.of("blocks.1.*", skip=True)
    config = PalettizeConfig(n_bits=4, weight_num_threshold=1024, overrides=(skip,))
    on_core_ai = compress_file(aimodel, tmp_path / "a.aimodel", config).report
    on_torch = compress_file(pt2, tmp_path / "a.pt2", config).report
    names = {w.name for w in on_core_ai.weights}
    # the converter folds the position lookup wpe(arange(t)) into a constant: no wpe.weight there;
    # the tied table is one tensor, named after the first of its names
    assert names - {"wte.weight"} == {w.name for w in on_torch.weights} - {"lm_head.weight", "wpe.weight"}
    assert names <= set(state) and "blocks.0.attn.out_proj.weight" in names and "wte.weight" in names
    for report in (on_core_ai, on_torch):
        excluded = sorted(s.name for s in report.skipped if s.kind is SkipKind.OVERRIDE)
        assert excluded == [
            "blocks.1.attn.in_proj_weight", "blocks.1.attn.out_proj.weight", "blocks.1.mlp.0.weight",
            "blocks.1.mlp.2.weight",
        ]  # fmt: skip
        assert report.unmatched_overrides == []


def test_a_tied_embedding_is_compressed_once_and_both_containers_still_run(
    gpt2: tuple[Path, Path], tmp_path: Path
) -> None:
    pt2, aimodel = gpt2
    table = (256, 64)
    config = PalettizeConfig(n_bits=4, granularity="channel")
    # .pt2: torch.export reads the tensor through lm_head.weight and leaves wte.weight unused
    result = compress_file(pt2, tmp_path / "g.lut4.pt2", config)
    compressed = {w.name: w.shape for w in result.report.weights}
    assert compressed["lm_head.weight"] == table and "wte.weight" not in compressed
    tied = next(s for s in result.report.skipped if s.name == "wte.weight")
    assert tied.reason == "tied to lm_head.weight (one tensor): stored, and compressed, with it"
    assert tied.nbytes == 0  # counted once, under lm_head.weight
    left = _float_state(result.output)
    assert "wte.weight" not in left and "lm_head.weight" not in left  # no full-size copy stays
    assert compare_files(pt2, result.output).worst_cosine > 0.99
    converted = convert_file(result.output, tmp_path / "g.lut4.aimodel").output
    assert compare_files(aimodel, converted).worst_cosine > 0.99
    # .aimodel: the converter keeps one constant for the lookup and (transposed) the lm_head
    direct = compress_file(aimodel, tmp_path / "d.lut4.aimodel", config)
    assert [w.name for w in direct.report.weights if w.shape == table].count("wte.weight") == 1
    assert compare_files(aimodel, direct.output).worst_cosine > 0.99
