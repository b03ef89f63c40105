"""One frozen, validated config per pass, and per-weight overrides by name pattern.

A config names everything its pass needs (as seed 002's keyword arguments do), is built by keyword
only, and refuses a combination the pass cannot carry out when it is made (`ConfigError`, naming
the field), so bad options fail before any file is read. `overrides` change the config for the
weights whose names match a pattern - skip them, or change some fields - as coremltools'
`op_name_configs` and torchao's `FqnToConfig` let users do; the first override whose pattern
matches wins.

Each field carries its command-line flag and help (`Flag`, in the field's metadata): the CLI's
options, its flag names in errors and the `--override` parser are made from them. A config
serialises to plain data with its kind and a version (`to_dict` / `config_from_dict`; JSON or
YAML files through `coreai_opt.recipes`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from coreai_opt.errors import ConfigError

CONFIG_VERSION = 1  # of `to_dict`'s layout


@dataclass(frozen=True)
class Flag:
    """How a config field appears on the command line: its flag, its help, the values it offers
    (None: any of its type), and the CLI's own default where it differs from the library's."""

    flag: str
    help: str
    choices: tuple[Any, ...] | None = None
    cli_default: Any = None  # None: the library's default
    minimum: int | None = (
        None  # the least value an integer option takes (the CLI and the config both hold it)
    )


def option(default: Any, flag: str, help: str, **more: Any) -> Any:
    """A config field with its `Flag`."""
    return field(default=default, metadata={"flag": Flag(flag, help, **more)})


def flags(config_type: type) -> dict[str, Flag]:
    """Field name -> its `Flag`, in field order."""
    return {f.name: f.metadata["flag"] for f in dataclasses.fields(config_type) if "flag" in f.metadata}


def check_options(config: Any) -> None:
    """Every field with a `Flag` against what the flag offers: its `choices`, its `minimum` for an
    integer (None passes where the field allows it); `ConfigError` names the field."""
    for name, flag in flags(type(config)).items():
        value = getattr(config, name)
        if value is None:
            continue
        if flag.minimum is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < flag.minimum
        ):
            raise ConfigError(f"{name} must be an integer of {flag.minimum} or more, not {value!r}", name)
        if flag.choices is not None and value not in flag.choices:
            offered = ", ".join(str(getattr(c, "value", c)) for c in flag.choices)
            raise ConfigError(f"{name} takes one of {offered}, not {value!r}", name)


def plain_fields(config_type: type, data: Any, version: int) -> dict[str, Any]:
    """A config's field values from its plain data, once it is a mapping of the layout `version`
    with no field the config lacks (`kind` and `version` left out); `ConfigError` names the fault."""
    name = config_type.__name__
    if not isinstance(data, dict):
        raise ConfigError(f"a {name} is a mapping of its options, not {type(data).__name__}", "config")
    if data.get("version", version) != version:
        raise ConfigError(
            f"{name} version {data.get('version')!r} is not one this coreopt reads ({version})", "version"
        )
    values = {k: v for k, v in data.items() if k not in ("kind", "version")}
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(config_type)})
    if unknown:
        raise ConfigError(f"{name} has no option {unknown[0]!r}", unknown[0])
    return values


def flag_names(config_type: type) -> dict[str, str]:
    """Field name -> its command-line flag (what a CLI error names)."""
    return {name: flag.flag for name, flag in flags(config_type).items()}


@dataclass(frozen=True)
class Override:
    """Weights whose name matches `pattern` (a glob over the whole name, e.g. `layers.*.attn.*`)
    are skipped, or compressed with the config's fields in `changes` replaced."""

    pattern: str
    skip: bool = False
    changes: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, pattern: str, skip: bool = False, **changes: Any) -> Override:
        """`Override.of("embed*", skip=True)`, `Override.of("layers.*.attn.*", dtype=DType.INT8)`."""
        return cls(pattern, skip, tuple(sorted(changes.items())))

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str) or not self.pattern:
            raise ValueError("an override needs a non-empty name pattern")
        if self.skip and self.changes:
            raise ValueError(f"override {self.pattern!r}: skip takes no other changes")
        if not self.skip and not self.changes:
            raise ValueError(f"override {self.pattern!r} changes nothing: give skip or some options")
        if any(key in ("overrides", "weight_num_threshold") for key, _ in self.changes):
            raise ValueError(
                f"override {self.pattern!r}: overrides and the threshold apply to the whole program"
            )

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.pattern)

    def describe(self) -> str:
        return f"{self.pattern}: " + (
            "skip" if self.skip else ", ".join(f"{k}={_text(v)}" for k, v in self.changes)
        )


