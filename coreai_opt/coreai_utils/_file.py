"""The file-level form of every compression pass: load an asset, compress, save atomically."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coreai_opt.io import ModelFormat, check_output, load_aimodel, model_format, save_aimodel

from ._driver import check_threshold
from ._options import CompressionGranularity, DType, QScheme
from ._palettize import PalettizePlan, palettize_program
from ._quantize import quantize_program, validate
from ._results import CompressionReport, Progress
from ._sparsify import SparsifyPlan, sparsify_program


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


def _asset_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def default_output(source: Path, tag: str) -> Path:
    """`model.aimodel` -> `model.int8.aimodel` beside the input."""
    return source.with_name(f"{source.stem}.{tag}{ModelFormat.AIMODEL.value}")


def compress_file(
    source: Path | str,
    output: Path | str | None,
    *,
    method: str,
    tag: str,
    options: dict[str, Any],
    compress: Callable[[Any], CompressionReport],
    weight_num_threshold: int,
    force: bool = False,
) -> CompressionFileResult:
    """Check the threshold and paths first (so bad input fails before any work), compress, save
    atomically."""
    check_threshold(weight_num_threshold)
    source = Path(source)
    model_format(source, (ModelFormat.AIMODEL,))
    out = Path(output) if output is not None else default_output(source, tag)
    model_format(out, (ModelFormat.AIMODEL,))
    check_output(out, force=force, inputs=(source,))
    program = load_aimodel(source)
    start = time.perf_counter()
    report = compress(program)
    seconds = time.perf_counter() - start
    save_aimodel(program, out, force=force, inputs=(source,))
    return CompressionFileResult(
        source, out, method, options, report, seconds, _asset_bytes(source), _asset_bytes(out)
    )


def default_granularity(dtype: DType) -> CompressionGranularity:
    """Per channel, except MX FP4, which is per block by definition."""
    if dtype is DType.FP4_E2M1FN:
        return CompressionGranularity.PER_BLOCK
    return CompressionGranularity.PER_CHANNEL


def quantize_file(
    source: Path | str,
    output: Path | str | None = None,
    *,
    dtype: DType | str = DType.INT8,
    qscheme: QScheme | str = QScheme.SYMMETRIC,
    granularity: CompressionGranularity | str | None = None,
    block_size: int = 32,
    weight_num_threshold: int = 1024,
    scale_dtype: DType | str | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> CompressionFileResult:
    """`coreopt quantize`: quantize an asset's weights into a new asset (the input is never touched)."""
    dtype, qscheme = DType(dtype), QScheme(qscheme)
    granularity = default_granularity(dtype) if granularity is None else CompressionGranularity(granularity)
    scale = DType(scale_dtype) if scale_dtype is not None else None
    options = {
        "dtype": dtype.value,
        "scheme": qscheme.value,
        "granularity": granularity.value,
        "block_size": block_size if granularity is CompressionGranularity.PER_BLOCK else None,
        "scale_dtype": scale.value if scale is not None else None,
        "weight_num_threshold": weight_num_threshold,
    }

    def compress(program: Any) -> CompressionReport:
        return quantize_program(
            program, dtype, qscheme, granularity, block_size, weight_num_threshold, scale, progress
        )

    validate(dtype, qscheme, granularity, block_size, scale)  # a bad combination fails before loading
    return compress_file(
        source, output, method="quantize", tag=dtype.value, options=options, compress=compress,
        weight_num_threshold=weight_num_threshold, force=force,
    )  # fmt: skip


def palettize_file(
    source: Path | str,
    output: Path | str | None = None,
    *,
    plan: PalettizePlan | None = None,
    weight_num_threshold: int = 1024,
    force: bool = False,
    progress: Progress | None = None,
) -> CompressionFileResult:
    """`coreopt palettize`: k-means palettize an asset's weights into a new asset."""
    plan = plan or PalettizePlan()
    plan.validate()
    options = {
        "n_bits": plan.n_bits,
        "granularity": plan.granularity.value,
        "group_size": plan.group_size
        if plan.granularity is CompressionGranularity.PER_GROUPED_CHANNEL
        else None,
        "lut_dtype": plan.lut_dtype.value if plan.lut_dtype is not None else None,
        "per_channel_scale": plan.per_channel_scale,
        "cluster_dim": plan.cluster_dim,
        "fast_kmeans": plan.fast,
        "rounding_precision": plan.rounding_precision if plan.fast else None,
        "workers": plan.workers,
        "weight_num_threshold": weight_num_threshold,
    }

    def compress(program: Any) -> CompressionReport:
        return palettize_program(program, plan, weight_num_threshold, progress)

    return compress_file(
        source, output, method="palettize", tag=f"lut{plan.n_bits}", options=options, compress=compress,
        weight_num_threshold=weight_num_threshold, force=force,
    )  # fmt: skip


def sparsify_file(
    source: Path | str,
    output: Path | str | None = None,
    *,
    plan: SparsifyPlan | None = None,
    weight_num_threshold: int = 1024,
    force: bool = False,
    progress: Progress | None = None,
) -> CompressionFileResult:
    """`coreopt sparsify`: prune an asset's weights (optionally quantizing or palettizing the kept ones)."""
    plan = plan or SparsifyPlan()
    plan.validate()
    ratio = plan.n_m_ratio
    options = {
        "sparsity": float(plan.sparsity) if plan.sparsity is not None else None,
        "n_m": f"{ratio[0]}:{ratio[1]} (n of every m kept)" if ratio is not None else None,
        "block_size": plan.block_size,
        "quantize": plan.quantize_dtype.value if plan.quantize_dtype is not None else None,
        "palettize_nbits": plan.palettize_nbits,
        "weight_num_threshold": weight_num_threshold,
    }

    def compress(program: Any) -> CompressionReport:
        return sparsify_program(program, plan, weight_num_threshold, progress)

    return compress_file(
        source, output, method="sparsify", tag=plan.tag, options=options, compress=compress,
        weight_num_threshold=weight_num_threshold, force=force,
    )  # fmt: skip
