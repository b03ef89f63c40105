"""What a recipe may hold: the bounds on a recipe document, and the type check of every value
against the annotation of the field it fills (the field's type is the one place that says it).

People open recipes other people made: a hostile one fails in one line before any model is
loaded, rather than running for minutes or ending in a TypeError or RecursionError mid-step.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from collections.abc import Mapping, Sized
from typing import Any

from coreai_opt.compression import Override
from coreai_opt.errors import ConfigError, shown
from coreai_opt.io import walk_json

# A real recipe has a handful of steps (`coreopt optimize` writes at most four: one compress step
# per config kind and a convert); 64 is far past any of them, and a 2,000-step recipe is refused.
MAX_STEPS = 64
# The longest real lists are overrides: `optimize` writes one per weight matrix it compresses, and
# the largest model coreopt exports (a 405B Llama) has under 1,000 of them.
MAX_ITEMS = 16_384
MAX_TEXT = 4_096  # PATH_MAX: the longest path a recipe can name; patterns and names are shorter
# The deepest value of a real recipe (a number in an override's n_m_ratio) lies 8 levels down.
MAX_DEPTH = 16
# Every value counted where it is used (a YAML alias repeats a whole list for a few bytes); a full
# list of overrides is about 50,000.
MAX_VALUES = 1 << 18
MAX_FILE_BYTES = 4 << 20  # 16,384 overrides take 1.2 MB of YAML, 2 MB of JSON
_MAX_INT = (1 << 63) - 1  # the largest integer torch and numpy take
_SCALARS = (str, int, float, bool, type(None))


def least(minimum: int) -> dict[str, int]:
    """A field's metadata: the smallest integer it takes (checked with its type)."""
    return {"minimum": minimum}


