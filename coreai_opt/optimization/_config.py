"""`OptimizeConfig`: how `optimize` searches - every option of `coreopt optimize` besides the
program, its budget, its data and how the result is shown, declared once with its flag (the CLI's
options are these fields)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from coreai_opt.calibration import token_budget
from coreai_opt.compression import check_options, option, plain_fields
from coreai_opt.errors import ConfigError

_TOKENS = "Use at most this many tokens of a text calibration (default 16384; 'all': every one)."
_CANDIDATES = (
    "What a weight may take, comma separated: default (keep,int8,int4-b32,lut8,lut6,lut6-q8,lut4,lut4-q8,lut3,lut2), "
    "int4, uint4-b32, lut4-tensor, lut8-v2, lut6-v2, lut8-v4, lut4-v2 (vector tables), sparse50, sparse24, "
    "or NAME=KIND:key=value,... of your own."
)
_TRIALS = (
    "Language models: each weight's two smallest choices are also measured alone on the first calibration "
    "tokens - this many, in whole windows of the model's length, at most the calibration's - and the "
    "estimates corrected by them (0: estimates only)."
)
_ROTATE = (
    "Rotate the residual stream first (hadamard, random, learned - on --calibration; auto: learned "
    "where the program's residual stream can be rotated, else none, and none when its check refuses "
    "it): the search runs on the rotated program and the recipe starts with that transform."
)
CONFIG_VERSION = 1
ESTIMATE_SAMPLE = 1 << 22  # values: a large weight's cost estimated on a sample (`_costs`)
AUTO_TUNE_EPOCHS = 2  # tuning passes when none are given and the plan's tables learn from data


@dataclass(frozen=True, kw_only=True)
class OptimizeConfig:
    """The search's settings: the candidates a weight may take, how much calibration and
    evaluation data is read, the threshold below which weights stay, the measured trials, the
    confirmation rounds and uniform settings compared, where it runs, the output's format,
    whether the program is rotated first (`rotate`), whether the plan's tables are tuned end to
    end (`tune_epochs`) and whether it stops at the plan (`dry_run`). The defaults are the path
    that measured best below 4 bits (docs/benchmarks.md): a learned rotation where the program
    has a residual stream, and two tuning passes."""

    candidates: str = option("default", "--candidates", _CANDIDATES)
    to: str = option(
        "pt2", "--to", "pt2, or aimodel (converted after compressing).", choices=("pt2", "aimodel")
    )
    calibration_tokens: int | str | None = option(None, "--calibration-tokens", _TOKENS)
    calibration_samples: int | None = option(
        None, "--calibration-samples", "Use at most this many calibration samples.", minimum=1
    )
    eval_tokens: int | None = option(None, "--eval-tokens", "Score at most this many tokens.", minimum=2)
    eval_samples: int = option(8, "--eval-samples", "Samples drawn when --eval is 'random'.", minimum=1)
    threshold: int = option(1024, "--threshold", "Leave weights with this many elements or fewer.", minimum=0)
    trial_tokens: int = option(512, "--trial-tokens", _TRIALS, minimum=0)
    estimate_sample: int = option(
        ESTIMATE_SAMPLE, "--estimate-sample", "Estimate a weight of more values than this on evenly spread "
        "groups of its channels, about this many values (for tables of k > 16 entries: 16/k of this, both "
        "the size and the sample; 0: every weight whole); the plan is measured whole.",
        minimum=0,
    )  # fmt: skip
    rounds: int = option(3, "--rounds", "Confirmation rounds at most (accuracy bounds).", minimum=1)
    uniform: int = option(
        1, "--uniform", "Uniform settings nearest in size also made and evaluated, for comparison.", minimum=0
    )
    device: str | None = option(
        None,
        "--device",
        "Where calibration, the solves and the --eval scoring of .pt2 programs run (cpu, cuda).",
    )
    rotate: str | None = option(
        "auto", "--rotate", _ROTATE, choices=("auto", "learned", "hadamard", "random", "none")
    )  # None: none
    tune_epochs: int | None = option(
        None, "--tune-epochs", "Passes over the calibration data that tune the plan's look-up tables "
        f"(entries and scales) together end to end, in every round (0: none; default: {AUTO_TUNE_EPOCHS} "
        "where the plan's tables learn from data, else none).", minimum=0,
    )  # fmt: skip
    tune_blocks: int = option(
        0, "--tune-blocks", "Passes over the calibration data that tune the plan's look-up tables and "
        "codes a block of the program at a time, before --tune-epochs (0: none).", minimum=0,
    )  # fmt: skip
    dry_run: bool = option(
        False, "--dry-run", "Stop at the plan (size budgets): nothing written or evaluated."
    )

    def __post_init__(self) -> None:
        check_options(self)
        object.__setattr__(
            self, "calibration_tokens", token_budget(self.calibration_tokens, "calibration_tokens")
        )
        if not isinstance(self.candidates, str):
            raise ConfigError(
                f"candidates is text (choices, comma separated), not {self.candidates!r}", "candidates"
            )
        from ._choices import parse_choices

        picked = parse_choices(self.candidates)  # refused now, not after the model is read
        for name in ("tune_epochs", "tune_blocks"):
            if getattr(self, name):
                _check_tunable(picked, name)

    def to_dict(self) -> dict[str, Any]:
        return {"version": CONFIG_VERSION} | dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> OptimizeConfig:
        return cls(**plain_fields(cls, data, CONFIG_VERSION))


def _check_tunable(picked: Any, name: str) -> None:
    """`tune_epochs` or `tune_blocks` (`name`) given: every table choice must learn from data (its
    tables are tuned on it)."""
    from coreai_opt.compression import algorithm_for

    for choice in picked:
        config = choice.config_for(True, 0)
        if config is not None and config.KIND == "palettize" and algorithm_for(config).data_free:
            raise ConfigError(
                f"{name} tunes tables on calibration data: candidate {choice.name} does not learn "
                "from data (give its method: sensitive, importance or gptq)", name,
            )  # fmt: skip
