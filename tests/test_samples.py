"""Rebuilding the sample models reproduces the committed ones: same graphs, same weights."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import SAMPLE_NAMES, SAMPLES, constant_records, load_sample_builder

from coreai_opt import _coreai
from coreai_opt.io import load_aimodel, load_pt2


def _ops(program) -> list[tuple[str, tuple[str, ...]]]:  # type: ignore[no-untyped-def]
    module = _coreai.mlir_module(program)
    return [(op.name, tuple(str(r.type) for r in op.results)) for op in _coreai.walk_ops(module)]


def test_rebuild_reproduces_committed_samples(tmp_path: Path) -> None:
    builder = load_sample_builder()
    builder.build_all(tmp_path)
    total = 0
    for name in SAMPLE_NAMES:
        committed, rebuilt = load_pt2(SAMPLES / f"{name}.pt2"), load_pt2(tmp_path / f"{name}.pt2")
        assert rebuilt.graph_module.code == committed.graph_module.code, name
        assert rebuilt.state_dict.keys() == committed.state_dict.keys()
        for key, tensor in committed.state_dict.items():
            assert torch.equal(rebuilt.state_dict[key], tensor), (name, key)
        for key, tensor in committed.constants.items():
            assert torch.equal(rebuilt.constants[key], tensor), (name, key)

        asset_a, asset_b = (
            load_aimodel(SAMPLES / f"{name}.aimodel"),
            load_aimodel(tmp_path / f"{name}.aimodel"),
        )
        assert _ops(asset_b) == _ops(asset_a), name
        assert constant_records(asset_b) == constant_records(asset_a), name
        total += sum(f.stat().st_size for f in (SAMPLES / f"{name}.aimodel").iterdir())
        total += (SAMPLES / f"{name}.pt2").stat().st_size
    assert total < 5_000_000


def test_sample_features_are_present() -> None:
    """Each sample carries the feature it exists for."""
    transformer = load_pt2(SAMPLES / "transformer.pt2")
    targets = {str(n.target) for n in transformer.graph.nodes if n.op == "call_function"}
    assert {"aten.embedding.default", "aten.arange.start_step", "aten.gelu.default"} <= targets
    fills = [
        n.args[-1]
        for n in transformer.graph.nodes
        if "masked_fill" in str(n.target) or "where" in str(n.target)
    ]
    assert fills, "attention masks are applied in the graph"

    wide = load_pt2(SAMPLES / "wide_range.pt2")
    assert max(float(t.detach().abs().max()) for t in wide.state_dict.values()) >= 1e6
    scalars = [a for n in wide.graph.nodes for a in n.args if isinstance(a, float)]
    assert 1e5 in scalars

    ints = load_pt2(SAMPLES / "int_arith.pt2")
    user_input = next(n for n in ints.graph.nodes if n.op == "placeholder" and n.name == "ids")
    assert user_input.meta["val"].dtype == torch.int64
    int_ops = [
        n
        for n in ints.graph.nodes
        if str(n.target) in {"aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor"}
        and all(isinstance(a, torch.fx.Node) for a in n.args[:2])
        and n.meta["val"].dtype == torch.int64
    ]
    assert len(int_ops) >= 3
