"""Transforms by config type: a new one is a config, a module that edits the program, and one
line in `BUILT_IN` (or a `register_transform` call)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from coreai_opt.errors import ConfigError

from ._config import FoldNormsConfig, RotateConfig, ScaleConfig, TransformConfig

_HERE = "coreai_opt.transforms"


@dataclass(frozen=True)
class Edited:
    """What an edit changed, a line each; for one that learned from calibration data, the edited
    program's statistics on those samples that follow from what it measured (`weights.Known`),
    and the samples' digest (`Samples.digest`)."""

    lines: list[str]
    known: Any = None
    samples_digest: str | None = None


Edit = Callable[..., "list[str] | Edited"]  # (program, config[, calibration][, progress=...])


@dataclass(frozen=True)
class Transform:
    """A program transform: its config type and the function that edits a program in place."""

    config: type[TransformConfig]
    edit: str | Edit  # "module:function" under coreai_opt.transforms (imported on first use), or the function
    summary: str = ""

    def function(self) -> Edit:
        if callable(self.edit):
            return self.edit
        module, _, name = self.edit.partition(":")
        return getattr(importlib.import_module(f"{_HERE}.{module}"), name)  # type: ignore[no-any-return]


BUILT_IN = (
    Transform(
        FoldNormsConfig, "_fold_norms:fold_norms", "norm scales (and LayerNorm shifts) into the linears"
    ),
    Transform(RotateConfig, "_rotate:rotate", "the residual stream rotated by an orthogonal matrix"),
    Transform(ScaleConfig, "_scale:scale_channels", "per-channel scales searched on data (AWQ)"),
)
_REGISTRY: dict[type[TransformConfig], Transform] = {t.config: t for t in BUILT_IN}


def register_transform(transform: Transform) -> Transform:
    taken = next((t for t in _REGISTRY.values() if t.config.KIND == transform.config.KIND), None)
    if taken is not None and taken != transform:
        raise ValueError(f"the transform kind {transform.config.KIND!r} is taken")
    _REGISTRY[transform.config] = transform
    return transform


def unregister_transform(transform: Transform) -> None:
    _REGISTRY.pop(transform.config, None)


def transform_types() -> dict[str, type[TransformConfig]]:
    """Kind -> config type, built-in transforms first."""
    return {config.KIND: config for config in _REGISTRY}


def transform_for(config: TransformConfig) -> Transform:
    if type(config) not in _REGISTRY:
        raise ConfigError(f"no transform is registered for {type(config).__name__}", "transform")
    return _REGISTRY[type(config)]


def transform_from_dict(data: Any) -> TransformConfig:
    """A transform's config from its plain data, by its `kind`."""
    kinds = transform_types()
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in kinds:
        raise ConfigError(f"a transform's kind is one of {', '.join(kinds)}, not {kind!r}", "kind")
    return kinds[kind].from_dict(data)  # type: ignore[arg-type]
