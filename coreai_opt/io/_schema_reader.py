"""A parsed `model.json` as torch's export schema dataclasses, each class's field types read once.

torch's own reader (`serialize._dict_to_dataclass`) asks `typing.get_type_hints` again for every
object it builds: on a program of a few hundred nodes that is most of the time a load takes
(the sample transformer: 0.34 s a load, about half of it there). This reader builds the same
objects by the same rules - unknown keys ignored, `Optional` fields None, a `_Union` built from its
one key - with each class's hints looked up once a process.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Annotated, Any

__all__ = ["schema_object"]


def schema_object(cls: Any, data: Any) -> Any:
    """`data` (parsed JSON) as an instance of `cls`, a type of `torch._export.serde.schema`.
    Its unions are all `X | None` today; another kind is refused (torch's reader refuses those
    with more members too)."""
    schema = _schema()
    cls = _resolved(cls, schema)
    origin = typing.get_origin(cls)
    if origin is Annotated:
        return schema_object(cls.__origin__, data)
    if origin in (typing.Union, types.UnionType):
        arguments = typing.get_args(cls)
        if type(None) not in arguments or len(arguments) != 2:
            raise TypeError(f"unexpected union {cls}")
        return None if data is None else schema_object(arguments[0], data)
    if isinstance(cls, type) and issubclass(cls, schema._Union):
        if not isinstance(data, dict) or len(data) != 1:
            raise TypeError(f"{cls.__name__}: expected an object of one key")
        ((key, value),) = data.items()
        return cls.create(**{key: schema_object(_hints(cls)[key], value)})
    if dataclasses.is_dataclass(cls):
        if not isinstance(data, dict):
            raise TypeError(f"{cls.__name__}: expected an object")
        return cls(
            **{name: schema_object(hint, data[name]) for name, hint in _typed_fields(cls) if name in data}
        )
    if isinstance(data, list):
        if not data:
            return data
        (element,) = typing.get_args(cls)[:1]
        return [schema_object(element, item) for item in data]
    if isinstance(data, dict):
        value_type = typing.get_args(cls)[1]
        return {key: schema_object(value_type, value) for key, value in data.items()}
    if cls is float:
        return float(data)
    return data


def _resolved(cls: Any, schema: types.ModuleType) -> Any:
    """A schema class named by a string or a forward reference, as the class."""
    if isinstance(cls, typing.ForwardRef):
        cls = cls.__forward_arg__
    if isinstance(cls, str):
        found = getattr(schema, cls, None)
        if found is None:
            raise TypeError(f"unknown schema type {cls!r}")
        return found
    return cls


@functools.cache
def _schema() -> types.ModuleType:
    from torch._export.serde import schema

    return schema


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, globalns=vars(_schema()))


@functools.cache
def _typed_fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """A dataclass's fields in order, each with its type."""
    hints = _hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))
