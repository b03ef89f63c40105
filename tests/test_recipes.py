"""Configs that serialise, recipes of steps, one harness: `coreopt apply` reproduces the single
commands byte for byte, and every bad recipe is one line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import SAMPLES
from test_compress_pt2 import CONFIGS

from coreai_opt._errors import ConfigError
from coreai_opt.compression import (
    DType,
    Override,
    PalettizeConfig,
    QuantizeConfig,
    SparsifyConfig,
    config_from_dict,
    flag_names,
)
from coreai_opt.recipes import Budget, Cast, Compress, Convert, Recipe, apply_recipe, compress_file


def _digest(path: Path) -> str:
    files = (
        [path]
        if path.is_file()
        else sorted(p for p in path.rglob("*") if p.is_file() and p.name != "metadata.json")
    )
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.read_bytes())
    return digest.hexdigest()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_config_round_trips_through_json(name: str) -> None:
    config = CONFIGS[name]
    assert config_from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_overrides_and_methods_round_trip_through_yaml(tmp_path: Path) -> None:
    config = PalettizeConfig(
        n_bits=3, granularity="grouped", group_size=16,
        overrides=(Override.of("embed*", skip=True), Override.of("layers.0.*", n_bits=8, lut_dtype=DType.INT8)),
    )  # fmt: skip
    recipe = Recipe((Compress(config=config), Cast(to="fp16", ignored_ops=("aten.exp.default",)), Convert()))
    for suffix in (".yaml", ".json"):
        path = recipe.save(tmp_path / f"r{suffix}")
        assert Recipe.load(path) == recipe
    text = (tmp_path / "r.yaml").read_text()
    assert "kind: palettize" in text and "pattern: embed*" in text


def test_configs_are_built_by_keyword_and_errors_name_the_field() -> None:
    with pytest.raises(TypeError):
        QuantizeConfig(DType.INT8)  # type: ignore[misc]
    with pytest.raises(ConfigError) as refused:
        config_from_dict({"kind": "sparsify", "n_m_ratio": [2, 4], "quantise_dtype": "int8"})
    assert refused.value.fields == ("quantise_dtype",)
    with pytest.raises(ConfigError) as refused:
        config_from_dict({"kind": "quantize", "version": 9})
    assert refused.value.fields == ("version",)
    with pytest.raises(ConfigError) as refused:
        config_from_dict({"kind": "quantize", "dtype": "int9"})
    assert refused.value.fields == ("dtype",)
    assert (
        flag_names(SparsifyConfig)["n_m_ratio"] == "--nm"
        and flag_names(PalettizeConfig)["n_bits"] == "--nbits"
    )


def test_a_recipe_does_what_its_steps_do_one_by_one(tmp_path: Path) -> None:
    """palettize -> cast -> convert in one recipe equals the three commands run one after another."""
    from coreai_opt.recipes import cast_file, convert_file

    config = PalettizeConfig(n_bits=4, granularity="channel")
    lut = compress_file(SAMPLES / "transformer.pt2", tmp_path / "a.lut4.pt2", config).output
    cast = cast_file(lut, "fp16", tmp_path / "a.fp16.pt2").output
    stepwise = convert_file(cast, tmp_path / "a.aimodel").output
    recipe = Recipe((Compress(config=config), Cast(to="fp16"), Convert()))
    result = apply_recipe(recipe, SAMPLES / "transformer.pt2", tmp_path / "b.aimodel")
    assert result.written and [kind for kind, _ in result.steps] == ["compress", "cast", "convert"]
    assert _digest(result.output) == _digest(stepwise)
    default = apply_recipe(recipe, SAMPLES / "transformer.pt2", None, force=True).output
    assert default.name == "transformer.lut4.fp16.aimodel"
    import shutil

    shutil.rmtree(default)


def test_the_single_commands_are_one_step_recipes(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    single = coreopt("palettize", SAMPLES / "mlp.pt2", "--nbits", "2", "--granularity", "channel", "--threshold", "0",
                     "-o", tmp_path / "single.pt2")  # fmt: skip
    assert single.exit_code == 0, single.stderr
    recipe = Recipe((Compress(config=PalettizeConfig(n_bits=2, granularity="channel", weight_num_threshold=0,
                                                     num_kmeans_workers=0)),))  # fmt: skip
    path = recipe.save(tmp_path / "r.json")
    applied = coreopt("apply", path, SAMPLES / "mlp.pt2", "-o", tmp_path / "applied.pt2", "--json")
    assert applied.exit_code == 0, applied.stderr
    document = json.loads(applied.stdout)
    assert document["written"] and document["steps"][0]["step"] == "compress"
    assert _digest(tmp_path / "single.pt2") == _digest(tmp_path / "applied.pt2")


def test_a_failed_budget_writes_nothing_and_exits_1(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    recipe = Recipe(
        (Compress(config=QuantizeConfig(dtype="int8", weight_num_threshold=0)), Budget(max_bytes=10))
    )
    path = recipe.save(tmp_path / "r.yaml")
    result = coreopt("apply", path, SAMPLES / "mlp.pt2", "-o", tmp_path / "out.pt2")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "budget failed" in lines[0] and "nothing written" in lines[0]
    assert not (tmp_path / "out.pt2").exists()


@pytest.mark.parametrize(
    "text, problem",
    [
        ("steps: [{smash: {}}]", "unknown recipe step 'smash'"),
        ("steps: [{compress: {config: {kind: quantize, dtyp: int8}}}]", "has no option 'dtyp'"),
        ("steps: []", "at least one step"),
        ("steps: [{convert: {}}, {cast: {}}]", "put it before the convert step"),
        ("{[", "not a readable recipe"),
        ("version: 7\nsteps: [{convert: {}}]", "recipe version 7"),
    ],
)
def test_a_bad_recipe_is_one_line(text: str, problem: str, tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = coreopt("apply", path, SAMPLES / "mlp.pt2", "-o", tmp_path / "out.aimodel")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0], result.stderr
    assert "Traceback" not in result.stderr and sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]
