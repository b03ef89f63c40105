"""Every sample model casts to 16 bits, runs, agrees with fp32, converts, and runs on Core AI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from _casting import cast_count, foldable_cast_pairs, meta_mismatches, run_cast
from conftest import SAMPLE_NAMES, SAMPLES, run_aimodel

from coreai_opt.casting import CastTarget, cast_program, compare_programs, random_inputs
from coreai_opt.io import load_pt2, save_aimodel, save_pt2


@pytest.mark.parametrize("name", SAMPLE_NAMES)
@pytest.mark.parametrize("target", list(CastTarget))
def test_sample_casts_runs_and_agrees_with_fp32(name: str, target: CastTarget) -> None:
    original, program = load_pt2(SAMPLES / f"{name}.pt2"), load_pt2(SAMPLES / f"{name}.pt2")
    inputs = random_inputs(original, seed=3)
    cast_program(program, target)
    program.graph.lint()
    program.validate()
    assert meta_mismatches(program, *inputs) == []
    assert foldable_cast_pairs(program) == []
    check = compare_programs(original, program, inputs, "test")
    assert check.ok, check.outputs
    assert all(o.cosine > 0.9995 for o in check.outputs)


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_casting_twice_changes_nothing_the_second_time(name: str) -> None:
    program = load_pt2(SAMPLES / f"{name}.pt2")
    cast_program(program, CastTarget.BOTH)
    code, casts = program.graph_module.code, cast_count(program)
    state = {k: v.clone() for k, v in program.state_dict.items()}
    report = cast_program(program, CastTarget.BOTH)
    assert program.graph_module.code == code and cast_count(program) == casts
    assert all(torch.equal(state[k], v) and state[k].dtype == v.dtype for k, v in program.state_dict.items())
    assert report.casts_inserted == 0 and report.casts_removed == 0


@pytest.mark.parametrize("name", ["transformer", "wide_range"])
def test_cast_program_saves_converts_and_runs_on_core_ai(name: str, tmp_path: Path) -> None:
    program = load_pt2(SAMPLES / f"{name}.pt2")
    inputs = random_inputs(program, seed=5)
    cast_program(program, CastTarget.BOTH)
    saved = save_pt2(program, tmp_path / f"{name}.16bit.pt2")
    reloaded = load_pt2(saved)
    expected = run_cast(reloaded, *inputs)
    assert expected.dtype == torch.float16
    from coreai_opt.conversion import convert_exported_program

    asset = save_aimodel(convert_exported_program(reloaded), tmp_path / f"{name}.aimodel")
    names = [s.arg.name for s in reloaded.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    feed = {
        n: t.numpy().astype(np.float16) if t.dtype.is_floating_point else t.numpy().astype(np.int32)
        for n, t in zip(names, inputs, strict=True)
    }
    got = next(iter(run_aimodel(asset, feed).values()))
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), expected.float().numpy(), atol=5e-3, rtol=5e-3)
