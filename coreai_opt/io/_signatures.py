"""A node's arguments held to its operator's schema: each one the schema names, of a kind its type
takes, and every required one given.

torch's deserializer hands an operator whatever the file stores, and torch's dispatcher accepts
an integer where a schema says ScalarType, Layout or MemoryFormat (TorchScript stores those as
integers): `aten.to.dtype(x, -1)` reads a type table out of bounds and crashes the process. So a
`dtype` must be stored as a dtype code, a layout as the strided layout, and every other argument
as the kind its type is serialized as (`torch._export.serde.serialize`).
"""

from __future__ import annotations

import functools
from typing import Any

_INTEGER = frozenset({"as_int", "as_sym_int"})
_NUMBER = frozenset({"as_int", "as_float", "as_bool", "as_sym_int", "as_sym_float"})  # no complex
_BASE_KINDS: dict[str, frozenset[str]] = {
    "Tensor": frozenset({"as_tensor"}) | _NUMBER,  # export stores `x / 2.0` as div.Tensor(x, 2.0)
    "List[Tensor]": frozenset({"as_tensors"}),
    "List[Optional[Tensor]]": frozenset({"as_optional_tensors", "as_tensors"}),
    "int": _INTEGER,
    "SymInt": _INTEGER,
    "List[int]": frozenset({"as_ints", "as_sym_ints", "as_int"}),  # an int stands for int[N]
    "List[SymInt]": frozenset({"as_ints", "as_sym_ints", "as_int"}),
    "float": frozenset({"as_float", "as_sym_float", "as_int"}),
    "List[float]": frozenset({"as_floats"}),
    "number": _NUMBER,
    "bool": frozenset({"as_bool", "as_sym_bool"}),
    "SymBool": frozenset({"as_bool", "as_sym_bool"}),
    "List[bool]": frozenset({"as_bools"}),
    "ScalarType": frozenset({"as_scalar_type"}),
    "Layout": frozenset({"as_layout"}),
    "MemoryFormat": frozenset({"as_memory_format"}),
    "Device": frozenset({"as_device"}),
    "str": frozenset({"as_string"}),
}
STRIDED_LAYOUT = 7  # torch._export.serde.schema.Layout.Strided: no sparse or mkldnn tensors
MEMORY_FORMATS = frozenset({1, 2, 3, 4})  # contiguous, channels_last (2d, 3d), preserve


def _kinds(type_text: str) -> frozenset[str] | None:
    if type_text.startswith("Optional[") and type_text.endswith("]"):
        inner = _kinds(type_text[len("Optional[") : -1])
        extra = {"as_none", "as_optional_tensor"} if type_text == "Optional[Tensor]" else {"as_none"}
        return None if inner is None else inner | extra
    return _BASE_KINDS.get(type_text)


@functools.cache
def _schema(target: str) -> Any:
    """The schema of an allowed operator's target string, or None when this process lacks it."""
    import torch

    _, _, namespace, name, overload = target.split(".")
    packet = getattr(getattr(torch.ops, namespace), name, None) if hasattr(torch.ops, namespace) else None
    op = getattr(packet, overload, None) if packet is not None else None
    return None if op is None else op._schema


def arguments_problem(target: str, given: dict[str, tuple[str, Any]]) -> str | None:
    """Why the (name -> (kind, value)) arguments a node stores do not fit `target`'s schema, or
    None. `target` is an allowed ATen or coreai operator (`_allowlist.operator_problem` passed)."""
    schema = _schema(target)
    if schema is None:
        return "calls an operator this process does not define"
    declared = {argument.name: argument for argument in schema.arguments}
    for name, (kind, value) in given.items():
        argument = declared.get(name)
        if argument is None:
            return f"passes {name!r}, which the operator does not take"
        kinds = _kinds(str(argument.real_type))
        if kinds is None:
            return f"passes {name!r}, an argument of a type coreopt does not check ({argument.real_type})"
        if kind not in kinds:
            return f"passes {name!r} as {kind.removeprefix('as_')}, where the operator takes {argument.real_type}"
        if kind == "as_layout" and value != STRIDED_LAYOUT:
            return f"passes {name!r} as a layout other than strided (sparse or opaque tensors)"
        if kind == "as_memory_format" and value not in MEMORY_FORMATS:
            return f"passes {name!r} as an unknown memory format"
    for name, argument in declared.items():
        optional = str(argument.real_type).startswith("Optional[")
        if name not in given and not argument.has_default_value() and not optional:
            return f"does not pass {name!r}, which the operator needs"
    return None
