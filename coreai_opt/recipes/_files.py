"""The single-step file commands, as recipes of one step: what `coreopt quantize|palettize|
sparsify|cast|convert` and `quantize --activations` run (and the Python forms of them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coreai_opt.compression import PalettizeConfig, QuantizeConfig, SparsifyConfig, WeightConfig

from ._apply import apply_recipe, one_step
from ._recipe import Recipe
from ._results import ActivationsFileResult, CastFileResult, CompressionFileResult, ConversionResult
from ._steps import Cast, Compress, Convert, KVCache, QuantizeActivations


def compress_file(
    source: Path | str,
    output: Path | str | None,
    config: WeightConfig,
    *,
    calibration: str | Path | None = None,
    calibration_samples: int | None = None,
    calibration_tokens: int | str | None = None,
    calibration_program: str | Path | None = None,
    device: str | None = None,
    exact_gradients: bool = False,
    spot_check: bool = False,
    kv_cache_dtype: str | None = None,
    **options: Any,
) -> CompressionFileResult:
    """Compress a model's weights as `config` says into a new file of the input's format (an
    `.aimodel` through Core AI's decompression ops, a `.pt2` through coreai-torch's). Methods that
    learn from data run `calibration` through the `.pt2` itself, or for an `.aimodel` through
    `calibration_program` (the `.pt2` it was converted from: weights match by name), on `device`
    (a torch device; default the CPU; `exact_gradients`: see `calibration.calibrate`). `options`:
    force, progress, trust_pickle, executor, allow_empty (see `apply_recipe`). With `spot_check`
    (as `coreopt` runs it), a `.pt2` language model written is then compared with its source on a
    few windows of shipped text (`evaluation.spot_check`): the result's `spot_check`. With
    `kv_cache_dtype`, a stateful decoder's cache is quantized first (a `KVCache` step): `kv_cache`."""
    from coreai_opt.calibration import CalibrationSpec

    spec = None
    if calibration is not None:
        spec = CalibrationSpec(
            source=str(calibration), samples=calibration_samples, tokens=calibration_tokens,
            program=None if calibration_program is None else str(calibration_program), device=device,
            exact_gradients=exact_gradients,
        )  # fmt: skip
    if kv_cache_dtype is None:
        result: CompressionFileResult = one_step(Compress(config=config), source, output, spec, **options)  # type: ignore[assignment]
    else:
        steps = apply_recipe(Recipe((KVCache(dtype=kv_cache_dtype), Compress(config=config)), spec), source, output,
                             **options).steps  # fmt: skip
        result = steps[1][1]  # type: ignore[assignment]
        result.kv_cache = steps[0][1]  # type: ignore[assignment]
    if spot_check and result.output.suffix == ".pt2":
        from coreai_opt.evaluation import spot_check as check

        result.spot_check = check(
            result.source, result.output, trust_pickle=options.get("trust_pickle", False)
        )
    return result


def quantize_file(
    source: Path | str, output: Path | str | None = None, config: QuantizeConfig | None = None, **options: Any
) -> CompressionFileResult:
    """`coreopt quantize`: quantize a model's weights into a new file."""
    return compress_file(source, output, config or QuantizeConfig(), **options)


def palettize_file(
    source: Path | str,
    output: Path | str | None = None,
    config: PalettizeConfig | None = None,
    **options: Any,
) -> CompressionFileResult:
    """`coreopt palettize`: k-means palettize a model's weights into a new file."""
    return compress_file(source, output, config or PalettizeConfig(), **options)


def sparsify_file(
    source: Path | str, output: Path | str | None = None, config: SparsifyConfig | None = None, **options: Any
) -> CompressionFileResult:
    """`coreopt sparsify`: prune a model's weights (optionally quantizing or palettizing the kept ones)."""
    return compress_file(source, output, config or SparsifyConfig(), **options)


def cast_file(
    source: Path | str,
    target: Any = "16bit",
    output: Path | str | None = None,
    *,
    ignored_ops: tuple[str, ...] = (),
    check: bool = True,
    inputs: Path | str | None = None,
    seed: int = 0,
    keep_failed: bool = False,
    **options: Any,
) -> CastFileResult:
    """Cast a `.pt2` to 16 bits into a new file, checked against the original unless `check` is
    off; a program that fails its check is not written unless `keep_failed`. An ignored op that
    the program never calls raises `NothingDoneError` (a typo, most likely) and writes nothing,
    unless `allow_empty`."""
    step = Cast(
        to=getattr(target, "value", target), ignored_ops=tuple(ignored_ops), check=check,
        inputs=None if inputs is None else str(inputs), seed=seed, keep_failed=keep_failed,
    )  # fmt: skip
    return one_step(step, source, output, **options)  # type: ignore[return-value]


def convert_file(source: Path | str, output: Path | str | None = None, **options: Any) -> ConversionResult:
    """Convert a `.pt2` file to an `.aimodel` asset beside it (or at `output`)."""
    return one_step(Convert(), source, output, **options)  # type: ignore[return-value]


def quantize_activations_file(
    source: Path | str,
    output: Path | str | None = None,
    config: Any = None,
    *,
    calibration: Path | str,
    random_samples: int = 32,
    calibration_tokens: int | None = None,
    seed: int = 0,
    **options: Any,
) -> ActivationsFileResult:
    """Quantize a `.pt2`'s weights and activations, calibrated on `calibration` (a safetensors
    file or directory of samples, a text - at most `calibration_tokens` of it - or "random" for
    `random_samples` seeded draws). The loaded
    program is edited in place and saved: it is never exported again."""
    from coreai_opt.errors import ConfigError
    from coreai_opt.quantization import QuantizerConfig

    if random_samples < 1:
        raise ConfigError(f"random_samples must be 1 or more, not {random_samples}", "random_samples")
    step = QuantizeActivations(
        config=config if config is not None else QuantizerConfig(),
        calibration=str(calibration), calibration_samples=random_samples, calibration_tokens=calibration_tokens,
        seed=seed,
    )  # fmt: skip
    return one_step(step, source, output, **options)  # type: ignore[return-value]
