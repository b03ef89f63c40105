"""`coreopt quantize`: weight quantization (a one-step recipe), or with `--activations` W8A8 of a
`.pt2` calibrated on samples."""

from __future__ import annotations

import inspect
from typing import Any

import typer

from .._common import choices, option_errors, print_json, user_errors
from .._config_options import keyword
from .._progress import weight_progress
from ._weights import command_of, compress


def _activation_parameters() -> tuple[inspect.Parameter, ...]:
    from coreai_opt.compression import QScheme
    from coreai_opt.quantization import ACTIVATION_DTYPES, ActivationConfig, Observer

    defaults = ActivationConfig()
    return (
        keyword(
            "activations",
            typer.Option(
                None,
                "--activations",
                help=(
                    "Also quantize the activations feeding linear/conv/matmul ops (W8A8; .pt2 only; needs "
                    "--calibration)."
                ),
            ),
            choices("ActivationDType", ACTIVATION_DTYPES) | None,
        ),
        keyword(
            "activation_scheme",
            typer.Option(defaults.qscheme.value, "--activation-scheme", help="Activations: sym or asym."),
            choices("ActivationScheme", tuple(QScheme)),
        ),
        keyword(
            "observer",
            typer.Option(
                defaults.observer.value,
                "--observer",
                help=("How activation ranges are found: min-max, moving average, percentile, or least MSE."),
            ),
            choices("ObserverChoice", tuple(Observer)),
        ),
    )


def _quantize(config_type: type, what: str, values: dict[str, Any]) -> None:
    from coreai_opt.compression import ExecutorKind, QuantizeConfig
    from coreai_opt.quantization import OpConfig

    activations = values["activations"]
    if values["weight_num_threshold"] is None:  # every weight of a quantized op, with --activations
        defaults = OpConfig().weights if activations is not None else QuantizeConfig()
        values["weight_num_threshold"] = defaults.weight_num_threshold  # type: ignore[union-attr]
    if activations is None:
        from coreai_opt.compression import algorithm_named

        if (
            values["calibration"] is not None
            and algorithm_named(config_type, values["method"].value).data_free
        ):
            raise typer.BadParameter(
                "--calibration calibrates --activations (or a --method that learns from data)",
                param_hint="--calibration",
            )
        compress(config_type, what, values)
        return
    if values["calibration"] is None:
        raise typer.BadParameter(
            "activation ranges need real data: give samples (a safetensors file or directory), or say "
            "'--calibration random' to calibrate on seeded random inputs",
            param_hint="--calibration",
        )
    if values["overrides"]:
        raise typer.BadParameter("--override applies to weight-only quantization", param_hint="--override")
    for key, flag in (("device", "--device"), ("calibration_program", "--calibration-program"),
                      ("exact_gradients", "--exact-gradients"), ("kv_cache_dtype", "--kv-cache-dtype")):  # fmt: skip
        if values.get(key) not in (None, False):
            raise typer.BadParameter(f"{flag} applies to weight-only quantization", param_hint=flag)
    if values["executor"].value != ExecutorKind.LOCAL.value:
        raise typer.BadParameter("--executor applies to weight-only quantization", param_hint="--executor")
    if values["calibration_samples"] is not None and str(values["calibration"]) != "random":
        raise typer.BadParameter(
            "with --activations, --calibration-samples counts the draws of '--calibration random'; every sample "
            "of a file is used (--calibration-tokens bounds a text)",
            param_hint="--calibration-samples",
        )
    _w8a8(values)


def _w8a8(values: dict[str, Any]) -> None:
    from coreai_opt.compression import QuantizeConfig, flag_names
    from coreai_opt.quantization import ActivationConfig, OpConfig, QuantizerConfig
    from coreai_opt.recipes import quantize_activations_file

    from .._config_options import config_from_options, config_parameters
    from ..render import activations_line, print_line, render_activation_quantization

    fields = {p.name for p in config_parameters(QuantizeConfig)}
    weights = config_from_options(QuantizeConfig, {k: v for k, v in values.items() if k in fields})
    with option_errors(
        flag_names(QuantizeConfig) | {"observer": "--observer", "qscheme": "--activation-scheme"}
    ):
        acts = ActivationConfig(
            values["activations"].value, values["activation_scheme"].value, values["observer"].value
        )
        config = QuantizerConfig(OpConfig(weights, acts))
    as_json, quiet = values["as_json"], values["quiet"]
    with user_errors(as_json), weight_progress(not (as_json or quiet), "calibrating") as progress:
        result = quantize_activations_file(
            values["model"], values["output"], config, calibration=values["calibration"],
            random_samples=values["calibration_samples"] or 32, calibration_tokens=values["calibration_tokens"],
            force=values["force"], progress=progress,
            trust_pickle=values["trust_pickle"],
        )  # fmt: skip
    if as_json:
        print_json(result.to_dict())
    elif quiet:
        print_line(activations_line(result))
    else:
        render_activation_quantization(result)


def quantize_command() -> Any:
    from coreai_opt.compression import QuantizeConfig
    from coreai_opt.quantization import OpConfig

    command = command_of(
        QuantizeConfig, "quantizing", _QUANTIZE_DOC,
        "Output file (default: model.<dtype>.<suffix>, or model.w8a8.pt2 with --activations, beside the input).",
        _activation_parameters(), body=_quantize,
    )  # fmt: skip
    signature = command.__signature__
    threshold = typer.Option(None, "--threshold", help=(
        f"Skip weights with this many elements or fewer (default: {QuantizeConfig().weight_num_threshold}; "
        f"with --activations {OpConfig().weights.weight_num_threshold}: every weight of a quantized op)."))  # type: ignore[union-attr]  # fmt: skip
    parameters = [
        p.replace(default=threshold, annotation=int | None) if p.name == "weight_num_threshold" else p
        for p in signature.parameters.values()
    ]
    command.__signature__ = signature.replace(parameters=parameters)
    return command


_QUANTIZE_DOC = """Quantize the weights of a Core AI asset or a torch.export program and report every weight;
with --activations also the activations (calibrated on real samples) of a .pt2.

Example: coreopt quantize sample_models/transformer.aimodel --dtype int8 -o build/t.int8.aimodel

Example: coreopt quantize sample_models/transformer.pt2 --dtype int8 -o build/t.int8.pt2

Example: coreopt quantize model.aimodel --dtype int4 --granularity block --block-size 32 --json

Example: coreopt quantize model.aimodel --dtype fp8e4m3 --scale-dtype e8m0 --override 'embed*:skip'

Example: coreopt quantize model.pt2 --activations int8 --calibration samples.safetensors --observer mse

Example: coreopt quantize sample_models/cnn.pt2 --activations int8 --calibration random -o build/cnn.w8a8.pt2

Example: coreopt quantize model.pt2 --dtype int4 --method gptq --calibration text.txt --calibration-tokens 16384

Example: coreopt quantize smol.kv.pt2 --dtype int4 --kv-cache-dtype int8   (a stateful decoder's cache too)
"""
