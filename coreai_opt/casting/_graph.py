"""FX helpers shared by the passes: dtypes of nodes, cheap meta updates, cast nodes, op matching."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.fx import Graph, Node

from coreai_opt._aten import CAST_PACKETS, packet
from coreai_opt.errors import ConfigError

aten = torch.ops.aten

# Tensor creation ops whose float output dtype the FP pass sets directly.
CREATION_PACKETS = frozenset(
    {
        aten.arange,
        aten.zeros,
        aten.ones,
        aten.full,
        aten.empty,
        aten.empty_strided,
        aten.rand,
        aten.randn,
        aten.scalar_tensor,
        aten.zeros_like,
        aten.ones_like,
        aten.full_like,
        aten.empty_like,
        aten.rand_like,
        aten.randn_like,
        aten.new_zeros,
        aten.new_ones,
        aten.new_full,
        aten.new_empty,
    }
)

ASSERT_METADATA = aten._assert_tensor_metadata.default


def is_cast(node: Node) -> bool:
    """A dtype conversion (`_to_copy`, `to`, `convert_element_type`) that names its target dtype."""
    return node.op == "call_function" and packet(node) in CAST_PACKETS and cast_target_dtype(node) is not None


def cast_target_dtype(node: Node) -> torch.dtype | None:
    if "dtype" in node.kwargs:
        return node.kwargs["dtype"]  # type: ignore[return-value]
    for arg in node.args[1:]:
        if isinstance(arg, torch.dtype):
            return arg
    return None


def set_cast_target_dtype(node: Node, dtype: torch.dtype) -> None:
    if "dtype" in node.kwargs or not any(isinstance(a, torch.dtype) for a in node.args[1:]):
        node.kwargs = {**node.kwargs, "dtype": dtype}
    else:
        node.args = tuple(dtype if isinstance(a, torch.dtype) else a for a in node.args)
    node.meta["val"] = retyped(node.meta.get("val"), dtype)


def is_pure_cast(node: Node) -> bool:
    """A cast that changes nothing but the dtype (safe to drop, fold or share)."""
    if not is_cast(node):
        return False
    extra = set(node.kwargs) - {"dtype", "layout", "device", "memory_format", "non_blocking", "copy"}
    if extra:
        return False
    fmt = node.kwargs.get("memory_format")
    return fmt in (None, torch.preserve_format) and len([a for a in node.args if isinstance(a, Node)]) == 1


def dtype_of(value: Any) -> torch.dtype | None:
    if isinstance(value, Node):
        value = value.meta.get("val")
    return getattr(value, "dtype", None)


def retyped(val: Any, dtype: torch.dtype) -> Any:
    """The meta value of a tensor with the same shape and strides in another dtype.

    Building the fake tensor from a meta tensor costs ~20 us; `val.to(dtype)` runs the fake
    dispatcher (~200 us), which dominates the pass on large graphs. Symbolic shapes take the slow way.
    """
    if not isinstance(val, torch.Tensor) or val.dtype == dtype:
        return val
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(val, FakeTensor) and all(isinstance(d, int) for d in (*val.shape, *val.stride())):
        meta = torch.empty_strided(val.shape, val.stride(), dtype=dtype, device="meta")
        return FakeTensor(val.fake_mode, meta, val.device)
    return val.to(dtype)


def retype_outputs(node: Node, dtype: torch.dtype, source: Iterable[torch.dtype]) -> None:
    """Set the dtype of every output of `node` (tensor or tuple of tensors) that is in `source`."""
    sources = tuple(source)
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        if val.dtype in sources:
            node.meta["val"] = retyped(val, dtype)
    elif isinstance(val, (tuple, list)):
        node.meta["val"] = type(val)(
            retyped(v, dtype) if isinstance(v, torch.Tensor) and v.dtype in sources else v for v in val
        )


def refresh_getitem(node: Node) -> None:
    container = node.args[0]
    assert isinstance(container, Node)
    vals = container.meta.get("val")
    if isinstance(vals, (tuple, list)):
        node.meta["val"] = vals[node.args[1]]  # type: ignore[index]


def refresh_assert(node: Node) -> None:
    """Keep `_assert_tensor_metadata(x, ..., dtype)` in step with x's current dtype."""
    source = node.args[0]
    dtype = dtype_of(source)
    if dtype is None:
        return
    if "dtype" in node.kwargs:
        node.kwargs = {**node.kwargs, "dtype": dtype}
    elif len(node.args) > 3:
        node.args = (*node.args[:3], dtype, *node.args[4:])


