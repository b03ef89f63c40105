"""What every weight-pass command shares (`coreopt quantize|palettize|sparsify` and any pass a
plugin registers): its options - the config's fields (`cli._config_options`) and the common ones
- and its run, a one-step recipe of the pass."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import typer

from .._common import (
    allow_empty_option,
    choices,
    force_option,
    json_option,
    print_json,
    quiet_option,
    trust_pickle_option,
    user_errors,
)
from .._config_options import config_from_options, config_parameters, keyword
from .._progress import spinner, weight_progress

_MODEL_HELP = "The .aimodel or .pt2 to compress (never modified); the output has its format."


def _executor_option() -> Any:
    from coreai_opt.compression import ExecutorKind

    return typer.Option(
        ExecutorKind.LOCAL.value,
        "--executor",
        help="Where the per-weight encoding runs: local (this process), or ray (Ray tasks on the cluster "
        "ray.init() finds: RAY_ADDRESS, else a new local one; pip install 'coreopt\\[ray]'). The output file "
        "is the same either way.",
    )


# the calibration spec's fields -> this command's flags (a late refusal names the flag)
_CALIBRATION_FLAGS = {"calibration": "--calibration", "source": "--calibration", "tokens": "--calibration-tokens",
                      "samples": "--calibration-samples"}  # fmt: skip
_SPOT = typer.Option(
    False,
    "--no-spot-check",
    help="Skip comparing a language model written with its input on a few windows of "
    "Python's documentation (KL, top-1; seconds), which says when a result is broken.",
)
_KV_CACHE_DTYPE = typer.Option(
    None,
    "--kv-cache-dtype",
    help="Also keep a stateful decoder's key/value cache (coreopt export --kv-cache) as these codes with "
    "float16 scales, as export --kv-cache-dtype makes it (.pt2 of float32 weights).",
)
# the command's names for CalibrationSpec's fields (its flags and help are the spec's)
_SPEC_NAMES = {"source": "calibration", "samples": "calibration_samples", "tokens": "calibration_tokens",
               "program": "calibration_program", "device": "device", "exact_gradients": "exact_gradients"}  # fmt: skip


def calibration_parameters() -> list[inspect.Parameter]:
    """Where the statistics of a method that learns from data come from: CalibrationSpec's fields."""
    from coreai_opt.calibration import CalibrationSpec

    return [p.replace(name=_SPEC_NAMES[p.name]) for p in config_parameters(CalibrationSpec)]


def common_parameters(output_help: str) -> list[inspect.Parameter]:
    """The options every compression command takes besides its config's."""
    from coreai_opt.compression import ExecutorKind
    from coreai_opt.models import KV_DTYPES

    return [
        *calibration_parameters(),
        keyword("output", typer.Option(None, "-o", "--output", help=output_help), Path | None),
        keyword("kv_cache_dtype", _KV_CACHE_DTYPE, choices("KVCacheDType", KV_DTYPES) | None),
        keyword("executor", _executor_option(), choices("ExecutorChoice", tuple(ExecutorKind))),
        keyword("allow_empty", allow_empty_option(), bool),
        keyword("no_spot_check", _SPOT, bool),
        keyword("force", force_option(), bool),
        keyword("trust_pickle", trust_pickle_option(), bool),
        keyword("quiet", quiet_option(), bool),
        keyword("as_json", json_option(), bool),
    ]


def show(result: Any, as_json: bool, quiet: bool) -> None:
    from ..render import compression_line, print_line, render_compression

    if as_json:
        print_json(result.to_dict())
    elif quiet:
        print_line(compression_line(result))
    else:
        render_compression(result)


def compress(config_type: type, what: str, values: dict[str, Any]) -> None:
    """Run one compression command: its config from the options, then the one-step recipe."""
    from coreai_opt.recipes import compress_file

    if config_type.KIND == "sparsify":
        _sparsify_checks(values)
    _learning_checks(config_type, values)
    fields = {p.name for p in config_parameters(config_type)}
    config = config_from_options(config_type, {k: v for k, v in values.items() if k in fields})
    as_json, quiet = values["as_json"], values["quiet"]
    if palettizes(config) and Path(values["model"]).exists():
        kmeans_kernels(not (as_json or quiet))
    with (
        user_errors(as_json, _CALIBRATION_FLAGS),
        weight_progress(not (as_json or quiet), what) as progress,
    ):
        result = compress_file(
            values["model"], values["output"], config, force=values["force"], progress=progress,
            trust_pickle=values["trust_pickle"], executor=values["executor"].value,
            allow_empty=values["allow_empty"], calibration=values["calibration"],
            calibration_samples=values["calibration_samples"], calibration_tokens=values["calibration_tokens"],
            calibration_program=values["calibration_program"], device=values["device"],
            exact_gradients=values["exact_gradients"], spot_check=not values["no_spot_check"],
            kv_cache_dtype=None if values["kv_cache_dtype"] is None else values["kv_cache_dtype"].value,
        )  # fmt: skip
    show(result, as_json, quiet)


def palettizes(config: Any) -> bool:
    return config.KIND == "palettize" or getattr(config, "palettize_nbits", None) is not None


def kmeans_kernels(enabled: bool) -> None:
    """Palettization's kernels made ready under a spinner that says why the first run waits."""
    from coreai_opt.compression import load_kmeans_kernels

    with spinner(enabled, "loading the k-means kernels (numba compiles them on first use, about 15 s)"):
        load_kmeans_kernels()


def _learning_checks(config_type: type, values: dict[str, Any]) -> None:
    """--device, --calibration-program and --exact-gradients serve methods that learn from data (the
    last: from gradients), with --calibration."""
    from coreai_opt.compression import algorithm_named
    from coreai_opt.weights import Needs

    method = values["method"].value if hasattr(values["method"], "value") else values["method"]
    for key, flag in (("device", "--device"), ("calibration_program", "--calibration-program"),
                      ("exact_gradients", "--exact-gradients")):  # fmt: skip
        if values.get(key) in (None, False):
            continue
        algorithm = algorithm_named(config_type, method)
        if algorithm.data_free:
            raise typer.BadParameter(f"{flag} serves a --method that learns from data", param_hint=flag)
        if key == "exact_gradients" and algorithm.needs is not Needs.GRADIENT_SQUARES:
            raise typer.BadParameter(
                f"{flag} serves a --method that learns from gradients (palettize --method sensitive); "
                f"--method {method} takes none",
                param_hint=flag,
            )
        if values["calibration"] is None:
            raise typer.BadParameter(f"{flag} comes with --calibration", param_hint=flag)


def command_of(config_type: type, what: str, doc: str, output_help: str, extra: tuple[inspect.Parameter, ...] = (),
               body: Any = None) -> Any:  # fmt: skip
    """A Typer command whose options are the config's fields plus the common ones (and `extra`)."""

    def command(**values: Any) -> None:
        (body or compress)(config_type, what, values)

    model = inspect.Parameter(
        "model",
        inspect.Parameter.KEYWORD_ONLY,
        default=typer.Argument(..., help=_MODEL_HELP),
        annotation=Path,
    )
    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [model, *config_parameters(config_type), *extra, *common_parameters(output_help)]
    )
    command.__doc__ = doc
    return command


def _sparsify_checks(values: dict[str, Any]) -> None:
    if values.get("n_m_ratio") is not None and values.get("target_sparsity") is not None:
        raise typer.BadParameter("give --sparsity or --nm, not both", param_hint="--nm")
    if values.get("quantize_dtype") is not None and values.get("palettize_nbits") is not None:
        raise typer.BadParameter("give --quantize or --palettize, not both", param_hint="--palettize")
