"""`coreopt`: inspect, convert, cast (and, as they land, compress) models for Core AI."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from coreai_opt import __version__

from ._common import (
    allow_empty_option,
    choices,
    err_console,
    force_option,
    json_option,
    option_errors,
    plain,
    print_json,
    quiet_option,
    run,
    shown,
    trust_pickle_option,
    user_errors,
    version_option,
)

if TYPE_CHECKING:
    from coreai_opt.coreai_utils import CompressionFileResult, Progress

app = typer.Typer(
    name="coreopt",
    help="Shrink PyTorch models for Apple's Core AI stack.\n\nExample: coreopt inspect sample_models/mlp.aimodel",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(version: bool = version_option("coreopt", __version__)) -> None:
    """Shrink PyTorch models for Apple's Core AI stack."""


@app.command()
def inspect(
    model: Path = typer.Argument(..., help="A .pt2 (torch.export) or .aimodel (Core AI) file."),
    trust_pickle: bool = trust_pickle_option(),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Show inputs, outputs, an op histogram and how every weight is stored.

    Example: coreopt inspect sample_models/transformer.aimodel --json
    """
    from coreai_opt.inspection import inspect_model

    from ._render import model_line, print_line, render_model_report

    with user_errors(as_json):
        report = inspect_model(model, trust_pickle=trust_pickle)
    if as_json:
        print_json(report.to_dict())
    elif quiet:
        print_line(model_line(report))
    else:
        render_model_report(report)


@app.command()
def convert(
    model: Path = typer.Argument(
        ..., help="The .pt2 file to convert (exported with coreai-torch's decompositions)."
    ),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Output .aimodel (default: beside the input)."
    ),
    force: bool = force_option(),
    trust_pickle: bool = trust_pickle_option(),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Convert a torch.export program to a Core AI asset through coreai-torch.

    Example: coreopt convert sample_models/mlp.pt2 -o build/mlp.aimodel
    """
    from coreai_opt.conversion import convert_file
    from coreai_opt.inspection import inspect_model

    from ._render import conversion_line, print_line, render_conversion

    with user_errors(as_json):
        with (
            err_console.status(f"converting {shown(model)} ...", spinner="dots")
            if not (as_json or quiet)
            else contextlib.nullcontext()
        ):
            result = convert_file(model, output, force=force, trust_pickle=trust_pickle)
        report = inspect_model(result.output)
    if as_json:
        print_json(
            {
                "source": str(result.source),
                "output": str(result.output),
                "seconds": round(result.seconds, 4),
                "converter_log": result.converter_log,
                "model": report.to_dict(),
            }
        )
    elif quiet:
        print_line(conversion_line(result, report))
    else:
        render_conversion(result, report)


from coreai_opt.casting import CastTarget  # noqa: E402  (an enum in a module of its own: no torch)


@app.command()
def cast(
    model: Path = typer.Argument(..., help="The .pt2 file to cast (it is never modified)."),
    to: CastTarget = typer.Option(
        CastTarget.BOTH.value, "--to", help="fp16 (FP32->FP16), int16 (INT32/64->INT16) or 16bit (both)."
    ),
    output: Path | None = typer.Option(
        None,
        "-o",
        "--output",
        help="Output .pt2 (default: model.fp16.pt2 / .int16.pt2 / .16bit.pt2 beside the input).",
    ),
    ignore_op: list[str] = typer.Option(
        [],
        "--ignore-op",
        help="Run this op in fp32 (e.g. aten.exp.default, or aten.exp for every overload). Repeatable.",
    ),
    check: bool = typer.Option(
        True, "--check/--no-check", help="Run original and cast program and compare outputs."
    ),
    inputs: Path | None = typer.Option(
        None,
        "--inputs",
        help="safetensors file with one tensor per user input (by input name) for the check.",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the random check inputs."),
    keep_failed: bool = typer.Option(
        False, "--keep-failed", help="Write the output even when it fails its check (exit code 1 still)."
    ),
    allow_empty: bool = allow_empty_option(),
    force: bool = force_option(),
    trust_pickle: bool = trust_pickle_option(),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Cast a torch.export program to 16 bits and report every dtype it changed.

    Example: coreopt cast sample_models/transformer.pt2 --to 16bit -o build/transformer.16bit.pt2

    Example: coreopt cast model.pt2 --to fp16 --ignore-op aten.exp.default --json
    """
    from coreai_opt.casting import cast_file

    from ._render import cast_line, print_line, render_cast

    with (
        user_errors(as_json, {"ignored_ops": "--ignore-op"}),
        err_console.status(f"casting {shown(model)} ...", spinner="dots")
        if not (as_json or quiet)
        else contextlib.nullcontext(),
    ):
        result = cast_file(
            model,
            to.value,
            output,
            ignored_ops=tuple(ignore_op),
            check=check,
            inputs=inputs,
            seed=seed,
            force=force,
            trust_pickle=trust_pickle,
            allow_empty=allow_empty,
            keep_failed=keep_failed,
        )
    if as_json:
        print_json(result.to_dict())
    elif quiet:
        print_line(cast_line(result))
    else:
        render_cast(result)
    if result.check is not None and not result.check.ok:
        kept = (
            f"written to {result.output} as asked"
            if result.written
            else "not written (--keep-failed writes it)"
        )
        sys.stderr.write(
            plain(f"error: {model}: the cast program fails its check against the original; {kept}\n")
        )
        raise typer.Exit(1)


def _default(config: type, name: str) -> Any:
    """A config field's default: the CLI's defaults are the library's."""
    return config.__dataclass_fields__[name].default


def _threshold_option() -> Any:
    from coreai_opt.compression import QuantizeConfig

    return typer.Option(
        _default(QuantizeConfig, "weight_num_threshold"),
        "--threshold",
        help="Skip weights with this many elements or fewer.",
    )


def _override_option() -> Any:
    return typer.Option(
        [],
        "--override",
        help="Per-weight change, by a glob over the weight's name (first match wins): 'PATTERN:skip', or "
        "'PATTERN:OPTION=VALUE[,OPTION=VALUE]' with the pass's option names (dtype=int8, n_bits=8, "
        "granularity=channel, ...). Repeatable. Example: --override 'embed*:skip'",
    )


def _overrides(texts: list[str], config: type) -> tuple[Any, ...]:
    from coreai_opt.compression import parse_override

    with option_errors({}, "--override"):
        return tuple(parse_override(text, config) for text in texts)


# The library's parameter names -> this CLI's flags, so errors name what the user typed.
_COMMON_FLAGS = {"weight_num_threshold": "--threshold", "overrides": "--override"}
_QUANTIZE_FLAGS = _COMMON_FLAGS | {
    "dtype": "--dtype", "qscheme": "--scheme", "granularity": "--granularity", "block_size": "--block-size",
    "scale_dtype": "--scale-dtype",
}  # fmt: skip
_PALETTIZE_FLAGS = _COMMON_FLAGS | {
    "n_bits": "--nbits", "lut_dtype": "--lut-dtype", "granularity": "--granularity", "group_size": "--group-size",
    "cluster_dim": "--cluster-dim", "enable_per_channel_scale": "--per-channel-scale",
    "num_kmeans_workers": "--workers", "enable_fast_kmeans_mode": "--fast",
    "rounding_precision": "--rounding-precision",
}  # fmt: skip
_SPARSIFY_FLAGS = _COMMON_FLAGS | {
    "target_sparsity": "--sparsity", "block_size": "--block-size", "n_m_ratio": "--nm",
    "quantize_dtype": "--quantize", "palettize_nbits": "--palettize",
}  # fmt: skip


def _show_compression(result: CompressionFileResult, as_json: bool, quiet: bool) -> None:
    from ._render import compression_line, print_line, render_compression

    if as_json:
        print_json(result.to_dict())
    elif quiet:
        print_line(compression_line(result))
    else:
        render_compression(result)


@contextlib.contextmanager
def _weight_progress(enabled: bool, what: str) -> Iterator[Progress | None]:
    """A progress bar over weights with an ETA, on a terminal's stderr only (none with --json, so
    stdout stays one document, and none in logs). It appears with the first weight done, so a
    command that fails before any work prints nothing but its error line."""
    if not enabled or not err_console.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
    from rich.progress import Progress as Bar

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with contextlib.ExitStack() as stack:
        state: dict[str, Any] = {}

        def advance(done: int, total: int, name: str) -> None:
            if "bar" not in state:
                state["bar"] = stack.enter_context(Bar(*columns, console=err_console, transient=True))
                state["task"] = state["bar"].add_task(what, total=total)
            state["bar"].update(
                state["task"], completed=done, total=total, description=f"{what} {shown(name)}"
            )

        yield advance


from coreai_opt.compression import (  # noqa: E402  (enums and choice lists: no torch behind them)
    JOINT_DTYPES,
    LUT_DTYPES,
    PALETTIZE_GRANULARITIES,
    QUANTIZE_GRANULARITIES,
    WEIGHT_DTYPES,
    DType,
    ExecutorKind,
    PalettizeConfig,
    QScheme,
    QuantizeConfig,
    SparsifyConfig,
)
from coreai_opt.quantization import ACTIVATION_DTYPES, ActivationConfig, Observer, OpConfig  # noqa: E402

WeightDType = choices("WeightDType", WEIGHT_DTYPES)
ActivationDType = choices("ActivationDType", ACTIVATION_DTYPES)
ObserverChoice = choices("ObserverChoice", tuple(Observer))
Scheme = choices("Scheme", tuple(QScheme))
QuantizeGranularity = choices("QuantizeGranularity", QUANTIZE_GRANULARITIES)
ScaleDType = choices("ScaleDType", (DType.FP8_E8M0FNU,))
ExecutorChoice = choices("ExecutorChoice", tuple(ExecutorKind))
PaletteGranularity = choices("PaletteGranularity", PALETTIZE_GRANULARITIES)
LutDType = choices("LutDType", LUT_DTYPES)
JointDType = choices("JointDType", JOINT_DTYPES)


def _executor_option() -> Any:
    return typer.Option(
        ExecutorKind.LOCAL.value,
        "--executor",
        help="Where the per-weight encoding runs: local (this process), or ray (Ray tasks on the cluster "
        "ray.init() finds: RAY_ADDRESS, else a new local one; pip install 'coreopt[ray]'). The output file "
        "is the same either way.",
    )


def _compress(
    model: Path,
    output: Path | None,
    config: Any,
    force: bool,
    as_json: bool,
    what: str,
    trust_pickle: bool,
    executor: Any,
    allow_empty: bool,
    quiet: bool,
) -> None:
    from coreai_opt.coreai_utils import compress_file

    with user_errors(as_json), _weight_progress(not (as_json or quiet), what) as progress:
        result = compress_file(
            model, output, config, force=force, progress=progress, trust_pickle=trust_pickle,
            executor=executor.value, allow_empty=allow_empty,
        )  # fmt: skip
    _show_compression(result, as_json, quiet)


@app.command()
def quantize(
    model: Path = typer.Argument(
        ..., help="The .aimodel or .pt2 to compress (never modified); the output has its format."
    ),
    dtype: WeightDType = typer.Option(  # type: ignore[valid-type]
        _default(QuantizeConfig, "dtype").value, "--dtype", help="Element type of the stored weights."
    ),
    scheme: Scheme = typer.Option(  # type: ignore[valid-type]
        _default(QuantizeConfig, "qscheme").value,
        "--scheme",
        help="sym, or asym (integers: with a zero point).",
    ),
    granularity: QuantizeGranularity | None = typer.Option(  # type: ignore[valid-type]
        None, "--granularity", help="Scale per tensor, channel or block (default: channel; block for mxfp4)."
    ),
    block_size: int = typer.Option(
        _default(QuantizeConfig, "block_size"), "--block-size", help="Block length along the input axis."
    ),
    scale_dtype: ScaleDType | None = typer.Option(  # type: ignore[valid-type]
        None, "--scale-dtype", help="e8m0: power-of-two scales (fp8 / mxfp4 data only)."
    ),
    threshold: int | None = typer.Option(
        None,
        "--threshold",
        help="Skip weights with this many elements or fewer (default: "
        f"{_default(QuantizeConfig, 'weight_num_threshold')}; with --activations "
        f"{OpConfig().weights.weight_num_threshold}: every weight of a quantized op).",
    ),
    override: list[str] = _override_option(),
    activations: ActivationDType | None = typer.Option(  # type: ignore[valid-type]
        None,
        "--activations",
        help="Also quantize the activations feeding linear/conv/matmul ops (W8A8; .pt2 only; needs "
        "--calibration).",
    ),
    activation_scheme: Scheme = typer.Option(  # type: ignore[valid-type]
        _default(ActivationConfig, "qscheme").value, "--activation-scheme", help="Activations: sym or asym."
    ),
    observer: ObserverChoice = typer.Option(  # type: ignore[valid-type]
        _default(ActivationConfig, "observer").value,
        "--observer",
        help="How activation ranges are found: min-max, moving average, percentile, or least MSE.",
    ),
    calibration: str | None = typer.Option(
        None,
        "--calibration",
        help="Calibration samples for --activations: a safetensors file (one tensor per input, "
        "optionally [N, *shape]) or a directory of them; 'random' draws seeded inputs instead.",
    ),
    calibration_samples: int = typer.Option(
        32, "--calibration-samples", min=1, help="How many seeded samples --calibration random draws."
    ),
    output: Path | None = typer.Option(
        None,
        "-o",
        "--output",
        help="Output file (default: model.<dtype>.<suffix>, or model.w8a8.pt2 with --activations, beside the "
        "input).",
    ),
    executor: ExecutorChoice = _executor_option(),  # type: ignore[valid-type]
    allow_empty: bool = allow_empty_option(),
    force: bool = force_option(),
    trust_pickle: bool = trust_pickle_option(),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Quantize the weights of a Core AI asset or a torch.export program and report every weight;
    with --activations also the activations (calibrated on real samples) of a .pt2.

    Example: coreopt quantize sample_models/transformer.aimodel --dtype int8 -o build/t.int8.aimodel

    Example: coreopt quantize sample_models/transformer.pt2 --dtype int8 -o build/t.int8.pt2

    Example: coreopt quantize model.aimodel --dtype int4 --granularity block --block-size 32 --json

    Example: coreopt quantize model.aimodel --dtype fp8e4m3 --scale-dtype e8m0 --override 'embed*:skip'

    Example: coreopt quantize model.pt2 --activations int8 --calibration samples.safetensors --observer mse

    Example: coreopt quantize sample_models/cnn.pt2 --activations int8 --calibration random -o build/cnn.w8a8.pt2
    """
    if threshold is None:
        defaults = OpConfig().weights if activations is not None else QuantizeConfig()
        threshold = defaults.weight_num_threshold  # type: ignore[union-attr]
    with option_errors(_QUANTIZE_FLAGS):
        config = QuantizeConfig(
            dtype.value, scheme.value, granularity.value if granularity is not None else None, block_size,
            scale_dtype.value if scale_dtype is not None else None, threshold, _overrides(override, QuantizeConfig),
        )  # fmt: skip
    if activations is None:
        if calibration is not None:
            raise typer.BadParameter("--calibration calibrates --activations", param_hint="--calibration")
        _compress(
            model, output, config, force, as_json, "quantizing", trust_pickle, executor, allow_empty, quiet
        )
        return
    if calibration is None:
        raise typer.BadParameter(
            "activation ranges need real data: give samples (a safetensors file or directory), or say "
            "'--calibration random' to calibrate on seeded random inputs",
            param_hint="--calibration",
        )
    if override:
        raise typer.BadParameter("--override applies to weight-only quantization", param_hint="--override")
    if executor.value != ExecutorKind.LOCAL.value:
        raise typer.BadParameter("--executor applies to weight-only quantization", param_hint="--executor")
    from coreai_opt.quantization import QuantizerConfig, quantize_activations_file

    from ._render import activations_line, print_line, render_activation_quantization

    with option_errors(_QUANTIZE_FLAGS):
        acts = ActivationConfig(activations.value, activation_scheme.value, observer.value)
        qconfig = QuantizerConfig(OpConfig(config, acts))
    with user_errors(as_json), _weight_progress(not (as_json or quiet), "calibrating") as progress:
        result = quantize_activations_file(
            model, output, qconfig, calibration=calibration, random_samples=calibration_samples,
            force=force, progress=progress, trust_pickle=trust_pickle,
        )  # fmt: skip
    if as_json:
        print_json(result.to_dict())
    elif quiet:
        print_line(activations_line(result))
    else:
        render_activation_quantization(result)


@app.command()
def palettize(
    model: Path = typer.Argument(
        ..., help="The .aimodel or .pt2 to compress (never modified); the output has its format."
    ),
    nbits: int = typer.Option(
        _default(PalettizeConfig, "n_bits"),
        "--nbits",
        help="Index width: 1, 2, 3, 4, 6 or 8 (a LUT of 2^nbits entries).",
    ),
    granularity: PaletteGranularity = typer.Option(  # type: ignore[valid-type]
        _default(PalettizeConfig, "granularity").value,
        "--granularity",
        help="One LUT per tensor, per channel or per group of channels.",
    ),
    group_size: int = typer.Option(
        _default(PalettizeConfig, "group_size"),
        "--group-size",
        help="Channels per LUT with --granularity grouped.",
    ),
    lut_dtype: LutDType | None = typer.Option(  # type: ignore[valid-type]
        None, "--lut-dtype", help="Quantize LUT entries (one scale per LUT)."
    ),
    per_channel_scale: bool = typer.Option(
        False, "--per-channel-scale", help="Normalize each channel by its max |w| before clustering."
    ),
    cluster_dim: int = typer.Option(
        _default(PalettizeConfig, "cluster_dim"),
        "--cluster-dim",
        help="Vector length along the output channels (>1: vectors).",
    ),
    threshold: int = _threshold_option(),
    override: list[str] = _override_option(),
    workers: int = typer.Option(0, "--workers", help="k-means threads (0: one per CPU)."),
    fast: bool = typer.Option(False, "--fast", help="Round values to --rounding-precision decimals first."),
    rounding_precision: int = typer.Option(
        _default(PalettizeConfig, "rounding_precision"),
        "--rounding-precision",
        help="Decimals kept by --fast.",
    ),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Output file (default: model.lut<nbits>.<suffix> beside the input)."
    ),
    executor: ExecutorChoice = _executor_option(),  # type: ignore[valid-type]
    allow_empty: bool = allow_empty_option(),
    force: bool = force_option(),
    trust_pickle: bool = trust_pickle_option(),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Palettize weights with exact optimal k-means look-up tables and report every weight.

    Example: coreopt palettize sample_models/transformer.aimodel --nbits 4 -o build/t.lut4.aimodel

    Example: coreopt palettize model.pt2 --nbits 4 -o model.lut4.pt2   (coreai-torch ops; convert later)

    Example: coreopt palettize model.aimodel --nbits 4 --granularity grouped --group-size 16 --lut-dtype int8

    Example: coreopt palettize model.aimodel --nbits 2 --cluster-dim 2 --override 'head*:n_bits=8' --json

    Example: RAY_ADDRESS=auto coreopt palettize big.aimodel --nbits 4 --executor ray   (on a Ray cluster)
    """
    import os

    with option_errors(_PALETTIZE_FLAGS):
        config = PalettizeConfig(
            nbits, lut_dtype.value if lut_dtype is not None else None, granularity.value, group_size, cluster_dim,
            per_channel_scale, workers or os.cpu_count() or 1, fast, rounding_precision, threshold,
            _overrides(override, PalettizeConfig),
        )  # fmt: skip
    _compress(
        model, output, config, force, as_json, "palettizing", trust_pickle, executor, allow_empty, quiet
    )


def _n_m_ratio(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    parts = text.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise typer.BadParameter(f"expected N:M such as 2:4, not {text!r}", param_hint="--nm")
    return int(parts[0]), int(parts[1])


@app.command()
def sparsify(
    model: Path = typer.Argument(
        ..., help="The .aimodel or .pt2 to compress (never modified); the output has its format."
    ),
    sparsity: float | None = typer.Option(
        None, "--sparsity", help="Fraction of weights zeroed, smallest |w| first (default 0.5)."
    ),
    nm: str | None = typer.Option(
        None, "--nm", help="N:M structured sparsity: keep the N largest of every M along the input axis."
    ),
    block_size: int | None = typer.Option(
        None, "--block-size", help="Prune blocks of this many output channels, ranked by L2 norm."
    ),
    quantize: JointDType | None = typer.Option(None, "--quantize", help="Quantize the kept values too."),  # type: ignore[valid-type]
    palettize: int | None = typer.Option(
        None, "--palettize", help="Palettize the kept values with a 2^N-entry k-means LUT."
    ),
    threshold: int = _threshold_option(),
    override: list[str] = _override_option(),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Output file (default: model.sparse<..>.<suffix> beside the input)."
    ),
    executor: ExecutorChoice = _executor_option(),  # type: ignore[valid-type]
    allow_empty: bool = allow_empty_option(),
    force: bool = force_option(),
    trust_pickle: bool = trust_pickle_option(),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Prune weights to a bitmask-sparse form (optionally quantized or palettized) and report every weight.

    Example: coreopt sparsify sample_models/transformer.aimodel --sparsity 0.5 -o build/t.sparse.aimodel

    Example: coreopt sparsify model.pt2 --nm 2:4 --quantize int8 -o model.2of4.pt2

    Example: coreopt sparsify model.aimodel --nm 2:4 --quantize int8

    Example: coreopt sparsify model.aimodel --sparsity 0.75 --block-size 4 --palettize 4 --json
    """
    ratio = _n_m_ratio(nm)
    if ratio is not None and sparsity is not None:
        raise typer.BadParameter("give --sparsity or --nm, not both", param_hint="--nm")
    if quantize is not None and palettize is not None:
        raise typer.BadParameter("give --quantize or --palettize, not both", param_hint="--palettize")
    with option_errors(_SPARSIFY_FLAGS):
        config = SparsifyConfig(
            sparsity, block_size, ratio, quantize.value if quantize is not None else None, palettize, threshold,
            _overrides(override, SparsifyConfig),
        )  # fmt: skip
    _compress(
        model, output, config, force, as_json, "sparsifying", trust_pickle, executor, allow_empty, quiet
    )


@app.command()
def compare(
    reference: Path = typer.Argument(
        ..., help="The reference .aimodel or .pt2 (e.g. before compression; a .pt2 runs in PyTorch)."
    ),
    candidates: list[Path] = typer.Argument(
        ..., help="One or more .aimodel or .pt2 files to check against it (several: one row each)."
    ),
    inputs: Path | None = typer.Option(
        None,
        "--inputs",
        help="Real samples: a safetensors file with one tensor per model input, by input name (optionally "
        "with a leading sample axis, [N, *shape]), or a directory of such files.",
    ),
    samples: int = typer.Option(
        1, "--samples", min=1, help="Number of seeded random samples when no --inputs are given."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the random inputs."),
    int_range: str | None = typer.Option(
        None,
        "--int-range",
        help="Draw every integer input from [LOW, HIGH), e.g. 0:100 (default: ids from the table they "
        "index, masks and flags from {0, 1}).",
    ),
    min_cosine: float | None = typer.Option(
        None, "--min-cosine", help="Exit 1 when any output's cosine falls below this (for CI)."
    ),
    as_csv: bool = typer.Option(False, "--csv", help="Print one CSV row per candidate instead of tables."),
    plot: Path | None = typer.Option(
        None, "--plot", help="Also write a size-vs-accuracy plot as PNG here (pip install 'coreopt[plot]')."
    ),
    trust_pickle: bool = trust_pickle_option(),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Run models on the same samples; per output cosine, SNR and max abs error.

    An .aimodel runs on the Core AI runtime, a .pt2 in PyTorch (compressed weights decoded once).
    Over several samples each metric is its worst sample's, with the mean cosine and SNR beside it.
    With several candidates the reference runs once and each candidate gets one row: size on disk,
    bits per weight, cosine mean/min and SNR (a size/accuracy sweep).

    Example: coreopt compare sample_models/transformer.aimodel build/t.int8.aimodel --min-cosine 0.999

    Example: coreopt compare sample_models/transformer.pt2 build/t4.pt2 --min-cosine 0.99

    Example: coreopt compare ref.aimodel cand.aimodel --inputs batch.safetensors --json

    Example: coreopt compare model.pt2 model.int4.pt2 --samples 16

    Example: coreopt compare ref.aimodel a.aimodel b.aimodel c.aimodel --inputs samples/ --csv --plot sweep.png
    """
    from coreai_opt.comparison import (
        check_plot_path,
        compare_files,
        compare_sweep,
        parse_int_range,
        plot_sweep,
    )

    from ._render import comparison_line, print_line, render_comparison, render_sweep, sweep_line

    if inputs is not None and samples != 1:
        raise typer.BadParameter("give --inputs or --samples, not both", param_hint="--samples")
    if as_csv and as_json:
        raise typer.BadParameter("give --csv or --json, not both", param_hint="--csv")
    with option_errors({}, "--int-range"):
        parsed_range = parse_int_range(int_range) if int_range is not None else None
    if plot is not None:
        with option_errors({}, "--plot"):
            check_plot_path(plot)
    flags = {"min_cosine": "--min-cosine", "samples": "--samples"}
    with (
        user_errors(as_json, flags),
        _weight_progress(not (as_json or as_csv or quiet), "comparing") as progress,
    ):
        options = {
            "inputs": inputs, "samples": samples, "seed": seed, "int_range": parsed_range,
            "min_cosine": min_cosine, "trust_pickle": trust_pickle, "progress": progress,
        }  # fmt: skip
        # a sweep's rows inspect every model for its size: only when rows are asked for
        sweep = len(candidates) > 1 or as_csv or plot is not None
        result = (
            compare_sweep(reference, candidates, **options)
            if sweep
            else compare_files(reference, candidates[0], **options)
        )
        if plot is not None:
            plot_sweep(result, plot)
    # one candidate is shown as its comparison, every output of it
    one = None if len(candidates) > 1 else (result.comparisons[0] if sweep else result)
    if as_csv:
        sys.stdout.write(result.to_csv())
    elif as_json:
        print_json((one or result).to_dict())
    elif quiet:
        print_line(comparison_line(one) if one is not None else sweep_line(result))
    elif one is not None:
        render_comparison(one)
    else:
        render_sweep(result)
    if result.ok is False:
        raise typer.Exit(1)


def main() -> None:
    run(app)


if __name__ == "__main__":
    main()
