"""The shapes a program computes, held to the shapes it declares, before anything runs it.

The audit (`_program_audit`) bounds what a file declares; what its ops compute is another matter:
forty chained `cat([t, t])` declared as `[4]` ask for 2**42 elements when run, and a kernel handed
arguments whose shapes disagree (a batch norm's bias of 0 channels for 3) reads past its buffers.
So the program is first run on fake tensors (shapes and dtypes, no data: each op's meta kernel,
which checks what its real kernel would assume), from the stored weights' own shapes and the
inputs' declared shapes, and every value it computes must equal what the file declares for it
and hold at most `budget` elements. A size that depends on data (`nonzero`) must be bounded too.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._allowlist import TRUNCATING_DIVISION, TRUNCATION_TRAP
from ._errors import one_line

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram
    from torch.fx import Node

_LOGGERS = ("torch._subclasses.fake_tensor", "torch.fx.experimental.symbolic_shapes")


class _Mismatch(Exception):
    """Raised inside the walk; `check_shapes` reports its text."""


@dataclass(frozen=True)
class Shapes:
    """What running a program on fake tensors found: why it must not run (None: it may), the
    bytes of every value its nodes compute, and the floating-point operations of its products
    (what a first run needs: `_runs`)."""

    problem: str | None
    value_bytes: int = 0
    flops: float = 0.0


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Fake tensors log a traceback for every kernel that refuses its shapes: the refusal is ours
    to report, in one line."""
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def check_shapes(program: ExportedProgram, budget: int) -> Shapes:
    """Run `program` on fake tensors. Its `problem`: why running it would compute a value other
    than the one it declares, or one of over `budget` elements, as one line naming the node."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    stored = _stored(program)
    values: dict[Node, Any] = {}
    value_bytes, flops = 0, 0.0
    try:
        with _quiet():
            for node in program.graph.nodes:
                if node.op == "placeholder":
                    values[node] = _placeholder(node, stored.get(node.name), mode, budget)
                elif node.op == "call_function":
                    values[node] = _call(node, values, mode, budget)
                    produced = _tensors(values[node])
                    value_bytes += sum(_elements(t) * t.element_size() for t in produced)
                    flops += _flops(node, values, produced)
    except _Mismatch as mismatch:
        return Shapes(str(mismatch))
    return Shapes(None, value_bytes, flops)


def _tensors(value: Any) -> list[torch.Tensor]:
    import torch

    return [leaf for leaf in torch.utils._pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def _elements(tensor: torch.Tensor) -> int:
    return math.prod(_concrete(size) or 0 for size in tensor.shape)


# Ops whose arithmetic is a product of their operands' sizes, not their output's: the output's
# elements times the length of the dimension each output element sums over.
_REDUCED = {"aten.mm.default": (0, -1), "aten.addmm.default": (1, -1), "aten.bmm.default": (0, -1)}


def _flops(node: Node, values: dict[Node, Any], produced: list[torch.Tensor]) -> float:
    """About how many floating-point operations a node costs: twice the multiply-adds of a
    product or convolution, else one a value it computes."""
    out = sum(_elements(t) for t in produced)
    name = str(node.target)
    args = [values.get(a, a) for a in node.args]
    try:
        if name in _REDUCED:
            operand, dim = _REDUCED[name]
            return 2.0 * out * (_concrete(args[operand].shape[dim]) or 0)
        if name == "aten.convolution.default":  # each output element: in-channels/groups x kernel
            weight = args[1]
            return 2.0 * out * math.prod(_concrete(size) or 0 for size in weight.shape[1:])
        if name == "aten.scaled_dot_product_attention.default":  # scores, then their weighted sum
            width, length = _concrete(args[0].shape[-1]) or 0, _concrete(args[1].shape[-2]) or 0
            rows = out / max(_concrete(produced[0].shape[-1]) or 1, 1)
            return 2.0 * rows * length * (width + (_concrete(produced[0].shape[-1]) or 0))
    except (AttributeError, IndexError, TypeError):
        pass
    return float(out)


def _stored(program: ExportedProgram) -> dict[str, torch.Tensor]:
    """Placeholder name -> the tensor the file stores for it (weights, buffers, constants)."""
    signature, found = program.graph_signature, {}
    tables = (
        (signature.inputs_to_parameters, program.state_dict),
        (signature.inputs_to_buffers, program.state_dict),
        (signature.inputs_to_lifted_tensor_constants, program.constants),
    )
    for names, table in tables:
        for placeholder, target in names.items():
            if target in table:
                found[placeholder] = table[target]
    return found


def _concrete(size: Any) -> int | None:
    """A declared size as a number (a symbolic one at its hint), or None where it has none."""
    if isinstance(size, int):
        return size
    hint = getattr(getattr(size, "node", None), "hint", None)
    return hint if isinstance(hint, int) else None


def declared_shape(value: torch.Tensor) -> list[int]:
    """A declared tensor's sizes as numbers (symbolic ones at their hints; none: 1)."""
    return [size if (size := _concrete(dim)) is not None else 1 for dim in value.shape]


