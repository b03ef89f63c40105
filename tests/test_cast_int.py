"""INT pass: integer arithmetic on user data goes to int16; index paths and constant-foldable parts stay."""

from __future__ import annotations

import torch
from _casting import export, meta_mismatches, node, nodes_of, run_cast
from torch import nn

from coreai_opt.casting import CastTarget, OpOutcome, cast_int32_to_int16, cast_program
from coreai_opt.casting._graph import cast_target_dtype, is_cast

aten = torch.ops.aten


class IntMath(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(64, 4)

    def forward(self, a: torch.Tensor, b: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        total = a + b  # two int tensors: the seed of a castable group
        scaled = total * a
        flat = scaled.reshape(-1)
        steps = torch.arange(a.shape[-1]) - torch.arange(a.shape[-1]).flip(0)  # foldable: no user input
        index = ids + 1  # ends up indexing the embedding
        looked_up = self.table(index).sum(-1)
        return flat, looked_up + scaled.float(), steps + 0


def _inputs() -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-50, 50, (2, 6), generator=generator)
    b = torch.randint(-50, 50, (2, 6), generator=generator)
    ids = torch.randint(0, 60, (2, 6), generator=generator)
    return a, b, ids


def _cast() -> tuple[torch.export.ExportedProgram, object]:
    torch.manual_seed(0)
    model = IntMath().eval()
    inputs = _inputs()
    ep = export(model, *inputs)
    report = cast_program(ep, CastTarget.INT16)
    return ep, report


def test_arithmetic_on_user_inputs_runs_in_int16() -> None:
    ep, report = _cast()
    assert node(ep, "a").meta["val"].dtype == torch.int16
    assert node(ep, "b").meta["val"].dtype == torch.int16
    (add,) = [n for n in nodes_of(ep, aten.add.Tensor) if n.args[0] is node(ep, "a")]
    (mul,) = nodes_of(ep, aten.mul.Tensor)
    assert add.meta["val"].dtype == torch.int16 and mul.meta["val"].dtype == torch.int16
    assert mul.args[0] is add  # no cast between two castable ops: the round trip was folded
    int16_ops = {o.node for o in report.ops if o.outcome is OpOutcome.INT16}
    assert {add.name, mul.name} <= int16_ops
    # outside the group only the model's own .float() reads mul, straight from int16 (a cast needs
    # no cast back), and torch's dtype assert keeps checking mul itself, refreshed to int16
    backs = [u for u in mul.users if is_cast(u) and cast_target_dtype(u) == torch.int32]
    assert backs == []
    (check,) = [u for u in mul.users if u.target == aten._assert_tensor_metadata.default]
    assert check.args[3] == torch.int16
    assert sorted(str(cast_target_dtype(u)) for u in mul.users if is_cast(u)) == [
        "torch.float32",
        "torch.int16",
    ]


def test_index_paths_and_constant_foldable_parts_are_left_alone() -> None:
    ep, report = _cast()
    assert node(ep, "ids").meta["val"].dtype == torch.int64
    (embedding,) = nodes_of(ep, aten.embedding)
    index = embedding.args[1]
    assert index.meta["val"].dtype == torch.int64 and not is_cast(index)
    (fold,) = nodes_of(ep, aten.sub.Tensor)
    assert fold.meta["val"].dtype == torch.int64 and all(not is_cast(a) for a in fold.all_input_nodes)
    outcomes = {o.node: o.outcome for o in report.ops}
    assert outcomes[index.name] is OpOutcome.KEPT_INDEX_SAFETY
    assert outcomes[fold.name] is OpOutcome.CONSTANT_FOLDABLE


def test_views_on_int16_data_get_an_explicit_anchor() -> None:
    ep, _ = _cast()
    views = [
        n
        for n in ep.graph.nodes
        if getattr(n.target, "overloadpacket", None) in (aten.view, aten.reshape, aten._unsafe_view)
        and n.meta["val"].dtype == torch.int16
    ]
    assert views
    for view in views:
        anchor = view.args[0]
        assert is_cast(anchor) and cast_target_dtype(anchor) == torch.int16
        assert anchor.args[0].meta["val"].dtype == torch.int16


def test_int16_program_runs_and_matches_exactly() -> None:
    torch.manual_seed(0)
    model = IntMath().eval()
    inputs = _inputs()
    ep = export(model, *inputs)
    with torch.no_grad():
        expected = model(*inputs)
    cast_int32_to_int16(ep)
    assert meta_mismatches(ep, *inputs) == []
    got = run_cast(ep, *inputs)
    assert got[0].dtype == torch.int32
    assert torch.equal(got[0].long(), expected[0])
    assert torch.equal(got[1], expected[1]) and torch.equal(got[2], expected[2])


class SumOfProducts(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * b).sum(-1)  # torch sums int16 into int64


def test_output_dtypes_come_from_the_op_not_from_a_guess() -> None:
    a, b = torch.randint(-9, 9, (3, 5)), torch.randint(-9, 9, (3, 5))
    ep = export(SumOfProducts(), a, b)
    cast_int32_to_int16(ep)
    (total,) = nodes_of(ep, aten.sum)
    assert total.meta["val"].dtype == torch.int64
    assert meta_mismatches(ep, a, b) == []
    assert torch.equal(run_cast(ep, a, b), SumOfProducts()(a, b))


def test_int_pass_twice_changes_nothing() -> None:
    ep, _ = _cast()
    code = ep.graph_module.code
    report = cast_program(ep, CastTarget.BOTH)
    report = cast_program(ep, CastTarget.BOTH)
    code = ep.graph_module.code
    report = cast_program(ep, CastTarget.BOTH)
    assert ep.graph_module.code == code
    assert report.casts_inserted == 0 and report.casts_removed == 0
    assert meta_mismatches(ep, *_inputs()) == []
