"""A parsed `model.json` as torch's export schema dataclasses, each class's field types read once.

torch's own reader (`serialize._dict_to_dataclass`) asks `typing.get_type_hints` again for every
object it builds: on a program of a few hundred nodes that is most of the time a load takes
(the sample transformer: 0.34 s a load, about half of it there). This reader builds the same
objects by the same rules - unknown keys ignored, `Optional` fields None, a `_Union` built from its
one key - with each class's hints looked up once a process. `parse_expressions_once` keeps
torch's deserializer from parsing a repeated symbolic-size string again.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any

__all__ = ["parse_expressions_once", "schema_object"]


def schema_object(cls: Any, data: Any) -> Any:
    """`data` (parsed JSON) as an instance of `cls`, a type of `torch._export.serde.schema`.
    Its unions are all `X | None` today; another kind is refused (torch's reader refuses those
    with more members too)."""
    return _reader(cls)(data)


@functools.cache
def _reader(cls: Any) -> Callable[[Any], Any]:
    """The function that reads data as a `cls`, its kind decided once a type (a load builds
    thousands of objects of a few dozen types)."""
    schema = _schema()
    cls = _resolved(cls, schema)
    origin = typing.get_origin(cls)
    if origin is Annotated:
        return _reader(cls.__origin__)
    if origin in (typing.Union, types.UnionType):
        arguments = typing.get_args(cls)
        if type(None) not in arguments or len(arguments) != 2:
            raise TypeError(f"unexpected union {cls}")
        return functools.partial(_optional, arguments[0])
    if isinstance(cls, type) and issubclass(cls, schema._Union):
        return functools.partial(_union, cls)
    if dataclasses.is_dataclass(cls):
        return functools.partial(_dataclass, cls)
    return functools.partial(_plain, cls)


def _optional(cls: Any, data: Any) -> Any:
    return None if data is None else _reader(cls)(data)


def _union(cls: Any, data: Any) -> Any:
    if not isinstance(data, dict) or len(data) != 1:
        raise TypeError(f"{cls.__name__}: expected an object of one key")
    ((key, value),) = data.items()
    return cls.create(**{key: _reader(_hints(cls)[key])(value)})


def _dataclass(cls: Any, data: Any) -> Any:
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__}: expected an object")
    return cls(**{name: read(data[name]) for name, read in _field_readers(cls) if name in data})


def _plain(cls: Any, data: Any) -> Any:
    """A list or dict of schema values by its element type, a float as a float, the rest as is."""
    if isinstance(data, list):
        if not data:
            return data
        (element,) = typing.get_args(cls)[:1]
        read = _reader(element)
        return [read(item) for item in data]
    if isinstance(data, dict):
        read = _reader(typing.get_args(cls)[1])
        return {key: read(value) for key, value in data.items()}
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
def _field_readers(cls: type) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
    """A dataclass's fields in order, each with the reader of its type."""
    hints = _hints(cls)
    return tuple((f.name, _reader(hints[f.name])) for f in dataclasses.fields(cls))


_PARSED = "_coreopt_parsed_expressions"


@functools.cache
def parse_expressions_once() -> None:
    """Let torch's deserializer parse each distinct symbolic-size string once a program.

    It hands every node's `expr_str` to `sympy.sympify` (about 1.5 ms each) and then looks the
    result up in its own table of symbols by the same string, so a repeated string yields the
    very object the first parse did: a stateful decoder's model.json names 7 expressions 299
    times, and their parsing was a third of its load. The answers are kept per deserializer
    (one program) and per (text, hint); anything but a string goes to torch as before. Installed
    once a process, at the first load (the strings were checked by `_expressions` before)."""
    from torch._export.serde.serialize import GraphModuleDeserializer

    parse = getattr(GraphModuleDeserializer, "_parse_sym_expr", None)
    if parse is None:  # another torch: its own way
        return

    @functools.wraps(parse)
    def parsed_once(self: Any, expr_str: Any, hint: Any = None) -> Any:
        if not isinstance(expr_str, str) or not isinstance(hint, (int, float, bool, type(None))):
            return parse(self, expr_str, hint)
        known = self.__dict__.setdefault(_PARSED, {})
        key = (expr_str, type(hint), hint)
        if key not in known:
            known[key] = parse(self, expr_str, hint)
        return known[key]

    GraphModuleDeserializer._parse_sym_expr = parsed_once
