"""Where a program reads its weights: the ops that read each one, and the one its statistics are
taken at.

Every op that reads a parameter or buffer as its weight comes from the one ATen table
(`_aten.WEIGHT_OPS`), looking through views to the weight. A weight's statistics are taken at its
first reader - for moments and Gram matrices its first that has an activation - and a weight that
is only looked up (an embedding tied to the output head but exported as two tensors) takes those
of the equal weight that is multiplied (`twins_of`). Both captures (`_one_pass`, `_layer_by_layer`)
and the calibration's own bookkeeping (`_capture`) ask these questions, so they are answered once,
here, and the answers agree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coreai_opt.weights import Consumer, Needs

if TYPE_CHECKING:
    import torch
    from torch.fx import GraphModule, Node


@dataclass(frozen=True)
class Reader:
    """An op that reads a weight: the weight's name, how the op reads it, and where its activation is."""

    node: Node
    name: str
    consumer: Consumer
    activation: int | None  # operand index (None: an embedding lookup, which has no activation)


def readers(gm: GraphModule) -> list[Reader]:
    """Every op of `gm` that reads a parameter or buffer as its weight, in graph order."""
    from coreai_opt._aten import PASS_THROUGH, WEIGHT_OPS, packet

    found = []
    for node in gm.graph.nodes:
        op = WEIGHT_OPS.get(packet(node)) if node.op == "call_function" else None
        if op is None or len(node.args) <= op.weight:
            continue
        source = node.args[op.weight]
        while getattr(source, "op", None) == "call_function" and packet(source) in PASS_THROUGH:
            source = source.args[0]
        if getattr(source, "op", None) != "get_attr":
            continue
        others = [i for i in op.activations if i != op.weight]
        found.append(Reader(node, str(source.target), op.consumer, others[0] if others else None))
    return found


def first_readers(
    gm: GraphModule, names: Sequence[str], needs: Needs, state: Mapping[str, torch.Tensor] | None = None
) -> dict[str, Reader]:
    """Each named weight's reader to take statistics at: its first, or for moments and Gram its
    first that has an activation (a tied embedding is also the output head's weight) - or, where
    none has one, its twin's (`twins_of`)."""
    found = readers(gm)
    chosen: dict[str, Reader] = {}
    wanted = set(names)
    for reader in found:
        if reader.name not in wanted:
            continue
        better = reader.activation is not None and chosen.get(reader.name, reader).activation is None
        if reader.name not in chosen or (needs is not Needs.GRADIENT_SQUARES and better):
            chosen[reader.name] = reader
    if needs is Needs.GRADIENT_SQUARES:
        return chosen
    lacking = [name for name in names if chosen.get(name) is None or chosen[name].activation is None]
    for name, twin in twins_of(gm, found, lacking, state or {}).items():
        reader = next(r for r in found if r.name == twin and r.activation is not None)
        chosen[name] = dataclasses.replace(reader, name=name)
    return chosen


def twins_of(
    gm: GraphModule, found: list[Reader], lacking: Sequence[str], state: Mapping[str, torch.Tensor]
) -> dict[str, str]:
    """For each weight in `lacking` (no reader gives it an activation), another weight of this
    program with the same shape, dtype and values that a reader with an activation multiplies:
    an embedding tied to the output head but exported as two tensors (embed_tokens, lm_head) is
    one constant once converted, and that constant's statistics are the head's. Values come from
    the exported program's state (`state`: the unlifted module keeps one of two tied tensors)."""
    import torch

    multiplied = list(dict.fromkeys(r.name for r in found if r.activation is not None))
    twins: dict[str, str] = {}
    for name in lacking:
        value = _state_tensor(gm, name, state)
        if value is None:
            continue
        for other in multiplied:
            candidate = _state_tensor(gm, other, state)
            if (candidate is not None and candidate.shape == value.shape and candidate.dtype == value.dtype
                    and torch.equal(candidate, value)):  # fmt: skip
                twins[name] = other
                break
    return twins


def _state_tensor(gm: GraphModule, name: str, state: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """The parameter or buffer of that name as exported, or as the module holds it, or None."""
    if name in state:
        return state[name].detach()
    *path, leaf = name.split(".")
    try:
        owner = gm.get_submodule(".".join(path))
    except AttributeError:
        return None
    value = owner._parameters.get(leaf, owner._buffers.get(leaf))
    return None if value is None else value.detach()
