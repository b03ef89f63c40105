"""A recipe: an ordered list of steps, read from and written to JSON or YAML files.

    version: 1
    steps:
      - compress:
          config: {kind: palettize, n_bits: 4, granularity: grouped, group_size: 16,
                   overrides: [{pattern: "embed*", n_bits: 8}]}
      - cast: {to: fp16}
      - convert: {}

`coreopt apply RECIPE MODEL -o OUT` runs one; every `coreopt quantize|palettize|sparsify|cast|convert`
is a recipe of one step, and `coreopt optimize` writes the recipe it found. Recipes come from other
people: a file is read within the bounds of `_values` (its size, steps, values, depth) and every
value type-checked before any step is built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coreai_opt.calibration import CalibrationSpec
from coreai_opt.compression import WeightConfig
from coreai_opt.errors import ConfigError, shown
from coreai_opt.io import ModelFileError, one_line, write_atomically

from ._steps import STEP_CALIBRATION, STEP_TYPES, Step, config_of
from ._values import MAX_FILE_BYTES, MAX_STEPS, check_document, check_fields, read_yaml

RECIPE_VERSION = 1
_YAML = (".yaml", ".yml")


@dataclass(frozen=True)
class Recipe:
    """Steps run in order on one program; `calibration`: the data every step that learns from data
    reads (set once for the recipe)."""

    steps: tuple[Step, ...]
    calibration: CalibrationSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        _check_count(len(self.steps))
        for step in self.steps:
            if type(step) not in STEP_TYPES.values():
                raise ConfigError(
                    f"a recipe's steps are {', '.join(STEP_TYPES)} steps, not {step!r}", "steps"
                )
        if self.calibration is not None and not isinstance(self.calibration, CalibrationSpec):
            raise ConfigError(f"calibration is a CalibrationSpec, not {self.calibration!r}", "calibration")

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"version": RECIPE_VERSION}
        if self.calibration is not None:
            data["calibration"] = self.calibration.to_dict()
        return data | {"steps": [{s.KIND: s.to_dict()} for s in self.steps]}

    @classmethod
    def from_dict(cls, data: Any) -> Recipe:
        """A recipe from plain data: the step count and the document's bounds checked before any
        step is built, then each step's values (an error names the step)."""
        if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
            raise ConfigError("a recipe is a mapping with a list of steps", "steps")
        _check_count(len(data["steps"]))
        check_document(data)
        version = data.get("version", RECIPE_VERSION)
        if type(version) is not int or version != RECIPE_VERSION:
            raise ConfigError(f"recipe version {version!r} is not {RECIPE_VERSION}", "version")
        unknown = sorted(set(data) - {"version", "steps", "calibration"})
        if unknown:
            raise ConfigError(f"a recipe has no field {unknown[0]!r}", unknown[0])
        steps, calibration = _lifted(data["steps"], data.get("calibration"))
        return cls(tuple(_step(number, entry) for number, entry in enumerate(steps, 1)), calibration)

    @classmethod
    def load(cls, path: Path | str) -> Recipe:
        """A recipe file (JSON, or YAML by its suffix); a bad file raises a one-line error naming it."""
        path = Path(path)
        if not path.is_file():
            raise ModelFileError(path, "no such recipe file")
        data = _parse(path, _read(path))
        try:
            return cls.from_dict(data)
        except ConfigError as exc:
            raise ModelFileError(path, str(exc)) from None

    def save(self, path: Path | str) -> Path:
        """Write the recipe (YAML by the suffix, else JSON), atomically - only one that `load` reads
        back (within the bounds of a recipe file), so nothing coreopt writes is refused later."""
        path = Path(path)
        document = self.to_dict()
        check_document(document)
        if path.suffix in _YAML:
            import yaml

            text = yaml.safe_dump(document, sort_keys=False)
        else:
            text = json.dumps(document, indent=2) + "\n"
        if len(text.encode()) > MAX_FILE_BYTES:
            raise ConfigError(
                f"a recipe file is at most {MAX_FILE_BYTES >> 20} MiB; this one would be larger", "steps"
            )
        write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
        return path