def read_yaml(text: str) -> Any:
    """YAML through its safe loader (plain data only; libyaml's where installed, several times faster),
    after a pass over the events that refuses a document nested or sized past the bounds before
    any of it is built (Python's parser takes most of a minute over 4 MB of one-letter items)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    depth = values = 0
    for event in yaml.parse(text, Loader=loader):
        depth += isinstance(event, yaml.CollectionStartEvent) - isinstance(event, yaml.CollectionEndEvent)
        values += isinstance(event, yaml.NodeEvent)
        if depth > MAX_DEPTH + 1:  # the root is a mapping: its values lie one level down
            raise _too_deep(f"line {event.start_mark.line + 1}")
        if values > MAX_VALUES:
            raise _too_many()
    return yaml.load(text, Loader=loader)


def _too_deep(where: str) -> ConfigError:
    return ConfigError(f"{where}: a recipe nests at most {MAX_DEPTH} levels deep", "steps")


def _too_many() -> ConfigError:
    return ConfigError(
        f"a recipe holds at most {MAX_VALUES} values (an alias counts each time it is used)", "steps"
    )


def check_document(data: Any) -> None:
    """Plain data only - mappings with string keys, lists, strings, 64-bit integers, finite numbers,
    booleans and nulls - within the bounds above (walked without recursion: aliases may loop, and
    the count of values ends the walk where they do)."""
    for count, (value, place) in enumerate(walk_json(data)):
        if count > MAX_VALUES:
            raise _too_many()
        if len(place) > MAX_DEPTH:
            raise _too_deep(_place(place))
        if isinstance(value, dict):
            _check_length(value, _place(place))
            for key in value:
                if not isinstance(key, str) or len(key) > MAX_TEXT:
                    raise ConfigError(
                        f"{_place(place)}: keys are strings of at most {MAX_TEXT} characters, not {shown(key)}",
                        "steps",
                    )
        elif isinstance(value, list):
            _check_length(value, _place(place))
        else:
            _check_scalar(value, _place(place))


def _check_scalar(value: Any, where: str) -> None:
    if not isinstance(value, _SCALARS):
        raise ConfigError(f"{where}: a recipe holds no {type(value).__name__} values", "steps")
    if isinstance(value, str):
        _check_length(value, where)
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > _MAX_INT:
        raise ConfigError(f"{where}: integers fit in 64 bits, not {shown(value)}", "steps")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: numbers are finite, not {value}", "steps")


def _check_length(value: Sized, where: str) -> None:
    limit, unit = (MAX_TEXT, "characters") if isinstance(value, str) else (MAX_ITEMS, "items")
    if len(value) > limit:
        raise ConfigError(f"{where}: at most {limit} {unit}, not {len(value)}", _leaf(where))


def _place(place: tuple[Any, ...]) -> str:
    """`steps[0].compress.config` (keys cut short: a hostile key may be long)."""
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{_cut(part, 40)}" for part in place)
    return text.lstrip(".") or "the recipe"


def check_record(record: Any) -> None:
    """Every field of a dataclass instance against its annotation (a step's own check)."""
    check_fields(type(record), {f.name: getattr(record, f.name) for f in dataclasses.fields(record)})


def check_fields(owner: type, values: Mapping[str, Any], prefix: str = "") -> None:
    """`values` against the annotations of `owner`'s fields of those names (a name `owner` has no
    field for is left to `owner`, which refuses it); errors name the field, after `prefix`."""
    hints = _hints(owner)
    for name, value in values.items():
        if name not in hints:
            continue
        hint, minimum = hints[name]
        _check(value, hint, prefix + name, owner)
        if minimum is not None and isinstance(value, int) and value < minimum:
            raise ConfigError(f"{prefix}{name} must be {minimum} or more, not {value}", name)


@functools.cache
def _hints(owner: type) -> dict[str, tuple[Any, int | None]]:
    """(annotation, smallest integer or None) of each field of a dataclass, by name."""
    resolved = typing.get_type_hints(owner)
    return {f.name: (resolved[f.name], f.metadata.get("minimum")) for f in dataclasses.fields(owner)}


def _check(value: Any, hint: Any, name: str, owner: type) -> None:
    """One value against one annotation; the error names the value's place (`overrides[2].n_bits`)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return
    if origin in (typing.Union, types.UnionType):
        _check_union(value, args, name, owner)
    elif origin is tuple:
        _check_items(value, args, name, owner)
    elif hint is int or hint is float:
        _check_number(value, hint, name)
    elif hint is str:
        if not isinstance(value, str):
            raise _wrong(name, hint, value)
        _check_length(value, name)
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        # a member, or a member's value: the owner converts it, naming the choices if none matches
        if not isinstance(value, hint | str):
            raise _wrong(name, hint, value)
        if isinstance(value, str):
            _check_length(value, name)
    elif hint is Override and isinstance(value, dict):
        _check_override(value, name, owner)
    elif not isinstance(value, hint):  # bool, or a record (a compress step's config)
        raise _wrong(name, hint, value)


def _check_union(value: Any, args: tuple[Any, ...], name: str, owner: type) -> None:
    if value is None and type(None) in args:
        return
    rest = [arg for arg in args if arg is not type(None)]
    if len(rest) == 1:
        _check(value, rest[0], name, owner)
    elif not isinstance(value, tuple(rest)):  # a choice of records
        raise _wrong(name, args, value)


def _check_items(value: Any, args: tuple[Any, ...], name: str, owner: type) -> None:
    """A tuple field takes a list (or a tuple): of any length up to MAX_ITEMS, or of exactly its own."""
    if not isinstance(value, list | tuple):
        raise _wrong(name, tuple[args], value)  # type: ignore[valid-type]
    if args[-1] is Ellipsis:
        _check_length(value, name)
        args = (args[0],) * len(value)
    elif len(value) != len(args):
        raise _wrong(name, tuple[args], value)  # type: ignore[valid-type]
    for index, (item, arg) in enumerate(zip(value, args, strict=True)):
        _check(item, arg, f"{name}[{index}]", owner)


def _check_number(value: Any, hint: type, name: str) -> None:
    """int: an integer, never a boolean, within 64 bits; float: an integer or a finite float."""
    if isinstance(value, bool) or not isinstance(value, int if hint is int else int | float):
        raise _wrong(name, hint, value)
    if isinstance(value, int) and abs(value) > _MAX_INT:
        raise ConfigError(f"{name} must fit in 64 bits, not {shown(value)}", _leaf(name))
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, not {value}", _leaf(name))


def _check_override(value: dict[str, Any], name: str, owner: type) -> None:
    """An override as plain data: its pattern and skip, and the fields of `owner` it changes."""
    own = {key: item for key, item in value.items() if key in ("pattern", "skip")}
    check_fields(Override, own, f"{name}.")
    check_fields(owner, {key: item for key, item in value.items() if key not in own}, f"{name}.")


def _wrong(name: str, hint: Any, value: Any) -> ConfigError:
    """`n_bits must be an integer, not 4.5` (the choices of a union: `hint` is their tuple)."""
    words = " or ".join(map(_describe, hint)) if isinstance(hint, tuple) else _describe(hint)
    return ConfigError(f"{name} must be {words}, not {shown(value)}", _leaf(name))


def _leaf(name: str) -> str:
    """The field a place names (`overrides[2].n_bits` -> `n_bits`): what a CLI maps to its flag."""
    return name.rpartition(".")[2].partition("[")[0]


def _describe(hint: Any) -> str:
    """An annotation in words: `an integer`, `a string`, `one of fp16, int16, 16bit`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(map(_describe, args))
    if origin is tuple:
        return "a list" if args[-1] is Ellipsis else f"a list of {len(args)} items"
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}
    if hint in words:
        return words[hint]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + ", ".join(str(member.value) for member in hint)
    name = str(getattr(hint, "__name__", hint))
    return f"{'an' if name[:1] in 'AEIOU' else 'a'} {name}"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
