"""`coreopt convert`: the asset runs on the Core AI runtime and computes what the export computes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _hostile import tree_digest
from conftest import SAMPLES, copy_sample, run_aimodel

from coreai_opt.io import load_aimodel, load_pt2


def _inputs(program, seed: int) -> tuple[torch.Tensor, ...]:  # type: ignore[no-untyped-def]
    generator = torch.Generator().manual_seed(seed)
    tensors = []
    for spec in program.graph_signature.input_specs:
        if spec.kind.name != "USER_INPUT":
            continue
        val = next(n for n in program.graph.nodes if n.name == spec.arg.name).meta["val"]
        if val.dtype.is_floating_point:
            tensors.append(torch.randn(val.shape, generator=generator))
        else:
            tensors.append(torch.randint(0, 50, val.shape, generator=generator, dtype=val.dtype))
    return tuple(tensors)


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "int_arith"])
def test_converted_program_matches_the_export(name: str, tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    source = copy_sample(name, "pt2", tmp_path)
    digest = tree_digest(source)
    result = coreopt("convert", source, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    output = Path(doc["output"])
    assert output == source.with_suffix(".aimodel")
    assert tree_digest(source) == digest

    program = load_pt2(source)
    inputs = _inputs(program, seed=3)
    expected = program.module()(*inputs)
    names = [t["name"] for t in doc["model"]["inputs"]]
    feed = {
        n: t.numpy().astype(np.int32 if not t.is_floating_point() else np.float32)
        for n, t in zip(names, inputs, strict=True)
    }
    got = next(iter(run_aimodel(output, feed).values()))
    np.testing.assert_allclose(got, expected.detach().numpy(), rtol=1e-4, atol=1e-4)


def test_convert_refuses_then_overwrites_with_force(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    source = copy_sample("mlp", "pt2", tmp_path)
    first = coreopt("convert", source)
    assert first.exit_code == 0, first.stderr
    assert "Converted" in first.stdout
    again = coreopt("convert", source)
    assert again.exit_code == 1
    forced = coreopt("convert", source, "--force")
    assert forced.exit_code == 0, forced.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.aimodel", "mlp.pt2"]


def test_sample_asset_equals_fresh_conversion() -> None:
    """The committed asset computes what the committed export computes."""
    program = load_pt2(SAMPLES / "wide_range.pt2")
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    expected = program.module()(x).detach().numpy()
    got = run_aimodel(SAMPLES / "wide_range.aimodel", {"x": x.numpy()})
    np.testing.assert_allclose(next(iter(got.values())), expected, rtol=1e-5, atol=1e-5)


def test_every_converted_weight_carries_its_module_name_folded_batch_norms_too() -> None:
    """The converter folds bn1/bn2 into conv1/conv2: those weights and biases keep the conv's name
    (`.bn_folded` says what they hold); no two constants share a name."""
    from coreai_opt.compression import container_of
    from coreai_opt.conversion import convert_exported_program

    program = convert_exported_program(load_pt2(SAMPLES / "cnn.pt2"))
    names = [c.name for c in container_of(program).candidates() if c.shape]  # not the pad scalar
    assert sorted(names) == [
        "conv1.bias.bn_folded", "conv1.weight.bn_folded", "conv2.bias.bn_folded", "conv2.weight.bn_folded",
        "head.bias", "head.weight",
    ]  # fmt: skip
    committed = [c.name for c in container_of(load_aimodel(SAMPLES / "cnn.aimodel")).candidates() if c.shape]
    assert sorted(committed) == sorted(names)
