"""coreai-torch's decompression ops: registering them, recognising them, and decoding them fast.

coreai-torch defines the ops (`torch.library.custom_op`) when its compression module is
imported; a `.pt2` that calls them cannot be loaded or run before that. Their eager kernels
expand every LUT and scale to the weight's full size (a 4-bit LUT costs 16 values per weight),
which takes many gigabytes on a large model, so `fold_decompression` decodes each weight once
with `weights`' broadcasting kernels instead - the same arithmetic in the same dtypes, so the same
bits.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from coreai_opt._memory import meta_stand_in
from coreai_opt.weights import lut_to_dense, shift_scale, sparse_to_dense

if TYPE_CHECKING:
    import torch
    from torch.fx import Node

LUT_TO_DENSE = "coreai::lut_to_dense"
SHIFT_SCALE = "coreai::constexpr_blockwise_shift_scale"
SPARSE_TO_DENSE = "coreai::sparse_to_dense"
COREAI_OPS = frozenset({LUT_TO_DENSE, SHIFT_SCALE, SPARSE_TO_DENSE})


def coreai_decompositions() -> dict[Any, Any]:
    """coreai-torch's decomposition table (what `.pt2` programs for conversion are exported with)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the torch version warning on import
        import coreai_torch
    return coreai_torch.get_decomp_table()


def op_name(node: Node) -> str | None:
    """`coreai::lut_to_dense` etc. for a call of a coreai op, else None."""
    if node.op != "call_function":
        return None
    name = getattr(node.target, "name", None)
    text = name() if callable(name) else None
    return text if isinstance(text, str) and text in COREAI_OPS else None


def is_decompression(node: Node) -> bool:
    return op_name(node) is not None


_DECODERS = {LUT_TO_DENSE: lut_to_dense, SHIFT_SCALE: shift_scale, SPARSE_TO_DENSE: sparse_to_dense}


def fold_decompression(module: torch.fx.GraphModule) -> int:
    """Replace every decompression tree over attributes by the weight it decodes to (in place) and
    drop the attributes only those trees read; returns how many weights were folded. For
    `ep.module()`, before running it."""
    import torch

    graph = module.graph
    before = {str(n.target) for n in graph.nodes if n.op == "get_attr"}
    values: dict[Node, torch.Tensor] = {}
    unread: dict[Node | str, int] = {n: len(n.users) for n in graph.nodes}  # readers not yet folded
    for n in graph.nodes:  # an attribute's readers through every get_attr of it
        if n.op == "get_attr":
            unread[str(n.target)] = unread.get(str(n.target), 0) + len(n.users)
    folded = 0
    for node in list(graph.nodes):
        if node.op == "get_attr":
            value = _attribute(module, str(node.target))
            if isinstance(value, torch.Tensor):
                values[node] = value
            continue
        name = op_name(node)
        if name is None:
            continue
        args = [values.get(a, a) if isinstance(a, torch.fx.Node) else a for a in node.args]
        kwargs = {k: values.get(v, v) if isinstance(v, torch.fx.Node) else v for k, v in node.kwargs.items()}
        if any(isinstance(a, torch.fx.Node) for a in (*args, *kwargs.values())):
            continue  # reads a runtime value: leave it to the op
        values[node] = _DECODERS[name](*args, **kwargs)
        _let_go(module, node, values, unread)
        if all(op_name(user) is not None for user in node.users):
            continue  # an inner step of a tree: only its root becomes an attribute
        attribute = f"_coreopt_dense_{folded}"
        module.register_buffer(attribute, values[node])
        with graph.inserting_before(node):
            replacement = graph.get_attr(attribute)
        replacement.meta = dict(node.meta)
        node.replace_all_uses_with(replacement)
        folded += 1
    graph.eliminate_dead_code()
    after = {str(n.target) for n in graph.nodes if n.op == "get_attr"}
    for target in sorted(before - after):
        delattr(*_owner(module, target))
    module.recompile()
    return folded


def _let_go(
    module: torch.fx.GraphModule, node: Node, values: dict[Node, Any], unread: dict[Node | str, int]
) -> None:
    """Once every reader of an input of `node` is folded, its value leaves `values` and, for an
    attribute no other node reads, the module: a device holds one weight's codes beside the
    decoded weights, not every weight's."""
    import torch

    inputs = (a for a in (*node.args, *node.kwargs.values()) if isinstance(a, torch.fx.Node))
    for source in dict.fromkeys(inputs):
        if source not in values:
            continue
        unread[source] -= 1
        if unread[source] == 0:
            del values[source]
        if source.op != "get_attr":
            continue
        target = str(source.target)
        unread[target] -= 1
        if unread[target] == 0:  # a stand-in until the dead readers are gone
            owner, last = _owner(module, target)
            setattr(owner, last, meta_stand_in(getattr(owner, last)))


def _owner(module: torch.nn.Module, target: str) -> tuple[Any, str]:
    """(the object holding a dotted attribute, the attribute's last name)."""
    *path, last = target.split(".")
    return (_attribute(module, ".".join(path)) if path else module), last


def _attribute(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value
