"""Weight and activation quantization with calibration and quantization-aware training (W8A8).

`Quantizer(model, QuantizerConfig())` -> `prepare(example_inputs)` -> forward passes inside
`calibration_mode()` (and training, if wished) -> `finalize(backend=ExportBackend.CoreAI)`: a
module carrying coreai-torch's `quantize`/`dequantize` around the inputs of linear, convolution
and matrix-product ops and their weights encoded as `quantize_weights` encodes them.
`coreai_opt.recipes.quantize_activations_file` does the same to a `.pt2` file on calibration samples.
"""

from ._config import (
    ACTIVATION_DTYPES,
    ActivationConfig,
    ExportBackend,
    Observer,
    OpConfig,
    OpType,
    QuantizerConfig,
)

# these import torch: loaded on first use, so the CLI can read the enums above without it
_LAZY = {
    "ActivationResult": "_quantizer",
    "NotCalibrated": "_quantizer",
    "NothingToQuantize": "_quantizer",
    "QuantizationReport": "_quantizer",
    "Quantizer": "_quantizer",
}

__all__ = [
    "ACTIVATION_DTYPES",
    "ActivationConfig",
    "ActivationResult",
    "ExportBackend",
    "NotCalibrated",
    "NothingToQuantize",
    "Observer",
    "OpConfig",
    "OpType",
    "QuantizationReport",
    "Quantizer",
    "QuantizerConfig",
]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
