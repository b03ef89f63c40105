"""`coreopt quantize model.pt2 --activations int8 --calibration DATA`: the Quantizer on a `.pt2` file.

The program's module is prepared, calibrated on the samples (`calibration.Samples`: read as
`compare --inputs` reads them, or drawn by the input policy when the user says `random`), and
the program itself finalized in place and saved atomically - no export. Calibration data is
checked before any work: names, shapes and kinds against the program's inputs, every float value
finite.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coreai_opt.calibration import RANDOM, Samples
from coreai_opt.compression import Progress
from coreai_opt.io import ModelFileError, ModelFormat, check_output, load_pt2, model_format, save_pt2

from ._config import QuantizerConfig
from ._quantizer import NothingToQuantize, QuantizationReport, Quantizer


@dataclass
class ActivationsFileResult:
    source: Path
    output: Path
    calibration: str  # where the samples came from
    samples: int
    options: dict[str, Any]  # the global weight and activation options
    report: QuantizationReport
    seconds: float
    file_bytes_before: int
    file_bytes_after: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": str(self.source),
            "output": str(self.output),
            "method": "quantize-activations",
            "calibration": {"source": self.calibration, "samples": self.samples},
            "options": self.options,
            "seconds": round(self.seconds, 4),
            "file_bytes_before": self.file_bytes_before,
            "file_bytes_after": self.file_bytes_after,
            "report": self.report.to_dict(),
        }


def _options(config: QuantizerConfig) -> dict[str, Any]:
    op = config.global_config
    acts = op.activations
    return {
        "weights": op.weights.options() if op.weights is not None else None,
        "activations": None if acts is None else {
            "dtype": acts.dtype.value, "qscheme": acts.qscheme.value, "observer": acts.observer.value,
            "percentile": acts.percentile, "averaging_constant": acts.averaging_constant,
        },
    }  # fmt: skip


def default_output(source: Path, config: QuantizerConfig) -> Path:
    """`model.pt2` -> `model.w8a8.pt2` (`w4a8`, ...: the global weight and activation widths)."""
    op = config.global_config
    weights = f"w{op.weights.dtype.bits}" if op.weights is not None else "wf"
    activations = f"a{op.activations.dtype.bits}" if op.activations is not None else "af"
    return source.with_name(f"{source.stem}.{weights}{activations}{source.suffix}")


def quantize_activations_file(
    source: Path | str,
    output: Path | str | None = None,
    config: QuantizerConfig | None = None,
    *,
    calibration: Path | str,
    random_samples: int = 32,
    seed: int = 0,
    force: bool = False,
    progress: Progress | None = None,
    trust_pickle: bool = False,
) -> ActivationsFileResult:
    """Quantize a `.pt2`'s weights and activations, calibrated on `calibration` (a safetensors
    file or directory of samples, or "random" for `random_samples` seeded draws). The loaded
    program is edited in place and saved: it is never exported again."""
    source = Path(source)
    config = config if config is not None else QuantizerConfig()
    model_format(source, (ModelFormat.PT2,))
    out = Path(output) if output is not None else default_output(source, config)
    model_format(out, (ModelFormat.PT2,))
    check_output(out, force=force, inputs=(source,))
    if random_samples < 1:
        raise ValueError(f"random_samples must be 1 or more, not {random_samples}")
    ep = load_pt2(source, trust_pickle=trust_pickle)
    random = str(calibration) == RANDOM
    samples = Samples.of(calibration, count=random_samples if random else None, seed=seed)
    batches = list(samples.inputs(ep))  # read and checked before any work
    start = time.perf_counter()
    quantizer = Quantizer.of_program(ep, config)
    try:
        prepared = quantizer.prepare(batches[0][1])
    except NothingToQuantize as exc:
        raise ModelFileError(source, str(exc)) from None
    with quantizer.calibration_mode():
        for done, (name, inputs) in enumerate(batches, 1):
            prepared(*inputs)
            if progress is not None:
                progress(done, len(batches), name)
    quantizer.finalize()
    seconds = time.perf_counter() - start
    save_pt2(ep, out, force=force, inputs=(source,))
    assert quantizer.report is not None
    return ActivationsFileResult(
        source,
        out,
        samples.describe(),
        len(batches),
        _options(config),
        quantizer.report,
        seconds,
        source.stat().st_size,
        out.stat().st_size,
    )
