"""Configs that serialise, recipes of steps, one harness: `coreopt apply` reproduces the single
commands byte for byte, and every bad recipe is one line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import SAMPLES
from test_compress_pt2 import CONFIGS

from coreai_opt.calibration import CalibrationSpec
from coreai_opt.compression import (
    DType,
    Override,
    PalettizeConfig,
    QuantizeConfig,
    SparsifyConfig,
    config_from_dict,
    flag_names,
)
from coreai_opt.errors import ConfigError
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


def _refused(coreopt, recipe: Path) -> str:  # type: ignore[no-untyped-def]
    """`coreopt apply` on a bad recipe: exit 1, one stderr line naming the recipe, nothing written;
    the problem that line gives."""
    out = recipe.parent / "out.pt2"
    result = coreopt("apply", recipe, SAMPLES / "mlp.pt2", "-o", out)
    assert result.exit_code == 1, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"error: {recipe}: "), result.stderr
    assert not out.exists() and sorted(p.name for p in recipe.parent.iterdir()) == [recipe.name]
    return result.stderr[len(f"error: {recipe}: ") : -1]


def test_a_recipe_of_more_steps_than_any_real_one_is_refused_before_a_step_is_read(
    tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    from coreai_opt.recipes._values import MAX_STEPS

    steps = [{"budget": {"max_bytes": 10**9}}] * MAX_STEPS
    path = tmp_path / "ok" / "r.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"steps": steps}))
    applied = coreopt("apply", path, SAMPLES / "mlp.pt2", "-o", path.parent / "out.pt2", "--json")
    assert applied.exit_code == 0 and len(json.loads(applied.stdout)["steps"]) == MAX_STEPS, applied.stderr
    hostile = tmp_path / "hostile" / "r.json"  # 2,000 steps in 80 KB; the last one not even a step
    hostile.parent.mkdir()
    hostile.write_text(json.dumps({"steps": [{"budget": {"max_bytes": 10**9}}] * 1999 + ["smash"]}))
    assert _refused(coreopt, hostile) == f"a recipe has at most {MAX_STEPS} steps, not 2000"
    with pytest.raises(ConfigError, match=f"at most {MAX_STEPS} steps, not {MAX_STEPS + 1}"):
        Recipe((Convert(),) * (MAX_STEPS + 1))


@pytest.mark.parametrize(
    "name, text, problem",
    [
        ("r.json", '{"steps": [{"budget": {"max_bytes": 1e400}}]}',
         "steps[0].budget.max_bytes: numbers are finite, not inf"),
        ("r.yaml", "steps: [{budget: {max_bytes: 1e400}}]",  # YAML 1.1 reads 1e400 as a string
         "step 1 (budget): max_bytes must be an integer, not '1e400'"),
        ("r.yaml", "steps: [{budget: {max_bytes: true}}]", "step 1 (budget): max_bytes must be an integer, not True"),
        ("r.yaml", "steps: [{budget: {max_bytes: -1}}]", "step 1 (budget): max_bytes must be 0 or more, not -1"),
        ("r.yaml", "steps: [{budget: {}}]", "step 1 (budget): a budget step needs max_bytes"),
        ("r.json", '{"steps": [{"budget": {"max_bytes": 100000000000000000000}}]}',
         "steps[0].budget.max_bytes: integers fit in 64 bits, not 100000000000000000000"),
        ("r.yaml", "steps: [{cast: {ignored_ops: aten.exp.default}}]",
         "step 1 (cast): ignored_ops must be a list, not 'aten.exp.default'"),
        ("r.yaml", "steps: [{cast: {check: 'no'}}]", "step 1 (cast): check must be true or false, not 'no'"),
        ("r.yaml", "steps: [{cast: {seed: -1}}]", "step 1 (cast): seed must be 0 or more, not -1"),
        ("r.yaml", "steps: [{cast: {inputs: 7}}]", "step 1 (cast): inputs must be a string, not 7"),
        ("r.yaml", "steps: [{compress: {config: {kind: palettize, n_bits: 4.0}}}]",
         "step 1 (compress): config.n_bits must be an integer, not 4.0"),
        ("r.yaml", "steps: [{compress: {config: {kind: palettize, overrides: [{pattern: 'a*', skip: 'no'}]}}}]",
         "step 1 (compress): config.overrides[0].skip must be true or false, not 'no'"),
        ("r.yaml", "steps: [{compress: {config: {kind: palettize, overrides: [{pattern: 'a*', n_bits: 8.5}]}}}]",
         "step 1 (compress): config.overrides[0].n_bits must be an integer, not 8.5"),
        ("r.yaml", "steps: [{compress: {config: {kind: sparsify, n_m_ratio: [2, 4, 8]}}}]",
         "step 1 (compress): config.n_m_ratio must be a list of 2 items, not [2, 4, 8]"),
        ("r.yaml", "steps: [{compress: {config: {kind: sparsify, target_sparsity: .nan}}}]",
         "steps[0].compress.config.target_sparsity: numbers are finite, not nan"),
        ("r.yaml", "steps: [{compress: {config: {kind: quantize, version: true}}}]",
         "step 1 (compress): config.version must be an integer, not True"),
        ("r.yaml", "steps: [{compress: {config: {kind: [quantize]}}}]",
         "step 1 (compress): config.kind must be one of quantize, palettize, sparsify, not ['quantize']"),
        ("r.yaml", "steps: [{compress: {config: {kind: quantize}, calibration_samples: 0}}]",  # an older recipe's
         "calibration: samples must be an integer of 1 or more, not 0"),
        ("r.yaml", "steps: [{quantize_activations: {calibration: random, activations: 5}}]",
         "step 1 (quantize_activations): activations must be a mapping of options, not 5"),
        ("r.yaml", "steps: [{quantize_activations: {calibration: random, activations: {percentil: 99}}}]",
         "step 1 (quantize_activations): activations: ActivationConfig has no option 'percentil'"),
        ("r.yaml", "steps: [{quantize_activations: {calibration: random, weights: {kind: quantize, block_size: '32'}}}]",
         "step 1 (quantize_activations): weights.block_size must be an integer, not '32'"),
        ("r.yaml", "steps: [{quantize_activations: {calibration: random, config: {}}}]",
         "step 1 (quantize_activations): a quantize_activations step has no option 'config'"),
        ("r.yaml", "steps: [{quantize_activations: {}}]",
         "step 1 (quantize_activations): a quantize_activations step needs calibration"),
        ("r.yaml", "steps: [{convert: {1: x, a: y}}]", "steps[0].convert: keys are strings of at most 4096 characters, not 1"),
        ("r.yaml", "steps: [{convert: {}}]\nwhen: 2024-01-01", "when: a recipe holds no date values"),
        ("r.yaml", "version: true\nsteps: [{convert: {}}]", "recipe version True is not 1"),
        ("r.json", '{"steps": [{"cast": {"inputs": "' + "x" * 5000 + '"}}]}',
         "steps[0].cast.inputs: at most 4096 characters, not 5000"),
    ],
)  # fmt: skip
def test_every_value_of_every_step_is_type_checked_when_read(
    name: str, text: str, problem: str, tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / name
    path.write_text(text)
    assert _refused(coreopt, path) == problem


def test_steps_made_in_python_are_checked_too() -> None:
    for make, problem in [
        (lambda: Budget(max_bytes=float("inf")), "max_bytes must be an integer, not inf"),
        (lambda: Cast(ignored_ops="aten.exp.default"), "ignored_ops must be a list, not 'aten.exp.default'"),
        (lambda: Recipe((Compress(config=QuantizeConfig()),), CalibrationSpec(source="random", tokens=True)),
         "tokens is a count of 1 or more or 'all', not True"),
        (lambda: Compress(config={"kind": "quantize"}),
         "config must be a WeightConfig, not {'kind': 'quantize'}"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError) as refused:
            make()
        assert str(refused.value) == problem


@pytest.mark.parametrize(
    "name, text, problem",
    [
        ("r.json", "[" * 100_000 + "]" * 100_000, "not a readable recipe (nested too deeply)"),
        ("r.yaml", "steps: " + "[" * 40 + "]" * 40, "line 1: a recipe nests at most 16 levels deep"),
        ("r.yaml", "a: &a [*a]\nsteps: [{convert: {}}]", "a" + "[0]" * 16 + ": a recipe nests at most 16 levels deep"),
    ],
)  # fmt: skip
def test_a_recipe_nested_deep_is_one_line(
    name: str, text: str, problem: str, tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / name
    path.write_text(text)
    assert _refused(coreopt, path) == problem


def test_a_yaml_recipe_nested_100000_deep_is_one_line(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "r.yaml"
    path.write_text("steps: " + "[" * 100_000 + "]" * 100_000)
    problem = _refused(coreopt, path)  # libyaml's own limit (1,000) or ours, whichever reader runs
    assert "nest" in problem and "Recursion" not in problem, problem


def test_yaml_aliases_cannot_multiply_a_small_recipe(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    """Five levels of 16 aliases each: a few hundred bytes that are a million values once expanded."""
    lines = ["a0: &a0 [" + ", ".join(["1"] * 16) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 16) + "]" for i in range(1, 5)]
    path = tmp_path / "r.yaml"
    path.write_text("\n".join([*lines, "steps: [{convert: {}}]"]))
    assert (
        _refused(coreopt, path)
        == "a recipe holds at most 262144 values (an alias counts each time it is used)"
    )


def test_a_recipe_file_larger_than_any_real_one_is_not_read(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    from coreai_opt.recipes._values import MAX_FILE_BYTES

    path = tmp_path / "r.json"
    path.write_text('{"steps": [{"convert": {}}]}' + " " * MAX_FILE_BYTES)  # valid JSON, padded
    assert _refused(coreopt, path) == "a recipe file is at most 4 MiB; this one is larger"


def test_yaml_recipes_are_read_with_a_safe_loader(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path.parent / f"{tmp_path.name}-pwned"
    path = tmp_path / "r.yaml"
    path.write_text(f'steps: [{{cast: {{to: !!python/object/apply:os.system ["touch {marker}"]}}}}]')
    problem = _refused(coreopt, path)
    assert problem.startswith("not a readable recipe (could not determine a constructor for the tag")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '{"kind": "quantize", "dtype": "int8", "weight_num_threshold": true}',
            "weight_num_threshold must be",
        ),
        ('{"kind": "quantize", "weight_num_threshold": 1e400}', "numbers are finite"),
        ('{"kind": "quantize", "x": ' + "[" * 5000 + "]" * 5000 + "}", "nested too deeply"),
    ],
)
def test_a_config_file_for_sensitivity_or_optimize_is_read_as_a_recipe_is(
    text: str, problem: str, tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    """`sensitivity --config FILE` (and optimize's `NAME=FILE` candidates) take a compression config
    from a file within a recipe file's bounds, every value type-checked: exit 1, one line naming it."""
    config = tmp_path / "int8.json"
    config.write_text(text)
    result = coreopt(
        "sensitivity", SAMPLES / "mlp.pt2", "--config", config, "--tokens", tmp_path / "ids.safetensors"
    )
    assert result.exit_code == 1, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"error: {config}: "), result.stderr
    assert problem in result.stderr