def _text(value: Any) -> str:
    return str(getattr(value, "value", value))


def parse_override(text: str, config_type: type) -> Override:
    """`PATTERN:skip` or `PATTERN:OPTION=VALUE[,OPTION=VALUE...]` (the CLI's --override): an
    option by its field's name or its flag's (`n_bits=8` or `nbits=8`, `per-channel-scale=true`),
    the values read as the config's fields take them (`n_m_ratio=2:4`, `nm=2:4`)."""
    pattern, sep, spec = text.rpartition(":") if text.endswith(":skip") else text.partition(":")
    if not sep or not pattern or not spec:
        raise ValueError(f"override {text!r} is not PATTERN:skip or PATTERN:OPTION=VALUE[,OPTION=VALUE]")
    if spec == "skip":
        return Override.of(pattern, skip=True)
    fields = {f.name: str(f.type) for f in dataclasses.fields(config_type)}
    by_flag = {_spelled(flag.flag): name for name, flag in flags(config_type).items()}
    changes: dict[str, Any] = {}
    for item in spec.split(","):
        key, eq, value = item.partition("=")
        key = _spelled(key)
        key = key if key in fields else by_flag.get(key, key)
        if not eq or key not in fields:
            raise ValueError(f"override {text!r}: {key!r} is not an option of {config_type.__name__}")
        changes[key] = _field_value(fields[key], value.strip(), text)
    return Override.of(pattern, **changes)


def _spelled(name: str) -> str:
    """A field's or flag's name as one spelling: `--per-channel-scale` -> `per_channel_scale`."""
    return name.strip().lstrip("-").replace("-", "_")


def _field_value(annotation: str, value: str, text: str) -> Any:
    if value.lower() == "none":
        return None
    try:
        if annotation.startswith("bool"):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        if annotation.startswith("tuple[int, int]"):
            n, m = value.split(":")
            return (int(n), int(m))
        if annotation.startswith("int"):
            return int(value)
        if annotation.startswith("float"):
            return float(value)
    except ValueError:
        raise ValueError(f"override {text!r}: {value!r} is not a {annotation.split(' ')[0]}") from None
    return value  # an enum's value: the config turns it into the enum and checks it


C = TypeVar("C", bound="WeightConfig")

# `compression.registry` (which imports this module, never the other way) installs its method
# check here when it is imported - as `coreai_opt.compression` does - so that a config naming a
# method its type does not offer, or one its options cannot go with, is refused when it is made.
_METHOD_CHECK: list[Callable[[WeightConfig], object]] = []


def check_methods_with(check: Callable[[WeightConfig], object]) -> None:
    """Make `check(config)` part of every config's validation (the registry's lookup)."""
    _METHOD_CHECK[:] = [check]


_THRESHOLD_HELP = "Skip weights with this many elements or fewer."
_OVERRIDE_HELP = (
    "Per-weight change, by a glob over the weight's name (first match wins): 'PATTERN:skip', or "
    "'PATTERN:OPTION=VALUE[,OPTION=VALUE]' with the pass's options by flag or field name (dtype=int8, nbits=8, "
    "granularity=channel, ...). Repeatable. Example: --override 'embed*:skip'"
)
_METHOD_HELP = "The algorithm (data-free: {default}; those that learn from data need --calibration)."