def config_from_text(text: str) -> WeightConfig:
    """A compression config from a file (JSON or YAML: the config itself, or a recipe step holding
    one - read within a recipe file's bounds, every value type-checked, an error naming the file)
    or from `KIND:key=value,...` (values read as YAML scalars, type-checked too), e.g.
    `palettize:n_bits=4,granularity=grouped,group_size=16`."""
    path = Path(text)
    if path.suffix not in (".json", *_YAML):
        return config_of(_inline(text), "config")
    if not path.is_file():
        raise ModelFileError(path, "no such config file")
    data = _parse(path, _read(path))
    if isinstance(data, dict) and "compress" in data:  # a recipe step's form
        data = data["compress"]
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        data = data["config"]
    try:
        check_document(data)
        return config_of(data, "config")
    except ConfigError as exc:
        raise ModelFileError(path, str(exc)) from None


def _inline(text: str) -> dict[str, Any]:
    import yaml

    kind, _, rest = text.partition(":")
    data: dict[str, Any] = {"kind": kind.strip()}
    for pair in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"{pair!r} is not key=value", "config")
        data[key.strip()] = yaml.safe_load(value)
    return data


def _check_count(count: int) -> None:
    """A recipe made in Python or read from a file: its step count (MAX_STEPS says why the bound)."""
    if count < 1:
        raise ConfigError("a recipe needs at least one step", "steps")
    if count > MAX_STEPS:
        raise ConfigError(f"a recipe has at most {MAX_STEPS} steps, not {count}", "steps")


def _step(number: int, entry: Any) -> Step:
    """Step `number` (from 1) of a recipe's plain data; an error says which step."""
    if not isinstance(entry, dict) or len(entry) != 1:
        raise ConfigError(
            f"step {number}: a recipe step is one of {', '.join(STEP_TYPES)} with its options", "steps"
        )
    ((kind, options),) = entry.items()
    if kind not in STEP_TYPES:
        raise ConfigError(
            f"step {number}: unknown recipe step {kind!r}; steps are {', '.join(STEP_TYPES)}", "steps"
        )
    try:
        return STEP_TYPES[kind].from_dict(options if options is not None else {})  # type: ignore[no-any-return]
    except ConfigError as exc:
        raise ConfigError(f"step {number} ({kind}): {exc}", *exc.fields) from None


def _read(path: Path) -> str:
    """The file's text, read no further than MAX_FILE_BYTES (its stated size is not trusted: a /proc
    file says 0)."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise ModelFileError(
                path, f"a recipe file is at most {MAX_FILE_BYTES >> 20} MiB; this one is larger"
            )
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelFileError(path, f"not a readable recipe ({one_line(exc, 200)})") from None


def _parse(path: Path, text: str) -> Any:
    """The document a recipe file holds, as plain data (YAML's safe loader: never a Python object)."""
    try:
        return read_yaml(text) if path.suffix in _YAML else json.loads(text)
    except ConfigError as exc:  # past a bound
        raise ModelFileError(path, str(exc)) from None
    except RecursionError:  # lists or mappings nested thousands deep
        raise ModelFileError(path, "not a readable recipe (nested too deeply)") from None
    except Exception as exc:  # json's ValueError, yaml's own errors
        raise ModelFileError(path, f"not a readable recipe ({one_line(exc, 200)})") from None


def _lifted(steps: list[Any], given: Any) -> tuple[list[Any], CalibrationSpec | None]:
    """The steps without calibration fields, and the recipe's calibration: as given, or as the
    compress steps of an older recipe each held it (they must agree)."""
    found: list[dict[str, Any]] = []
    kept = []
    for entry in steps:
        body = entry.get("compress") if isinstance(entry, dict) and len(entry) == 1 else None
        if isinstance(body, dict) and set(body) & set(STEP_CALIBRATION):
            found.append({STEP_CALIBRATION[k]: v for k, v in body.items() if k in STEP_CALIBRATION})
            entry = {"compress": {k: v for k, v in body.items() if k not in STEP_CALIBRATION}}
        kept.append(entry)
    if any(f != found[0] for f in found) or (found and given is not None):
        raise ConfigError("a recipe's calibration is set once, at its top level: its compress steps disagree "
                          "or repeat it", "calibration")  # fmt: skip
    plain = given if given is not None else (found[0] if found else None)
    if plain is None:
        return kept, None
    if not isinstance(plain, dict):
        raise ConfigError(f"calibration is a mapping of its options, not {shown(plain)}", "calibration")
    check_fields(CalibrationSpec, plain, "calibration.")
    try:
        return kept, CalibrationSpec.from_dict(plain)
    except ConfigError as exc:
        raise ConfigError(f"calibration: {exc}", *exc.fields) from None
