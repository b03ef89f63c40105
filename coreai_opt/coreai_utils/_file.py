"""The file-level form of every pass: load an asset, compress it, save it atomically."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coreai_opt._errors import NothingDoneError
from coreai_opt.compression import (
    CompressionReport,
    Config,
    Executor,
    PalettizeConfig,
    Progress,
    QuantizeConfig,
    SparsifyConfig,
    compress_,
    executor_of,
)
from coreai_opt.io import (
    ModelFormat,
    asset_bytes,
    check_output,
    load_aimodel,
    load_pt2,
    model_format,
    save_aimodel,
    save_pt2,
)

_METHODS = {QuantizeConfig: "quantize", PalettizeConfig: "palettize", SparsifyConfig: "sparsify"}


@dataclass
class CompressionFileResult:
    source: Path
    output: Path
    method: str  # quantize / palettize / sparsify
    options: dict[str, Any]
    report: CompressionReport
    seconds: float
    file_bytes_before: int
    file_bytes_after: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": str(self.source),
            "output": str(self.output),
            "method": self.method,
            "options": self.options,
            "seconds": round(self.seconds, 4),
            "file_bytes_before": self.file_bytes_before,
            "file_bytes_after": self.file_bytes_after,
            "report": self.report.to_dict(),
        }


def default_output(source: Path, config: Config) -> Path:
    """`model.aimodel` -> `model.int8.aimodel` (`.lut4`, `.sparse50`, ...; a `.pt2` stays a `.pt2`)
    beside the input."""
    return source.with_name(f"{source.stem}.{config.tag}{source.suffix}")


def compress_file(
    source: Path | str,
    output: Path | str | None,
    config: Config,
    *,
    force: bool = False,
    progress: Progress | None = None,
    trust_pickle: bool = False,
    executor: str | Executor | None = None,
    allow_empty: bool = False,
) -> CompressionFileResult:
    """Compress a model's weights as `config` says into a new file (the input is never touched).

    The container follows the suffix: an `.aimodel` is rewritten with Core AI's decompression ops,
    a `.pt2` with coreai-torch's (the output has the input's format). Paths are checked first, so
    bad input fails before any work; the output is written atomically. `executor` runs the
    per-weight encoding (`local`, `ray`, or an `Executor`); the file is the same whichever runs it.
    A run that compresses nothing, or with an override that matches no weight, raises
    `NothingDoneError` and writes nothing, unless `allow_empty`.
    """
    source = Path(source)
    kind = model_format(source, (ModelFormat.AIMODEL, ModelFormat.PT2))
    out = Path(output) if output is not None else default_output(source, config)
    model_format(out, (kind,))
    check_output(out, force=force, inputs=(source,))
    run = executor_of(executor)  # an unknown name or a missing extra fails before the load
    program = (
        load_aimodel(source) if kind is ModelFormat.AIMODEL else load_pt2(source, trust_pickle=trust_pickle)
    )
    start = time.perf_counter()
    report = compress_(program, config, progress, run)
    seconds = time.perf_counter() - start
    if report.problems and not allow_empty:
        raise NothingDoneError(
            f"{source}: {'; '.join(report.problems)}: no output written (--allow-empty writes it anyway)"
        )
    if kind is ModelFormat.AIMODEL:
        save_aimodel(program, out, force=force, inputs=(source,))
    else:
        save_pt2(program, out, force=force, inputs=(source,))
    return CompressionFileResult(
        source,
        out,
        _METHODS[type(config)],
        config.options(),
        report,
        seconds,
        asset_bytes(source),
        asset_bytes(out),
    )


def quantize_file(
    source: Path | str, output: Path | str | None = None, config: QuantizeConfig | None = None, **kwargs: Any
) -> CompressionFileResult:
    """`coreopt quantize`: quantize an asset's weights into a new asset."""
    return compress_file(source, output, config or QuantizeConfig(), **kwargs)


def palettize_file(
    source: Path | str, output: Path | str | None = None, config: PalettizeConfig | None = None, **kwargs: Any
) -> CompressionFileResult:
    """`coreopt palettize`: k-means palettize an asset's weights into a new asset."""
    return compress_file(source, output, config or PalettizeConfig(), **kwargs)


def sparsify_file(
    source: Path | str, output: Path | str | None = None, config: SparsifyConfig | None = None, **kwargs: Any
) -> CompressionFileResult:
    """`coreopt sparsify`: prune an asset's weights (optionally quantizing or palettizing the kept ones)."""
    return compress_file(source, output, config or SparsifyConfig(), **kwargs)
