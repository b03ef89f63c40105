"""What `optimize` may pick for each weight: named choices, each a compression config (or none,
to keep the weight as stored), with the method it uses when calibration data is given.

    keep       the weight as the program stores it
    int8       int8 per channel, round to nearest
    int4-b32   int4 in blocks of 32 along the input axis (GPTQ with data)
    lut8 ... lut2   look-up tables per group of 16 channels (6-8 bits: Fisher-weighted k-means,
                    2-4 bits: GPTQ onto the weighted tables, with data; exact k-means without)
    lut4-tensor     one 4-bit table for the whole weight (GPTQ with data): 4 bits a weight, where
                    a table per 16 channels adds 0.02-0.06; optional (on SmolLM2 at 4.0 bits it
                    did not make a better plan: docs/benchmarks.md)
    lut4-q8, lut6-q8   lut4 / lut6 with each table's entries stored as int8 under one scale in
                    the weight's dtype: for float32 weights a 16-channel table of 576-wide rows
                    adds 0.017 bits a weight instead of 0.056 at 4 bits, 0.06 instead of 0.22 at
                    6 (for 16-bit weights about half the table bytes); on most of SmolLM2's weights
                    as good as float tables, on a few much worse: the solver tells them apart
                    (docs/benchmarks.md)
    lut8-v2, lut6-v2, lut8-v4, lut4-v2   one table of 2- or 4-long vectors along the output
                    channels for the whole weight, each channel under its own scale: 4, 3, 2 and
                    2 bits a weight (GPTQ onto the weighted vector tables with data: GPTVQ);
                    optional
    sparse50   half the values zeroed, the rest int8 (SparseGPT with data); optional

`parse_choices("default,sparse50")`; a custom choice is `NAME=KIND:key=value,...` (a config as
`coreopt sensitivity --config` takes it, its `method` used as given).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from coreai_opt.compression import PalettizeConfig, QuantizeConfig, SparsifyConfig, WeightConfig
from coreai_opt.errors import ConfigError

__all__ = ["DEFAULT_CHOICES", "KEEP", "Choice", "builtin_choices", "parse_choices"]


@dataclass(frozen=True)
class Choice:
    """One setting a weight may take: `config` None keeps it; `learned_method` replaces the
    config's method when calibration data is given (None: the config's own)."""

    name: str
    config: WeightConfig | None
    learned_method: str | None = None

    def __post_init__(self) -> None:
        if not self.name or any(c in self.name for c in ",= "):
            raise ConfigError(
                f"a choice needs a name without commas, '=' or spaces, not {self.name!r}", "candidates"
            )

    def config_for(self, learns: bool, threshold: int) -> WeightConfig | None:
        """The config this choice compresses with (the learned method with data)."""
        if self.config is None:
            return None
        changes: dict[str, Any] = {"weight_num_threshold": threshold}
        if learns and self.learned_method is not None:
            changes["method"] = self.learned_method
        return dataclasses.replace(self.config, **changes)


KEEP = Choice("keep", None)


def builtin_choices() -> dict[str, Choice]:
    """Every named choice (the defaults and the optional ones)."""
    found = [
        KEEP,
        Choice("int8", QuantizeConfig(dtype="int8", granularity="channel")),
        Choice("int4", QuantizeConfig(dtype="int4", granularity="channel"), "gptq"),
        Choice("int4-b32", QuantizeConfig(dtype="int4", granularity="block", block_size=32), "gptq"),
        Choice("uint4-b32", QuantizeConfig(dtype="uint4", granularity="block", block_size=32), "gptq"),
        *(_grouped_lut(f"lut{n}", n) for n in (8, 6, 4, 3, 2)),
        Choice("lut4-tensor", PalettizeConfig(n_bits=4, granularity="tensor", num_kmeans_workers=0), "gptq"),
        *(_vector_lut(f"lut{n}-v{d}", n, d) for n, d in ((8, 2), (6, 2), (8, 4), (4, 2))),
        *(_grouped_lut(f"lut{n}-q8", n, lut_dtype="int8") for n in (6, 4)),
        Choice("sparse50", SparsifyConfig(target_sparsity=0.5, quantize_dtype="int8"), "sparsegpt"),
        Choice("sparse24", SparsifyConfig(n_m_ratio=(2, 4), quantize_dtype="int8"), "sparsegpt"),
    ]
    return {c.name: c for c in found}


def _grouped_lut(name: str, n_bits: int, **table: Any) -> Choice:
    """A table per 16 channels: Fisher-weighted k-means at 6-8 bits, GPTQ onto the tables below."""
    config = PalettizeConfig(
        n_bits=n_bits, granularity="grouped", group_size=16, num_kmeans_workers=0, **table
    )
    return Choice(name, config, "sensitive" if n_bits > 4 else "gptq")


def _vector_lut(name: str, n_bits: int, dim: int) -> Choice:
    """One table of `dim`-long vectors for the whole weight, its channels under their own scales
    (n_bits / dim bits a weight): GPTQ onto the weighted vector tables (GPTVQ)."""
    config = PalettizeConfig(
        n_bits=n_bits, cluster_dim=dim, enable_per_channel_scale=True, num_kmeans_workers=0
    )
    return Choice(name, config, "gptq")


DEFAULT_CHOICES = ("keep", "int8", "int4-b32", "lut8", "lut6", "lut6-q8", "lut4", "lut4-q8", "lut3", "lut2")


def parse_choices(text: str | None) -> tuple[Choice, ...]:
    """`default`, names of built-in choices and `NAME=KIND:key=value,...` customs, comma
    separated; `keep` is always among them."""
    known = builtin_choices()
    picked: dict[str, Choice] = {}
    for part in _parts(text or "default"):
        if part == "default":
            picked.update((n, known[n]) for n in DEFAULT_CHOICES)
        elif "=" in part.split(":", 1)[0]:
            name, _, spec = part.partition("=")
            try:
                from coreai_opt.recipes import config_from_text

                picked[name.strip()] = Choice(name.strip(), config_from_text(spec.strip()))
            except ValueError as exc:
                raise ConfigError(f"candidate {name.strip()!r}: {exc}", "candidates") from None
        elif part in known:
            picked[part] = known[part]
        else:
            raise ConfigError(
                f"unknown candidate {part!r}; built in: {', '.join(known)} (or NAME=KIND:key=value,...)",
                "candidates",
            )
    picked.setdefault("keep", KEEP)
    if len(picked) < 2:
        raise ConfigError("give at least one candidate besides keep", "candidates")
    return tuple(picked.values())


def _parts(text: str) -> list[str]:
    """Choices split on ',' or ';': a custom `NAME=KIND:key=value` takes the `key=value` items
    after it (those without ':') as its own options."""
    parts: list[str] = []
    custom = False
    for token in (t.strip() for t in text.replace(";", ",").split(",")):
        if not token:
            continue
        head = token.split(":", 1)[0]
        if ":" in token and "=" in head:
            parts.append(token)
            custom = True
        elif custom and "=" in token and ":" not in token:
            parts[-1] += "," + token
        else:
            parts.append(token)
            custom = False
    return parts