def is_getitem(node: Node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem


def insert_cast(graph: Graph, source: Node, dtype: torch.dtype, before: Node | None = None) -> Node:
    """A new `_to_copy(source, dtype=...)` right after `source` (or right before `before`)."""
    context = graph.inserting_before(before) if before is not None else graph.inserting_after(source)
    short = {torch.float16: "fp16", torch.float32: "fp32", torch.int16: "int16", torch.int32: "int32"}
    with context:
        cast = graph.create_node(
            "call_function",
            aten._to_copy.default,
            (source,),
            {"dtype": dtype},
            name=f"{source.name}_to_{short.get(dtype, str(dtype).removeprefix('torch.'))}",
        )
    cast.meta["val"] = retyped(source.meta.get("val"), dtype)
    for key in ("nn_module_stack", "stack_trace", "source_fn_stack"):
        if key in source.meta:
            cast.meta[key] = source.meta[key]
    return cast


def redirect_users(node: Node, replacement: Node) -> None:
    """Users of `node` read the cast `replacement` instead; other casts keep reading `node`
    directly, and so do `_assert_tensor_metadata` checks (they assert the value they were
    written for; `refresh_assert` keeps their dtype in step with it)."""
    node.replace_all_uses_with(
        replacement,
        delete_user_cb=lambda user: (
            user is not replacement and not is_pure_cast(user) and user.target != ASSERT_METADATA
        ),
    )


class CastInserter:
    """The casts a pass adds: one shared cast per (source, dtype) in front of consumers, and one
    cast after a producer (an existing cast of it to that dtype is reused). Every new cast joins
    `owned`, the set cleanup may fold freely."""

    def __init__(self, graph: Graph, owned: set[Node]) -> None:
        self.graph = graph
        self.owned = owned
        self._before: dict[tuple[Node, torch.dtype], Node] = {}

    def before(self, source: Node, dtype: torch.dtype, consumer: Node) -> Node:
        cast = self._before.get((source, dtype))
        if cast is None:
            cast = insert_cast(self.graph, source, dtype, before=consumer)
            self.owned.add(cast)
            self._before[(source, dtype)] = cast
        return cast

    def after(self, node: Node, dtype: torch.dtype) -> Node:
        """Users of `node` (other than casts) read it through a cast to `dtype`.

        A cast of `node` to `dtype` the program already has is reused, moved right behind `node`:
        users that come before it in the graph (the model's own `x.to(dtype)` often follows other
        users of x) must not read a node defined after them.
        """
        cast = next((u for u in node.users if is_pure_cast(u) and cast_target_dtype(u) == dtype), None)
        if cast is None:
            cast = insert_cast(self.graph, node, dtype)
            self.owned.add(cast)
        elif cast.prev is not node:
            node.append(cast)
        redirect_users(node, cast)
        return cast


def map_node_args(node: Node, fn: Callable[[Node], Node]) -> None:
    """Rewrite every Node argument of `node` (nested in lists and tuples too) through `fn`."""
    node.args = torch.fx.node.map_arg(node.args, fn)  # type: ignore[assignment]
    node.kwargs = torch.fx.node.map_arg(node.kwargs, fn)  # type: ignore[assignment]


def fake_run(node: Node) -> Any:
    """The meta value of `node` recomputed from its inputs' meta values (exact output dtypes)."""
    from torch._subclasses.fake_tensor import FakeTensor

    fake_mode = next(
        (v.fake_mode for v in (a.meta.get("val") for a in node.all_input_nodes) if isinstance(v, FakeTensor)),
        None,
    )
    if fake_mode is None:
        return node.meta.get("val")

    def value(arg: Node) -> Any:
        return arg.meta.get("val")

    args = torch.fx.node.map_arg(node.args, value)
    kwargs = torch.fx.node.map_arg(node.kwargs, value)
    with fake_mode:
        return node.target(*args, **kwargs)  # type: ignore[operator]


OpSelector = Any  # an OpOverload, an OpOverloadPacket, a collection of them, or a predicate on nodes


def op_matcher(selector: OpSelector) -> Callable[[Node], bool]:
    """Normalise `ignored_ops=` into a predicate on call_function nodes."""
    if selector is None:
        return lambda node: False
    if isinstance(selector, (torch._ops.OpOverload, torch._ops.OpOverloadPacket, str)):
        selector = [selector]
    if callable(selector) and not isinstance(selector, (list, tuple, set, frozenset)):
        predicate = selector
        return lambda node: bool(predicate(node))
    overloads, packets = set(), set()
    for item in selector:
        item = resolve_op(item) if isinstance(item, str) else item
        if isinstance(item, torch._ops.OpOverloadPacket):
            packets.add(item)
        elif isinstance(item, torch._ops.OpOverload):
            overloads.add(item)
        else:
            raise TypeError(f"ignored_ops takes op overloads, overload packets or a predicate, not {item!r}")
    return lambda node: node.target in overloads or packet(node) in packets


def resolve_op(name: str) -> Any:
    """`aten.exp.default` -> the overload; `aten.exp` -> the overload packet (a leading `torch.ops.` is fine)."""
    parts = name.removeprefix("torch.ops.").split(".")
    if len(parts) not in (2, 3) or not all(parts):
        raise ConfigError(
            f"op name {name!r} is not of the form namespace.op[.overload], e.g. aten.exp.default",
            "ignored_ops",
        )
    try:
        op = getattr(getattr(torch.ops, parts[0]), parts[1])
        return getattr(op, parts[2]) if len(parts) == 3 else op
    except (AttributeError, RuntimeError):
        raise ConfigError(f"unknown op {name!r}", "ignored_ops") from None
