"""Programs this process has read, remembered by what decides their graph.

Deserializing a `.pt2`'s graph and walking it on fake tensors (`_shapes`) costs far more than
reading its weights (SmolLM2-135M: 2.8 CPU-s a load; a copy of the graph 0.2 s), and one command
reads its source more than once (each pass, the comparison, the recipe's replay). Everything but
the tensor values comes from three entries of the archive - the program's JSON and the two tensor
configs (names, dtypes and layouts) - so a file whose entries have the same SHA-256 as one read
before gets a deep copy of that program around its own freshly read tensors, and the walk's
verdict without walking again. The kept copy holds meta stand-ins, never a weight; a program handed
out is never the kept one. As in torch's own copies of a graph (`ExportedProgram.module()`), each
node's metadata dict is the copy's own but its values (the fake tensors of static shapes, stack
traces) are shared, read-only; a program whose values have symbolic sizes keeps a fake-tensor shape
environment that edits of it add to, so only its verdict is kept and each load reads it afresh.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._shapes import Shapes

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

Key = tuple[bytes, int]  # (digest of the three entries, the size budget the walk held them to)
_KEPT = 8  # programs; a refused one keeps only its verdict
_NODES_KEPT = 50_000  # a larger graph is not kept (its copy's memory beside a large model's)


@dataclass(frozen=True)
class _Known:
    template: ExportedProgram | None  # None: refused, symbolic or too large - the verdict only
    shapes: Shapes


_KNOWN: OrderedDict[Key, _Known] = OrderedDict()
_LOCK = threading.Lock()


def known_program(
    key: Key, state_dict: dict[str, torch.Tensor], constants: dict[str, torch.Tensor]
) -> tuple[ExportedProgram | None, Shapes | None]:
    """For a file whose entries have this key: a program around `state_dict` and `constants` (its
    own freshly read tensors), or None where none is kept, and the walk's verdict, or None where
    this process has not walked such a program."""
    with _LOCK:
        found = _KNOWN.get(key)
        if found is None:
            return None, None
        _KNOWN.move_to_end(key)
    template = found.template  # the key holds both configs: its tensors' names are this file's
    if template is None:
        return None, found.shapes
    fresh = {id(template.state_dict[name]): tensor for name, tensor in state_dict.items()}
    fresh.update({id(template.constants[name]): tensor for name, tensor in constants.items()})
    if len(fresh) != len(state_dict) + len(constants):  # a stand-in under two names: read afresh
        return None, found.shapes
    return copy.deepcopy(template, fresh), found.shapes


def remember_program(key: Key, program: ExportedProgram, shapes: Shapes) -> None:
    """Keep `program`'s graph (a copy, its tensors meta stand-ins) and `shapes` under `key`."""
    import torch

    from coreai_opt._memory import meta_stand_in

    template = None
    tensors = [*program.state_dict.values(), *program.constants.values()]
    if (
        shapes.problem is None
        and len(program.graph.nodes) <= _NODES_KEPT
        and all(isinstance(t, torch.Tensor) for t in tensors)
        and not _symbolic(program)
    ):
        try:
            template = copy.deepcopy(program, {id(t): meta_stand_in(t) for t in tensors})
        except (RuntimeError, NotImplementedError, TypeError):  # a dtype meta tensors lack
            template = None
    with _LOCK:
        _KNOWN[key] = _Known(template, shapes)
        while len(_KNOWN) > _KEPT:
            _KNOWN.popitem(last=False)


def _symbolic(program: ExportedProgram) -> bool:
    """Whether a value of the program has a symbolic size (its fake tensors' shape environment is
    then one that edits add guards to)."""
    import torch
    from torch.fx.experimental.symbolic_shapes import free_symbols

    if program.range_constraints:
        return True
    for node in program.graph.nodes:
        for value in torch.utils._pytree.tree_leaves(node.meta.get("val")):
            if isinstance(
                value, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)
            ) and free_symbols(value):
                return True
    return False