def test_a_recipe_too_large_to_read_back_is_not_written(tmp_path: Path) -> None:
    """`Recipe.save` writes only what `Recipe.load` reads back (optimize saves the recipes it plans)."""
    from coreai_opt.compression import Override
    from coreai_opt.recipes._values import MAX_FILE_BYTES

    overrides = tuple(
        Override(f"layers.{i}.mlp.up_proj.weight" + "x" * 200, skip=True) for i in range(16_000)
    )
    recipe = Recipe((Compress(config=QuantizeConfig(dtype="int8", overrides=overrides)),))
    with pytest.raises(ConfigError, match=f"at most {MAX_FILE_BYTES >> 20} MiB"):
        recipe.save(tmp_path / "big.json")
    assert list(tmp_path.iterdir()) == []


def test_a_w8a8_step_keeps_its_per_module_and_per_op_type_entries(tmp_path: Path) -> None:
    """W8A8's whole config travels through a recipe file: the entries that leave a module or an op
    type in float (or give it its own settings) are read back as they were written."""
    from coreai_opt.quantization import ActivationConfig, OpConfig, QuantizerConfig
    from coreai_opt.recipes import QuantizeActivations

    own = OpConfig(
        QuantizeConfig(dtype="int8", weight_num_threshold=0), ActivationConfig(observer="percentile")
    )
    config = QuantizerConfig(OpConfig(), {"layers.0.*": None, "head": own}, {"matmul": None})
    step = QuantizeActivations(config=config, calibration="random", calibration_samples=4)
    assert QuantizerConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    for suffix in (".yaml", ".json"):
        path = Recipe((step,)).save(tmp_path / f"w8a8{suffix}")
        assert Recipe.load(path) == Recipe((step,))
    text = (tmp_path / "w8a8.yaml").read_text()
    assert "layers.0.*" in text and "matmul" in text and "percentile" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [{quantize_activations: {calibration: random, op_type_configs: [{op_type: 5}]}}]")
    from coreai_opt.io import ModelFileError

    with pytest.raises(
        ModelFileError, match=r"bad\.yaml: step 1 \(quantize_activations\): an entry of op_type_configs is"
    ):
        Recipe.load(bad)


def test_calibration_is_set_once_for_the_recipe_and_older_recipes_still_read(tmp_path: Path) -> None:
    """Every compress step that learns reads the recipe's one CalibrationSpec; a recipe written when
    each compress step held its own calibration is read into the same recipe (its steps must agree)."""
    gptq = Compress(config=QuantizeConfig(dtype="int4", method="gptq", weight_num_threshold=0))
    recipe = Recipe((gptq,), CalibrationSpec(source="random", samples=4))
    assert recipe.to_dict()["calibration"] == {"source": "random", "samples": 4}
    assert Recipe.load(recipe.save(tmp_path / "new.yaml")) == recipe
    step = {"config": gptq.config.to_dict(), "calibration": "random", "calibration_samples": 4}
    assert Recipe.from_dict({"steps": [{"compress": step}]}) == recipe
    other = dict(step, calibration_samples=8)
    with pytest.raises(ConfigError, match="set once, at its top level"):
        Recipe.from_dict({"steps": [{"compress": step}, {"compress": other}]})
    result = apply_recipe(recipe, SAMPLES / "mlp.pt2", tmp_path / "out.pt2")
    learned = result.steps[0][1].report.weights
    assert learned and all(w.learned is not None for w in learned)  # GPTQ took the recipe's samples
