"""Plans as recipes, and recipes applied: `Steps` turns a plan (a choice per weight) into the
recipe steps `coreopt apply` runs - one compress step per config kind with a per-weight override
each - and `make` applies one to a program as `coreopt apply` would. The rounds (`_confirm`), the
uniform settings (`_uniform`) and the recipe returned by `optimize` are all made this way, so what
is measured is exactly what the saved recipe reproduces.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coreai_opt.errors import ConfigError

from ._choices import Choice
from ._config import AUTO_TUNE_EPOCHS
from ._costs import CostTable
from ._solve import Plan


def plan_recipe(steps: Steps, plan: Plan) -> Any:
    """The recipe that makes `plan` (a `.pt2`: no conversion step)."""

    return steps.recipe(plan, to_aimodel=False)


def make(recipe: Any, source: Path, out: Path) -> Path:
    """`out`, written by applying `recipe` to `source` as `coreopt apply` would (a failing step
    raised as a `ConfigError`)."""
    from coreai_opt.recipes import apply_recipe

    result = apply_recipe(recipe, source, out, force=True, allow_empty=True)
    if result.failed is not None:
        raise ConfigError(f"the plan's {result.failed} failed", "recipe")
    return out


def _literal(name: str) -> str:
    """An fnmatch glob matching exactly `name`."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _epochs(asked: int | None, config: Any) -> int:
    """The palettize step's tuning passes: as asked, or (None) `AUTO_TUNE_EPOCHS` where its
    method learns from data and none where it does not."""
    from coreai_opt.compression import algorithm_for

    if asked is not None:
        return asked
    return 0 if algorithm_for(config).data_free else AUTO_TUNE_EPOCHS


@dataclass
class Steps:
    """Plans as recipe steps: one compress step per config kind (palettize, quantize, sparsify),
    its base the kind's most used choice, a per-weight override for every weight it takes (the
    fields where its choice differs) and `*: skip` for the rest; the palettize step tunes all its
    tables together end to end when `tune_epochs` is set (None: `AUTO_TUNE_EPOCHS` where its method
    learns from data), and a block at a time first with `tune_blocks`."""

    choices: tuple[Choice, ...]
    table: CostTable
    calibration: str
    tokens: int | None
    samples: int | None
    device: str | None
    threshold: int
    tune_epochs: int | None = 0  # passes that tune the palettize step's tables end to end (None: auto)
    tune_blocks: int = 0  # passes that tune its tables and codes a block at a time first

    def of(self, plan: Plan, *, to_aimodel: bool) -> tuple[Any, ...]:
        from coreai_opt.compression import Override
        from coreai_opt.recipes import Compress

        by_choice: dict[str, list[str]] = {}
        for name, k in zip(self.table.names, plan.picks, strict=True):
            by_choice.setdefault(self.table.choices[k], []).append(name)
        configs = {c.name: c.config_for(True, self.threshold) for c in self.choices}
        kinds: dict[str, list[str]] = {}
        for choice in by_choice:
            config = configs[choice]
            if config is not None:
                kinds.setdefault(config.KIND, []).append(choice)
        found: list[Any] = []
        for kind in ("palettize", "quantize", "sparsify"):
            if kind not in kinds:
                continue
            members = sorted(kinds[kind], key=lambda c: (-len(by_choice[c]), c))
            base = configs[members[0]]
            overrides = []
            for name in self.table.names:
                choice = next((c for c in members if name in by_choice[c]), None)
                if choice is None:
                    continue
                changes = _differences(configs[choice], base) or {"method": base.method}
                overrides.append(Override.of(_literal(name), **changes))
            overrides.append(Override.of("*", skip=True))
            config = dataclasses.replace(base, overrides=tuple(overrides))
            epochs = _epochs(self.tune_epochs, config) if kind == "palettize" else 0
            if epochs:
                config = dataclasses.replace(config, tune_epochs=epochs)
            if kind == "palettize" and self.tune_blocks:
                config = dataclasses.replace(config, tune_blocks=self.tune_blocks)
            found.append(Compress(config=config))
        if to_aimodel:
            found.extend(self.convert())
        return tuple(found)

    def recipe(self, plan: Plan, *, to_aimodel: bool) -> Any:
        """The plan as a recipe: its steps, reading the search's calibration data."""
        from coreai_opt.calibration import CalibrationSpec
        from coreai_opt.recipes import Recipe

        spec = CalibrationSpec(
            source=self.calibration, tokens=self.tokens, samples=self.samples, device=self.device
        )
        return Recipe(self.of(plan, to_aimodel=to_aimodel), spec)

    def convert(self) -> tuple[Any, ...]:
        from coreai_opt.recipes import Convert

        return (Convert(),)


def _differences(config: Any, base: Any) -> dict[str, Any]:
    a, b = config.to_dict(), base.to_dict()
    return {
        k: getattr(config, k)
        for k in a
        if k not in ("overrides", "weight_num_threshold", "kind", "version") and a[k] != b[k]
    }