class WeightConfig:
    """The base of every weight pass's config (`QuantizeConfig`, ...; a plugin's own): a frozen,
    keyword-only dataclass whose fields carry their `Flag`, with a `KIND` (its name in recipe
    files and on the command line), the size threshold, the overrides and the `method` that picks
    its algorithm from `compression.registry`. It serialises to versioned plain data (`to_dict`,
    `from_dict`). Which methods exist is the registry's fact; it checks a config's method when
    the config is made (`check_methods_with`)."""

    KIND: ClassVar[str]
    weight_num_threshold: int
    overrides: tuple[Override, ...]
    method: str

    def check_algorithm(self, algorithm: Any) -> None:
        """Refuse an algorithm this config's other options cannot go with (`ConfigError`); the
        registry calls it when it looks the method up."""
        del algorithm

    @property
    def tag(self) -> str:
        """Names the default output file (model.<tag>.aimodel)."""
        return self.KIND

    def _check_common(self) -> None:
        if not isinstance(self.method, str) or not self.method:
            raise ConfigError(f"method is an algorithm's name, not {self.method!r}", "method")
        for check in _METHOD_CHECK:
            check(self)
        if not isinstance(self.weight_num_threshold, int) or self.weight_num_threshold < 0:
            raise ConfigError("weight_num_threshold must be 0 or more", "weight_num_threshold")
        object.__setattr__(self, "overrides", tuple(self.overrides))
        canonical = []
        for override in self.overrides:
            if not isinstance(override, Override):
                raise ConfigError(f"overrides take Override records, not {override!r}", "overrides")
            names = {f.name for f in dataclasses.fields(self)}  # type: ignore[arg-type]
            unknown = [key for key, _ in override.changes if key not in names]
            if unknown:
                raise ConfigError(
                    f"override {override.pattern!r}: {type(self).__name__} has no option {unknown[0]!r}",
                    "overrides",
                )
            if not override.skip:  # the changed config must be valid too: fail now, not mid-run
                try:
                    changed = dataclasses.replace(self, overrides=(), **self._changes(override))  # type: ignore[type-var]
                except (ValueError, TypeError) as exc:
                    raise ConfigError(f"override {override.pattern!r}: {exc}", "overrides") from None
                # the values as the config holds them (enums, tuples): one override, one spelling
                values = tuple((key, getattr(changed, key)) for key, _ in override.changes)
                override = dataclasses.replace(override, changes=values)
            canonical.append(override)
        object.__setattr__(self, "overrides", tuple(canonical))

    def for_weight(self: C, name: str) -> C | Override | None:
        """The config for one weight: itself, the first matching override's version of it, or the
        skipping override (the caller reports it)."""
        for override in self.overrides:
            if override.matches(name):
                if override.skip:
                    return override
                return dataclasses.replace(self, overrides=(), **self._changes(override))  # type: ignore[type-var]
        return self

    def _changes(self, override: Override) -> dict[str, Any]:
        """The fields an override replaces (a config may add the ones they imply)."""
        return dict(override.changes)

    def unmatched_overrides(self, names: list[str]) -> list[Override]:
        """Overrides whose pattern matches none of `names` (a typo, most likely)."""
        return [o for o in self.overrides if not any(o.matches(n) for n in names)]

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data (its kind, the layout's version, every field; enums by value,
        overrides as pattern, skip and changes) that `config_from_dict` reads back."""
        data: dict[str, Any] = {"kind": self.KIND, "version": CONFIG_VERSION}  # type: ignore[attr-defined]
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "overrides":
                data[f.name] = [
                    {
                        "pattern": o.pattern,
                        **({"skip": True} if o.skip else {}),
                        **{k: _plain(v) for k, v in o.changes},
                    }
                    for o in value
                ]
            else:
                data[f.name] = _plain(value)
        return data

    @classmethod
    def from_dict(cls: type[C], data: Any) -> C:
        """A config from `to_dict`'s data (unknown fields and versions are refused, naming them)."""
        values = plain_fields(cls, data, CONFIG_VERSION)
        if "overrides" in values:
            values["overrides"] = tuple(_override_from(item, cls) for item in values["overrides"] or ())
        if isinstance(values.get("n_m_ratio"), list):
            values["n_m_ratio"] = tuple(values["n_m_ratio"])
        try:
            return cls(**values)
        except TypeError as exc:
            raise ConfigError(f"{cls.__name__}: {exc}", "config") from None

    def options(self) -> dict[str, Any]:
        """The options as plain JSON values (enums by their value, overrides described)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "overrides":
                out[f.name] = [o.describe() for o in value]
            elif isinstance(value, tuple):
                out[f.name] = [_text(v) for v in value]
            else:
                out[f.name] = (
                    None
                    if value is None
                    else (value if isinstance(value, (bool, int, float)) else _text(value))
                )
        return out


def _plain(value: Any) -> Any:
    """A field value as JSON/YAML data: enums by value, tuples as lists."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return getattr(value, "value", value)


def _override_from(item: Any, config_type: type) -> Override:
    if not isinstance(item, dict) or not isinstance(item.get("pattern"), str):
        raise ConfigError(f"an override is a mapping with a pattern, not {item!r}", "overrides")
    changes = {k: v for k, v in item.items() if k not in ("pattern", "skip")}
    if isinstance(changes.get("n_m_ratio"), list):
        changes["n_m_ratio"] = tuple(changes["n_m_ratio"])
    try:
        return Override.of(item["pattern"], skip=bool(item.get("skip", False)), **changes)
    except ValueError as exc:
        raise ConfigError(str(exc), "overrides") from None


def _enum(kind: type, value: Any, field_name: str) -> Any:
    if value is None or isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise ConfigError(f"unknown {kind.__name__} {value!r}; choose one of {choices}", field_name) from None
