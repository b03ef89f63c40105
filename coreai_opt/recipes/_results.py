"""What each step of a recipe reports, and what a whole recipe run reports.

Each step's record names the recipe's source and output, so a one-step recipe's record is what
`coreopt quantize`, `cast`, ... print as `--json`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coreai_opt.models import KVCacheReport
from coreai_opt.transforms import TransformReport

if TYPE_CHECKING:
    from coreai_opt.casting import CastReport, CastTarget, CheckResult
    from coreai_opt.compression import CompressionReport
    from coreai_opt.quantization import QuantizationReport


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
    spot_check: Any = None  # an evaluation.SpotCheck of a language model written, or None
    kv_cache: KVCacheReport | None = None  # a stateful decoder's cache quantized before the weights

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
            "spot_check": None if self.spot_check is None else self.spot_check.to_dict(),
            "kv_cache": None if self.kv_cache is None else self.kv_cache.to_dict(),
        }


@dataclass
class CastFileResult:
    source: Path
    output: Path
    target: CastTarget
    report: CastReport
    check: CheckResult | None
    seconds: float
    written: bool = True  # False when the check failed and the output was not kept

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": str(self.source),
            "output": str(self.output),
            "to": self.target.value,
            "seconds": round(self.seconds, 4),
            "report": self.report.to_dict(),
            "check": self.check.to_dict() if self.check is not None else None,
            "written": self.written,
        }


@dataclass(frozen=True)
class ConversionResult:
    source: Path
    output: Path
    seconds: float
    converter_log: str

    def to_dict(self) -> dict[str, Any]:
        return {"source": str(self.source), "output": str(self.output), "seconds": round(self.seconds, 4)}


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


@dataclass(frozen=True)
class BudgetResult:
    source: Path
    output: Path
    weight_bytes: int
    max_bytes: int  # a budget step always states it (`Budget.max_bytes` is required)

    @property
    def ok(self) -> bool:
        return self.weight_bytes <= self.max_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"weight_bytes": self.weight_bytes, "max_bytes": self.max_bytes, "ok": self.ok}


StepResult = (
    CompressionFileResult
    | CastFileResult
    | ConversionResult
    | ActivationsFileResult
    | BudgetResult
    | TransformReport
    | KVCacheReport
)


@dataclass
class RecipeResult:
    source: Path
    output: Path
    seconds: float
    written: bool
    steps: list[tuple[str, StepResult]] = field(default_factory=list)
    failed: str | None = None  # the check that failed, if one did

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": str(self.source),
            "output": str(self.output),
            "written": self.written,
            "seconds": round(self.seconds, 4),
            "failed": self.failed,
            "steps": [{"step": kind, **result.to_dict()} for kind, result in self.steps],
        }
