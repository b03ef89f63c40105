"""The registry of weight passes and their algorithms, keyed by config type.

A pass is a `WeightConfig` subclass registered under its `KIND` (`register_config`): recipe files,
`config_from_dict`, `compress_` and the CLI's command list read the kinds from here. An algorithm
encodes one weight for one config type, picked by the config's `method`
(`QuantizeConfig(method="gptq")`); it says what it learns from (`weights.Needs`) and whether it
must run layer by layer - each weight's statistics taken with every earlier weight already
compressed, as GPTQ and SparseGPT need. The driver (`_driver`) maps data-free algorithms over the
weights in parallel and runs the others against a `weights.Calibration`.

Every config is checked against the registry when it is made (`configs.check_methods_with`).
A new algorithm is one module under `algorithms/` and one line in `BUILT_IN` (or a `register`
call, for a plugin or a test's toy). Built-in encoders are named by their module and function,
imported when a weight is first encoded: the registry itself imports no torch, so `--help` and
option checks stay fast.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coreai_opt.errors import ConfigError
from coreai_opt.weights import Needs

from .configs import PalettizeConfig, QuantizeConfig, SparsifyConfig, WeightConfig, check_methods_with

if TYPE_CHECKING:
    import torch

    from coreai_opt.weights import Encoding, WeightSite

__all__ = [
    "BUILT_IN",
    "PLUGIN_GROUP",
    "Algorithm",
    "Encoder",
    "algorithm_for",
    "algorithm_named",
    "config_from_dict",
    "config_type",
    "config_types",
    "learning_methods",
    "learns_from_data",
    "load_plugins",
    "methods",
    "register",
    "register_config",
    "unregister",
    "unregister_config",
]

Encoder = Callable[["torch.Tensor", "WeightSite", Any, Any], "Encoding | str"]
_ALGORITHMS = "coreai_opt.compression.algorithms"


@dataclass(frozen=True)
class Algorithm:
    """One way to encode a weight: the config type and `method` that select it, its encoder
    `(weight, site, config, statistics) -> Encoding | reason`, and what it needs."""

    config: type[WeightConfig]
    method: str
    encoder: str | Encoder  # "module:function" under `algorithms` (imported on first use), or the function
    needs: Needs = Needs.NOTHING
    # statistics handed over a weight at a time (`Calibration.sequential`), each weight encoded and
    # swapped in before the next: layer by layer in graph order, or the Fisher pass's from the output back
    sequential: bool = False
    summary: str = ""
    # each output channel's codes depend on its own values and on what is shared by every row (the
    # inputs' statistics): under a per-channel or per-group config, encoding some row groups gives
    # their rows of the whole weight's encoding, bit for bit on the CPU (`_row_sample`)
    rows_apart: bool = False
    # the encoder measures the data-free encoding of the same config beside its own (`Learned`), and
    # takes `compare=False` to skip it where nobody reads it (an estimate's trials): for k-means
    # tables, half the work
    compares: bool = False

    @property
    def name(self) -> str:
        return f"{self.config.__name__}.{self.method}"

    def encode(self) -> Encoder:
        """The encoder function (imported on first use)."""
        if callable(self.encoder):
            return self.encoder
        module, _, function = self.encoder.partition(":")
        return getattr(importlib.import_module(f"{_ALGORITHMS}.{module}"), function)  # type: ignore[no-any-return]

    @property
    def data_free(self) -> bool:
        return self.needs is Needs.NOTHING and not self.sequential


Q, P, S = QuantizeConfig, PalettizeConfig, SparsifyConfig
BUILT_IN = (
    Algorithm(Q, "rtn", "_rtn:quantize", summary="round to nearest, tcast's scale rules", rows_apart=True),
    Algorithm(P, "kmeans", "_kmeans:palettize", summary="exact k-means of the values", rows_apart=True),
    Algorithm(S, "magnitude", "_magnitude:sparsify", summary="keep the largest magnitudes"),
    Algorithm(Q, "gptq", "_gptq:quantize_gptq", Needs.INPUT_GRAM, sequential=True,
              summary="GPTQ: each column's rounding error pushed onto the next through H^-1", rows_apart=True,
              compares=True),
    Algorithm(P, "sensitive", "_sensitive:palettize_sensitive", Needs.GRADIENT_SQUARES, sequential=True,
              summary="exact k-means weighted by the Fisher information of each element", rows_apart=True,
              compares=True),
    Algorithm(P, "importance", "_sensitive:palettize_importance", Needs.INPUT_MOMENTS,
              summary="exact k-means weighted by each input channel's mean square", rows_apart=True,
              compares=True),
    Algorithm(P, "gptq", "_gptq:palettize_gptq", Needs.INPUT_GRAM, sequential=True,
              summary="GPTQ onto the tables of importance-weighted k-means", rows_apart=True, compares=True),
    Algorithm(S, "sparsegpt", "_sparsegpt:sparsify_sparsegpt", Needs.INPUT_GRAM, sequential=True,
              summary="SparseGPT: prune by the OBS score, repair through H^-1", compares=True),
)  # fmt: skip
_CONFIGS: dict[str, type[WeightConfig]] = {c.KIND: c for c in (Q, P, S)}
_REGISTRY: dict[tuple[type[WeightConfig], str], Algorithm] = {(a.config, a.method): a for a in BUILT_IN}


PLUGIN_GROUP = "coreopt.plugins"  # entry points of installed packages that register passes or algorithms
_LOADED: dict[str, str | None] = {}  # entry point -> None (loaded) or why it failed


def load_plugins() -> dict[str, str | None]:
    """Import every installed package's `coreopt.plugins` entry point once (each registers its
    passes or algorithms when imported): each entry point's name with None, or why it failed to
    load - a broken plugin is reported, never fatal. Only installed packages are read: a model
    file or folder never names code to run."""
    from importlib.metadata import entry_points

    for point in sorted(entry_points(group=PLUGIN_GROUP), key=lambda p: p.name):
        if point.name not in _LOADED:
            try:
                point.load()
                _LOADED[point.name] = None
            except Exception as exc:  # any error of someone else's module: named, not raised
                _LOADED[point.name] = f"{type(exc).__name__}: {exc}"
    return dict(_LOADED)


def register_config(config_type: type[WeightConfig]) -> type[WeightConfig]:
    """Add a pass: its config type, under its `KIND` (usable as a class decorator)."""
    if not (isinstance(config_type, type) and issubclass(config_type, WeightConfig)):
        raise TypeError(f"a pass's config is a WeightConfig subclass, not {config_type!r}")
    taken = _CONFIGS.get(config_type.KIND)
    if taken is not None and taken is not config_type:
        raise ValueError(f"the kind {config_type.KIND!r} is taken by {taken.__name__}")
    _CONFIGS[config_type.KIND] = config_type
    return config_type


def unregister_config(config_type: type[WeightConfig]) -> None:
    if _CONFIGS.get(config_type.KIND) is config_type:
        del _CONFIGS[config_type.KIND]
    for key in [key for key in _REGISTRY if key[0] is config_type]:
        del _REGISTRY[key]


def config_types() -> dict[str, type[WeightConfig]]:
    """Kind -> config type, built-in passes first."""
    return dict(_CONFIGS)


def config_type(kind: str) -> type[WeightConfig]:
    """The config type registered under `kind` (`quantize`, ...)."""
    if kind not in _CONFIGS:
        raise ConfigError(f"a config's kind is one of {', '.join(_CONFIGS)}, not {kind!r}", "kind")
    return _CONFIGS[kind]


def config_from_dict(data: Any) -> WeightConfig:
    """A pass's config from its plain data (`to_dict`), by its `kind`."""
    kind = data.get("kind") if isinstance(data, dict) else None
    return config_type(kind).from_dict(data)  # type: ignore[arg-type]


