"""Facts of an exported program's graph that more than one pass over it needs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.fx import GraphModule, Node


def call(gm: GraphModule, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any], how: str) -> Any:
    """Run one computing node of `gm` on operands already fetched (`how`: the pass, for the error
    a node of another kind gets); a 16-bit matrix product on the CPU in float32, or one of a
    bfloat16 weight in bfloat16 (`_products.widened`)."""
    if node.op == "call_function":
        from ._products import widened

        product = widened(node.target, args, kwargs)
        if product is not None:
            return product
        return node.target(*args, **kwargs)  # type: ignore[operator]
    if node.op == "call_module":
        return gm.get_submodule(str(node.target))(*args, **kwargs)
    if node.op == "call_method":
        self_arg, *rest = args
        return getattr(self_arg, str(node.target))(*rest, **kwargs)
    raise ValueError(f"cannot evaluate a {node.op} node {how}")


def attribute(gm: GraphModule, name: str) -> Any:
    """The parameter, buffer or constant of `gm` at a dotted name."""
    value: Any = gm
    for part in name.split("."):
        value = getattr(value, part)
    return value


def state_value(
    gm: GraphModule, node: Node, fixed: dict[Node, Any], leaves: dict[str, Any] | None = None
) -> Any:
    """A node of weights and constants alone (`state_only`), computed once into `fixed`, from the
    weights as they are now - or from `leaves` (by name) where given."""
    from torch.fx.node import map_arg

    if node not in fixed:
        if node.op == "get_attr":
            target = str(node.target)
            fixed[node] = leaves[target] if leaves and target in leaves else attribute(gm, target)
        else:
            args = map_arg(node.args, lambda n: state_value(gm, n, fixed, leaves))
            kwargs = map_arg(node.kwargs, lambda n: state_value(gm, n, fixed, leaves))
            fixed[node] = node.target(*args, **kwargs)  # type: ignore[operator]
    return fixed[node]
