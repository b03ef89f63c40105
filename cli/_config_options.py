"""Command-line options made from a config's fields: each field's `Flag` (flag, help, choices,
the CLI's default) becomes a Typer option, so the library states every option once."""

from __future__ import annotations

import dataclasses
import enum
import inspect
from typing import Any

import typer

from ._common import choices, option_errors

# field type (as the config module spells it) -> the Python type Typer parses
_PLAIN = {"int": int, "float": float, "bool": bool, "str": str}


def _type_of(config_type: type, field: dataclasses.Field[Any], name: str) -> Any:
    """The option's type: a choice of the field's values, a plain type, a list (overrides) or text."""
    from coreai_opt.compression import methods

    flag = field.metadata["flag"]
    spelled = str(field.type).replace(" | None", "")
    if field.name == "method":
        return choices(f"{name}Method", tuple(_Value(m) for m in methods(config_type)))
    if flag.choices is not None and all(isinstance(c, enum.Enum) for c in flag.choices):
        return choices(f"{name}{field.name.title().replace('_', '')}", tuple(_Value(c) for c in flag.choices))
    if field.name == "overrides":
        return list[str]
    return _PLAIN.get(spelled, str)  # tuple[int, int] as text: the config's own parser reads it


@dataclasses.dataclass(frozen=True)
class _Value:
    """A choice offered by value (an enum's value, a number, a method name)."""

    value: Any

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", str(getattr(self.value, "value", self.value)))


def _default(field: dataclasses.Field[Any]) -> Any:
    flag = field.metadata["flag"]
    value = flag.cli_default if flag.cli_default is not None else field.default
    if field.name == "overrides":
        return []
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return ":".join(str(v) for v in value)
    return value


def keyword(name: str, default: Any, annotation: Any) -> inspect.Parameter:
    """A command's keyword parameter: its Typer option (or argument) as the default."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def config_parameters(config_type: type, prefix: str = "") -> list[inspect.Parameter]:
    """Keyword parameters, one per field with a `Flag`, each a Typer option."""
    parameters = []
    for field in dataclasses.fields(config_type):
        if "flag" not in field.metadata:
            continue
        flag = field.metadata["flag"]
        kind = _type_of(config_type, field, config_type.__name__)
        default = _default(field)
        optional = " | None" in str(field.type) or default is None
        annotation = kind | None if optional and kind is not list[str] else kind
        if (
            kind is not list[str]
            and isinstance(kind, type)
            and issubclass(kind, enum.Enum)
            and default is not None
        ):
            default = str(default)
        limits = {"min": flag.minimum} if flag.minimum is not None else {}
        option = typer.Option(default, flag.flag, help=flag.help, **limits)
        parameters.append(inspect.Parameter(prefix + field.name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                            annotation=annotation))  # fmt: skip
    return parameters


def config_from_options(config_type: type, values: dict[str, Any], **fixed: Any) -> Any:
    """The config the parsed options describe; an invalid value exits 2 naming its flag."""
    from coreai_opt.compression import flag_names, parse_override

    fields = {f.name: f for f in dataclasses.fields(config_type)}
    kwargs: dict[str, Any] = {}
    flags = flag_names(config_type)
    extra: dict[str, Any] = {}
    if "overrides" in fields:
        with option_errors({}, flags["overrides"]):
            extra["overrides"] = tuple(
                parse_override(text, config_type) for text in values.get("overrides") or ()
            )
    with option_errors(flags):
        for name, value in values.items():
            if name == "overrides" or name not in fields:
                continue
            value = getattr(value, "value", value)
            if isinstance(value, str) and str(fields[name].type).startswith("tuple[int, int]"):
                value = _pair(value, flags[name])
            kwargs[name] = value
        kwargs.update(fixed)
        return config_type(**kwargs, **extra)


def _pair(text: str, flag: str) -> tuple[int, int]:
    """`N:M` as two integers."""
    parts = text.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise typer.BadParameter(f"expected N:M such as 2:4, not {text!r}", param_hint=flag)
    return int(parts[0]), int(parts[1])
