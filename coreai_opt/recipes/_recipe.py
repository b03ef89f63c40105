"""A recipe: an ordered list of steps, read from and written to JSON or YAML files.

    version: 1
    steps:
      - compress:
          config: {kind: palettize, n_bits: 4, granularity: grouped, group_size: 16,
                   overrides: [{pattern: "embed*", n_bits: 8}]}
      - cast: {to: fp16}
      - convert: {}

`coreopt apply RECIPE MODEL -o OUT` runs one; every `coreopt quantize|palettize|sparsify|cast|convert`
is a recipe of one step, and `coreopt optimize` writes the recipe it found.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coreai_opt._errors import ConfigError
from coreai_opt.io import ModelFileError, write_atomically

from ._steps import STEP_TYPES, Step

RECIPE_VERSION = 1
_YAML = (".yaml", ".yml")


@dataclass(frozen=True)
class Recipe:
    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        if not self.steps:
            raise ConfigError("a recipe needs at least one step", "steps")
        for step in self.steps:
            if type(step) not in STEP_TYPES.values():
                raise ConfigError(f"a recipe's steps are compress, quantize_activations, cast, convert or "
                                  f"budget steps, not {step!r}", "steps")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {"version": RECIPE_VERSION, "steps": [{s.KIND: s.to_dict()} for s in self.steps]}

    @classmethod
    def from_dict(cls, data: Any) -> Recipe:
        if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
            raise ConfigError("a recipe is a mapping with a list of steps", "steps")
        if data.get("version", RECIPE_VERSION) != RECIPE_VERSION:
            raise ConfigError(f"recipe version {data.get('version')!r} is not {RECIPE_VERSION}", "version")
        unknown = sorted(set(data) - {"version", "steps"})
        if unknown:
            raise ConfigError(f"a recipe has no field {unknown[0]!r}", unknown[0])
        steps = []
        for entry in data["steps"]:
            if not isinstance(entry, dict) or len(entry) != 1:
                raise ConfigError(
                    f"a recipe step is one of {', '.join(STEP_TYPES)} with its options", "steps"
                )
            ((kind, options),) = entry.items()
            if kind not in STEP_TYPES:
                raise ConfigError(f"unknown recipe step {kind!r}; steps are {', '.join(STEP_TYPES)}", "steps")
            steps.append(STEP_TYPES[kind].from_dict(options if options is not None else {}))
        return cls(tuple(steps))

    @classmethod
    def load(cls, path: Path | str) -> Recipe:
        """A recipe file (JSON, or YAML by its suffix); a bad file raises a one-line error."""
        path = Path(path)
        if not path.is_file():
            raise ModelFileError(path, "no such recipe file")
        try:
            text = path.read_text(encoding="utf-8")
            if path.suffix in _YAML:
                import yaml

                data = yaml.safe_load(text)
            else:
                data = json.loads(text)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ModelFileError(
                path, f"not a readable recipe ({' '.join(str(exc).split())[:200]})"
            ) from None
        except Exception as exc:  # yaml's own errors
            raise ModelFileError(
                path, f"not a readable recipe ({' '.join(str(exc).split())[:200]})"
            ) from None
        try:
            return cls.from_dict(data)
        except ConfigError as exc:
            raise ModelFileError(path, str(exc)) from None

    def save(self, path: Path | str) -> Path:
        """Write the recipe (YAML by the suffix, else JSON), atomically."""
        path = Path(path)
        if path.suffix in _YAML:
            import yaml

            text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        else:
            text = json.dumps(self.to_dict(), indent=2) + "\n"
        write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
        return path
