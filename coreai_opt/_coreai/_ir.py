"""Walking Core AI programs: graphs, signatures, ops, constants and element types."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from coreai_opt._memory import EveryBytes, release_file_pages

BYTECODE_FILE = "main.mlirb"  # an .aimodel asset's program
# Every MLIR bytecode file starts with these four bytes ("ML\xefR").
BYTECODE_MAGIC = b"ML\xefR"


def bytecode_page_releases() -> EveryBytes:
    """Hands this process's read pages of coreai-core's map of the bytecode back once per
    `RELEASE_EVERY` bytes passed to it (constants read, written or printed)."""
    return EveryBytes(functools.partial(release_file_pages, BYTECODE_FILE))


# Ops that turn stored (compressed) constants into a dense weight.
DECOMPRESSION_OPS = frozenset(
    {
        "coreai.lut_to_dense",
        "coreai.blockwise_shift_scale",
        "coreai.build_sparse_with_bitmask",
        "coreai.sparse_with_bitmask_to_dense",
        "coreai.lut_to_sparse_with_bitmask",
        "coreai.dequantize",
        "coreai.cast",
    }
)


@dataclass(frozen=True)
class TensorSig:
    """A graph input or output: its name, element type and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class GraphSignature:
    name: str
    inputs: tuple[TensorSig, ...]
    outputs: tuple[TensorSig, ...]


def mlir_module(program: Any) -> Any:
    """The raw MLIR module inside an `AIProgram` (a private attribute of coreai-core)."""
    return program._module._mlir_module


def new_context() -> Any:
    """A fresh MLIR context with the Core AI dialects registered."""
    from coreai.authoring import Context

    return Context()._mlir_context


def graph_ops(module: Any) -> list[Any]:
    return [op.operation for op in module.body.operations if op.operation.name == "coreai.graph"]


def _walk_block_ops(block: Any) -> Iterator[Any]:
    for op in block.operations:
        operation = op.operation
        yield operation
        for region in operation.regions:
            for inner in region.blocks:
                yield from _walk_block_ops(inner)


def walk_ops(module: Any) -> Iterator[Any]:
    """Every op inside every graph, nested regions included, in program order."""
    for graph in graph_ops(module):
        for region in graph.regions:
            for block in region.blocks:
                yield from _walk_block_ops(block)


def op_histogram(module: Any) -> Counter[str]:
    return Counter(op.name for op in walk_ops(module))


def constant_ops(module: Any) -> list[Any]:
    return [op for op in walk_ops(module) if op.name == "coreai.constant"]


def element_name(mlir_type: Any) -> str:
    """Short element-type name as MLIR prints it: f16, bf16, ui4, si8, f8E4M3FN, ..."""
    return str(mlir_type.element_type if hasattr(mlir_type, "element_type") else mlir_type)


def element_bits(mlir_type: Any) -> int:
    """Bits of an element type: the element table's, else the width MLIR reports."""
    from coreai_opt._elements import ELEMENTS

    name = element_name(mlir_type)
    if name in ELEMENTS:
        return ELEMENTS[name].bits
    element = getattr(mlir_type, "element_type", mlir_type)
    width = getattr(element, "width", None)
    if isinstance(width, int):
        return width
    raise ValueError(f"unknown element type {name}")


def tensor_shape(mlir_type: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in mlir_type.shape)


def _names(attr: Any, count: int, prefix: str) -> list[str]:
    from coreai._compiler import ir

    names = [f"{prefix}{i}" for i in range(count)]
    if attr is None:
        return names
    for i, entry in enumerate(ir.ArrayAttr(attr)):
        entries = ir.DictAttr(entry)
        if "coreai.name" in entries:
            names[i] = ir.StringAttr(entries["coreai.name"]).value
    return names


def graph_signatures(module: Any) -> list[GraphSignature]:
    from coreai._compiler import ir

    signatures = []
    for graph in graph_ops(module):
        attrs = graph.attributes
        fn_type = ir.FunctionType(ir.TypeAttr(attrs["function_type"]).value)
        present = {named.name for named in attrs}
        arg_names = _names(attrs["arg_attrs"] if "arg_attrs" in present else None, len(fn_type.inputs), "arg")
        res_names = _names(
            attrs["res_attrs"] if "res_attrs" in present else None, len(fn_type.results), "out"
        )

        def sigs(types: Any, names: list[str]) -> tuple[TensorSig, ...]:
            return tuple(
                TensorSig(name, element_name(t), tensor_shape(t) if hasattr(t, "shape") else ())
                for name, t in zip(names, types, strict=True)
            )

        signatures.append(
            GraphSignature(
                name=ir.StringAttr(attrs["sym_name"]).value,
                inputs=sigs(fn_type.inputs, arg_names),
                outputs=sigs(fn_type.results, res_names),
            )
        )
    return signatures


def storage_nbytes(mlir_type: Any) -> int:
    """Bytes a constant of this type occupies: sub-byte integers packed, i1 one byte each."""
    count = 1
    for dim in tensor_shape(mlir_type):
        count *= dim
    bits = element_bits(mlir_type)
    if element_name(mlir_type) == "i1":
        bits = 8
    return (count * bits + 7) // 8