def _placeholder(node: Node, stored: torch.Tensor | None, mode: Any, budget: int) -> Any:
    """A fake input: a stored tensor's own shape (which must be the one declared), else the
    declared shape at its hints."""
    import torch

    declared = node.meta.get("val")
    if not isinstance(declared, torch.Tensor):
        return declared  # a symbolic size or a constant: used as declared
    shape = [_concrete(size) for size in declared.shape]
    if stored is not None:
        if list(stored.shape) != shape or stored.dtype != declared.dtype:
            raise _Mismatch(
                f"input {node.name} is stored as {_shape(stored)} but declared {_shape(declared)}"
            )
    elif any(size is None for size in shape):
        raise _Mismatch(f"input {node.name} declares a size with no value to check the program at")
    _within(node, shape, budget)
    with mode:
        return torch.empty(shape, dtype=declared.dtype, device=declared.device)


def _call(node: Node, values: dict[Node, Any], mode: Any, budget: int) -> Any:
    import torch
    from torch.fx.node import map_arg

    args, kwargs = map_arg((node.args, node.kwargs), lambda used: values[used])
    try:
        with mode:
            computed = node.target(*args, **kwargs)
    except Exception as exc:  # a meta kernel refusing its arguments, any type
        raise _Mismatch(
            f"node {node.name} ({_op(node)}) fails on the shapes it is given ({one_line(exc, 160)})"
        ) from None
    trap = trap_problem(str(node.target), args, kwargs)
    if trap:
        raise _Mismatch(f"node {node.name} ({_op(node)}) {trap}")
    leaves = torch.utils._pytree.tree_leaves(computed)
    declared = torch.utils._pytree.tree_leaves(node.meta.get("val"))
    if len(leaves) != len(declared):
        raise _Mismatch(
            f"node {node.name} ({_op(node)}) computes {len(leaves)} values but declares {len(declared)}"
        )
    for value, claim in zip(leaves, declared, strict=True):
        _held(node, value, claim, mode, budget)
    return computed


def trap_problem(target: str, args: Any, kwargs: dict[str, Any]) -> str | None:
    """Why a call of `target` (`aten.div.Tensor_mode`) with these (fake) arguments may crash the
    process on values it is given, or None (`_allowlist.TRUNCATING_DIVISION`)."""
    import torch

    if target.removeprefix("aten.") not in TRUNCATING_DIVISION or kwargs.get("rounding_mode") != "trunc":
        return None
    dividend = args[0] if args else kwargs.get("self")
    if (
        isinstance(dividend, torch.Tensor)
        and not dividend.is_floating_point()
        and dividend.dtype != torch.bool
    ):
        return TRUNCATION_TRAP
    return None


def _held(node: Node, value: Any, claim: Any, mode: Any, budget: int) -> None:
    """One computed value against its declaration: the same dtype and sizes, within the budget."""
    import torch

    if not isinstance(value, torch.Tensor):
        number, declared = _concrete(value), _concrete(claim)
        if number is not None and declared is not None and number != declared:
            raise _Mismatch(f"node {node.name} ({_op(node)}) computes {number} but declares {declared}")
        return
    if not isinstance(claim, torch.Tensor) or claim.dtype != value.dtype or claim.dim() != value.dim():
        raise _Mismatch(
            f"node {node.name} ({_op(node)}) computes {_shape(value)} but declares {_shape(claim)}"
        )
    sizes = []
    for size, declared in zip(value.shape, claim.shape, strict=True):
        number = _concrete(size)
        if number is None:  # a size from data: its bound, against a declaration that is no number
            if _concrete(declared) is not None:
                raise _Mismatch(
                    f"node {node.name} ({_op(node)}) computes a size from data where it declares one"
                )
            number = _upper(size, mode)
        elif _concrete(declared) != number:
            raise _Mismatch(
                f"node {node.name} ({_op(node)}) computes {_shape(value)} but declares {_shape(claim)}"
            )
        sizes.append(number)
    _within(node, sizes, budget)


def _upper(size: Any, mode: Any) -> int:
    """The largest value a size computed from data can take (a bound the shape environment
    proves: `nonzero` of n elements has at most n rows), or an unbounded marker."""
    bound = mode.shape_env.bound_sympy(size.node.expr).upper
    return int(bound) if getattr(bound, "is_finite", False) else 1 << 62


def _within(node: Node, sizes: list[int | None], budget: int) -> None:
    elements = math.prod(max(size or 0, 0) for size in sizes)
    if elements > budget:
        raise _Mismatch(
            f"node {node.name} ({_op(node)}) computes a tensor of {elements:,} elements "
            f"(at most {budget:,} here)"
        )


def _op(node: Node) -> str:
    target = node.target
    return (
        getattr(target, "__name__", "")
        if callable(target) and not hasattr(target, "_schema")
        else str(target)
    )


def _shape(value: Any) -> str:
    import torch

    if not isinstance(value, torch.Tensor):
        return "no tensor"
    sizes = ", ".join(str(_concrete(size) if _concrete(size) is not None else "?") for size in value.shape)
    return f"{str(value.dtype).removeprefix('torch.')}[{sizes}]"
