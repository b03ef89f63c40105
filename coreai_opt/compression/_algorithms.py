"""The compression algorithms: each is one module and one entry in `BUILT_IN`.

An algorithm encodes one weight for one config type, selected by the config's `method`
(`QuantizeConfig(method="rtn")`). It says what it learns from (`weights.Needs`: nothing, the
second moments of each input channel of the weight's consumer, the consumer's full input Gram
matrix, or the squared gradients of the loss per weight element) and whether it must run layer by
layer - each weight's statistics taken with every earlier weight already compressed, as GPTQ and
SparseGPT need. The driver (`_driver`) maps data-free algorithms over the weights in parallel and
runs the others against a `weights.Calibration` (`coreai_opt.calibration` gathers it).

Built-in entries name their encoder by import path, so nothing is imported before it runs;
`register` adds one at run time (a plugin, a test's toy algorithm).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coreai_opt._errors import ConfigError
from coreai_opt.weights import Needs

if TYPE_CHECKING:
    import torch

    from coreai_opt.weights import Encoding, WeightSite


Encoder = Callable[["torch.Tensor", "WeightSite", Any, Any], "Encoding | str"]


@dataclass(frozen=True)
class Algorithm:
    """One way to encode a weight: the config type and `method` that select it, its encoder
    `(weight, site, config, statistics) -> Encoding | reason`, and what it needs."""

    config: str  # the config class's name (QuantizeConfig, PalettizeConfig, SparsifyConfig)
    method: str
    encoder: str | Encoder  # "module:function", or the function itself
    needs: Needs = Needs.NOTHING
    # statistics handed over a weight at a time (`Calibration.sequential`), each weight encoded and
    # swapped in before the next: layer by layer in graph order, or the Fisher pass's from the output back
    sequential: bool = False
    summary: str = ""

    @property
    def name(self) -> str:
        return f"{self.config}.{self.method}"

    def encode(self) -> Encoder:
        """The encoder function (imported on first use)."""
        if callable(self.encoder):
            return self.encoder
        module, _, function = self.encoder.partition(":")
        return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]

    @property
    def data_free(self) -> bool:
        return self.needs is Needs.NOTHING and not self.sequential


_HERE = "coreai_opt.compression"
BUILT_IN = (
    Algorithm("QuantizeConfig", "rtn", f"{_HERE}._quantize:quantize", summary="round to nearest, tcast's scale rules"),
    Algorithm("PalettizeConfig", "kmeans", f"{_HERE}._palettize:palettize", summary="exact k-means of the values"),
    Algorithm("SparsifyConfig", "magnitude", f"{_HERE}._sparsify:sparsify", summary="keep the largest magnitudes"),
    Algorithm("QuantizeConfig", "gptq", f"{_HERE}._gptq:quantize_gptq", Needs.INPUT_GRAM, sequential=True,
              summary="GPTQ: each column's rounding error pushed onto the next through H^-1"),
    Algorithm("PalettizeConfig", "sensitive", f"{_HERE}._sensitive:palettize_sensitive", Needs.GRADIENT_SQUARES,
              sequential=True, summary="exact k-means weighted by the Fisher information of each element"),
    Algorithm("PalettizeConfig", "importance", f"{_HERE}._sensitive:palettize_importance", Needs.INPUT_MOMENTS,
              summary="exact k-means weighted by each input channel's mean square"),
    Algorithm("PalettizeConfig", "gptq", f"{_HERE}._gptq:palettize_gptq", Needs.INPUT_GRAM, sequential=True,
              summary="GPTQ onto the tables of importance-weighted k-means"),
    Algorithm("SparsifyConfig", "sparsegpt", f"{_HERE}._sparsegpt:sparsify_sparsegpt", Needs.INPUT_GRAM,
              sequential=True, summary="SparseGPT: prune by the OBS score, repair through H^-1"),
)  # fmt: skip
_REGISTRY: dict[tuple[str, str], Algorithm] = {(a.config, a.method): a for a in BUILT_IN}


def register(algorithm: Algorithm) -> Algorithm:
    """Add an algorithm (its config type and method must not be taken yet)."""
    key = (algorithm.config, algorithm.method)
    if key in _REGISTRY and _REGISTRY[key] != algorithm:
        raise ValueError(f"{algorithm.config} already has a method {algorithm.method!r}")
    _REGISTRY[key] = algorithm
    return algorithm


def unregister(algorithm: Algorithm) -> None:
    _REGISTRY.pop((algorithm.config, algorithm.method), None)


def methods(config_type: type | str) -> tuple[str, ...]:
    """The methods a config type offers, built-in ones first."""
    name = config_type if isinstance(config_type, str) else config_type.__name__
    return tuple(method for config, method in _REGISTRY if config == name)


def algorithm_named(config_type: type | str, method: str) -> Algorithm:
    """The algorithm a config type offers under `method`."""
    name = config_type if isinstance(config_type, str) else config_type.__name__
    try:
        return _REGISTRY[(name, method)]
    except KeyError:
        offered = ", ".join(methods(name))
        raise ConfigError(f"{name} has no method {method!r}; choose one of {offered}", "method") from None


def algorithm_for(config: Any) -> Algorithm:
    """The algorithm a config selects by its type and `method`."""
    return algorithm_named(type(config), config.method)