def _is_splat(op: Any) -> bool:
    from coreai._compiler import ir

    try:
        return bool(ir.DenseElementsAttr(op.attributes["value"]).is_splat)
    except (ValueError, KeyError):
        return False  # a resource constant: always stored in full


def constant_nbytes(op: Any) -> int:
    """Bytes a `coreai.constant` really stores: a splat holds one element, whatever its shape."""
    t = op.result.type
    if _is_splat(op):
        bits = 8 if element_name(t) == "i1" else element_bits(t)
        return (bits + 7) // 8
    return storage_nbytes(t)


def stored_nbytes(value: Any) -> int:
    """Bytes of every constant a value is decompressed from (the value itself if it is a constant)."""
    owner = value.owner
    if owner.name == "coreai.constant":
        return constant_nbytes(owner)
    if owner.name in DECOMPRESSION_OPS:
        return sum(stored_nbytes(operand) for operand in owner.operands)
    raise ValueError(f"{owner.name} is not a constant or a decompression op")


def constant_array(op: Any) -> Any:
    """The raw stored bytes of a `coreai.constant` (inline or resource) as a fresh uint8 array."""
    import numpy as np
    from coreai._compiler._mlir_libs._coreaiIR._bindings.compiler import copy_constant_value_to_array

    buffer = np.zeros(
        storage_nbytes(op.result.type), dtype=np.uint8
    )  # the copy leaves sub-byte padding bits as they are
    copy_constant_value_to_array(constant_op=op, destination=buffer)
    return buffer


_IDENTIFIERS = 'identifiers = ["'


def location_name(op: Any) -> str | None:
    """The source name an op carries: the first torch identifier in its location metadata (the
    module's qualified name `coreopt convert` puts first, `layers.0.fc2.weight`, or coreai-torch's
    FX node name such as `permute_9`), else None."""
    text = str(op.location)
    if _IDENTIFIERS not in text:
        return None
    start = text.index(_IDENTIFIERS) + len(_IDENTIFIERS)
    return text[start : text.index('"', start)]


_METADATA = "metadata = ["


def named_location(op: Any, name: str) -> Any:
    """`op`'s location with `name` as its first source identifier (coreai-core serializes only its
    debuginfo locations, so the name goes into their metadata), or None where that form is not
    there to extend."""
    from coreai._compiler import ir

    text = str(op.location)
    if not text.startswith("#debuginfo.location<") or _METADATA not in text or '"' in name or "\\" in name:
        return None
    source = f'<"sources": [{{id = 0 : ui64, identifiers = ["{name}"], name = "coreopt"}}]>, '
    try:
        return ir.Location.from_attr(ir.Attribute.parse(text.replace(_METADATA, _METADATA + source, 1)))
    except Exception:  # a location form this does not know: keep the old one
        return None


def constant_bytes(op: Any) -> bytes:
    """The raw stored bytes of a `coreai.constant`, as the runtime reads them."""
    return bytes(constant_array(op))


# Ops that move, reshape or re-type values: an index that passes through them is still an index.
_TRANSPARENT = frozenset(
    {
        "coreai.reshape",
        "coreai.expand_dims",
        "coreai.squeeze",
        "coreai.transpose",
        "coreai.cast",
        "coreai.broadcast_to",
        "coreai.slice_by_index",
        "coreai.slice_by_size",
    }
)
# op -> (operand index of the indices, operand index of the table they index)
_INDEXING = {"coreai.gather_nd": (1, 0), "coreai.gather": (1, 0)}


def main_graph(module: Any) -> Any:
    from coreai._compiler import ir

    graphs = graph_ops(module)
    for graph in graphs:
        if ir.StringAttr(graph.attributes["sym_name"]).value == "main":
            return graph
    return graphs[0] if graphs else None


def input_usage(module: Any) -> dict[str, tuple[int | None, bool]]:
    """Per input of `main`: rows of the smallest table it indexes (None: none), and whether it
    passes through arithmetic first."""
    graph = main_graph(module)
    if graph is None:
        return {}
    names = [t.name for t in next(s for s in graph_signatures(module) if s.name == "main").inputs]
    usage = {}
    for name, argument in zip(names, graph.regions[0].blocks[0].arguments, strict=False):
        rows: list[int] = []
        arithmetic = False
        seen: set[tuple[Any, bool]] = set()  # MLIR values hash and compare by the value they wrap
        queue = [(argument, False)]
        while queue:
            value, changed = queue.pop()
            for use in value.uses:
                owner = use.owner
                index_operand, table_operand = _INDEXING.get(owner.name, (None, None))
                if use.operand_number == index_operand:
                    table = owner.operands[table_operand].type
                    if hasattr(table, "shape") and len(tensor_shape(table)):
                        rows.append(tensor_shape(table)[0])
                        arithmetic |= changed
                    continue
                for result in owner.results:
                    state = (result, changed or owner.name not in _TRANSPARENT)
                    if state not in seen:
                        seen.add(state)
                        queue.append(state)
        usage[name] = (min(rows) if rows else None, arithmetic)
    return usage