def register(algorithm: Algorithm) -> Algorithm:
    """Add an algorithm (its config type and method must not be taken yet)."""
    if algorithm.config.KIND not in _CONFIGS:
        register_config(algorithm.config)
    key = (algorithm.config, algorithm.method)
    if key in _REGISTRY and _REGISTRY[key] != algorithm:
        raise ValueError(f"{algorithm.config.__name__} already has a method {algorithm.method!r}")
    _REGISTRY[key] = algorithm
    return algorithm


def unregister(algorithm: Algorithm) -> None:
    _REGISTRY.pop((algorithm.config, algorithm.method), None)


def methods(config_type: type[WeightConfig]) -> tuple[str, ...]:
    """The methods a config type offers, built-in ones first."""
    return tuple(method for config, method in _REGISTRY if config is config_type)


def algorithm_named(config_type: type[WeightConfig], method: str) -> Algorithm:
    """The algorithm a config type offers under `method`."""
    try:
        return _REGISTRY[(config_type, method)]
    except KeyError:
        offered = ", ".join(methods(config_type))
        raise ConfigError(
            f"{config_type.__name__} has no method {method!r}; choose one of {offered}", "method"
        ) from None


def algorithm_for(config: WeightConfig) -> Algorithm:
    """The algorithm a config selects by its type and `method`, checked against its other options."""
    algorithm = algorithm_named(type(config), config.method)
    config.check_algorithm(algorithm)
    return algorithm


def learning_methods(config: WeightConfig) -> list[str]:
    """The methods of `config` and of its per-weight overrides that learn from data, sorted."""
    named = {
        config.method,
        *(dict(o.changes).get("method", config.method) for o in config.overrides if not o.skip),
    }
    return sorted(m for m in named if not algorithm_named(type(config), m).data_free)


def learns_from_data(methods: list[str]) -> str:
    """What a run of `methods` (that learn from data) given no calibration is told."""
    return (
        f"--method {', '.join(methods)} learns from data: give --calibration (a text file, safetensors "
        "samples or 'random')"
    )


check_methods_with(algorithm_for)  # every config is checked against the registry when it is made
