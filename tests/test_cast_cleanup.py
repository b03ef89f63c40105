"""Cast cleanup on hand-built graphs: what folds, what is a barrier, siblings, dead code."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx import Graph, Node

from coreai_opt.casting._cleanup import cleanup
from coreai_opt.casting._graph import cast_target_dtype, is_cast

aten = torch.ops.aten


def _graph(start: torch.dtype) -> tuple[Graph, Node, FakeTensorMode]:
    mode = FakeTensorMode()
    graph = Graph()
    x = graph.placeholder("x")
    with mode:
        x.meta["val"] = torch.empty(4, dtype=start)
    return graph, x, mode


def _cast(graph: Graph, source: Node, dtype: torch.dtype, mode: FakeTensorMode) -> Node:
    node = graph.call_function(aten._to_copy.default, (source,), {"dtype": dtype})
    with mode:
        node.meta["val"] = torch.empty(4, dtype=dtype)
    return node


def _relu(graph: Graph, source: Node) -> Node:
    node = graph.call_function(aten.relu.default, (source,))
    node.meta["val"] = source.meta["val"]
    return node


def _chain(
    start: torch.dtype, *dtypes: torch.dtype, owned: tuple[bool, ...]
) -> tuple[Graph, set[Node], Node]:
    graph, x, mode = _graph(start)
    value, mine = x, set()
    for dtype, ours in zip(dtypes, owned, strict=True):
        value = _cast(graph, value, dtype, mode)
        if ours:
            mine.add(value)
    out = _relu(graph, value)
    graph.output(out)
    return graph, mine, out


def _casts(graph: Graph) -> list[torch.dtype | None]:
    return [cast_target_dtype(n) for n in graph.nodes if is_cast(n)]


@pytest.mark.parametrize("owned", [(False, False), (True, False), (True, True)])
def test_widening_round_trip_always_folds(owned: tuple[bool, bool]) -> None:
    graph, mine, out = _chain(torch.float16, torch.float32, torch.float16, owned=owned)
    cleanup(graph, mine)
    assert _casts(graph) == [] and out.args[0].name == "x"


def test_narrowing_round_trip_folds_only_when_the_pass_made_both_casts() -> None:
    graph, mine, out = _chain(torch.float32, torch.float16, torch.float32, owned=(True, True))
    cleanup(graph, mine)
    assert _casts(graph) == [] and out.args[0].name == "x"
    for owned in ((False, True), (True, False), (False, False)):
        graph, mine, _ = _chain(torch.float32, torch.float16, torch.float32, owned=owned)
        cleanup(graph, mine)
        assert _casts(graph) == [torch.float16, torch.float32], owned  # the user's rounding stays


def test_int_round_trips() -> None:
    graph, mine, _ = _chain(torch.int16, torch.int32, torch.int16, owned=(True, True))
    cleanup(graph, mine)
    assert _casts(graph) == []
    graph, mine, _ = _chain(torch.int64, torch.int16, torch.int64, owned=(False, False))
    cleanup(graph, mine)
    assert _casts(graph) == [torch.int16, torch.int64]  # a user narrowing wraps values: a barrier


def test_lossless_middle_step_condenses_a_chain() -> None:
    graph, mine, out = _chain(torch.float16, torch.float32, torch.float64, owned=(False, False))
    cleanup(graph, mine)
    assert _casts(graph) == [torch.float64] and out.args[0].args[0].name == "x"


def test_same_dtype_casts_go_and_siblings_share_one_cast() -> None:
    graph, x, mode = _graph(torch.float16)
    same = _cast(graph, x, torch.float16, mode)
    first = _cast(graph, x, torch.float32, mode)
    second = _cast(graph, x, torch.float32, mode)
    outs = [_relu(graph, n) for n in (same, first, second)]
    graph.output(tuple(outs))
    cleanup(graph, set())
    assert _casts(graph) == [torch.float32]
    assert outs[0].args[0] is x
    assert outs[1].args[0] is outs[2].args[0] is first


def test_dead_casts_are_removed() -> None:
    graph, x, mode = _graph(torch.float32)
    _cast(graph, x, torch.float16, mode)  # no users
    graph.output(_relu(graph, x))
    cleanup(graph, set())
    assert _casts(graph) == []
