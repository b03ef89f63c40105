"""Run two models (`.aimodel` on the Core AI runtime, `.pt2` in PyTorch) on the same samples and
measure how closely their outputs agree."""

from coreai_opt._agreement import Agreement

from ._compare import (
    ComparisonResult,
    OutputComparison,
    SampleSpread,
    Side,
    compare_files,
    compare_many,
    open_side,
)
from ._inputs import parse_int_range
from ._plot import check_plot_path, plot_sweep
from ._sweep import SweepResult, SweepRow, compare_sweep
from ._torch import ExportedSide

__all__ = [
    "Agreement",
    "ComparisonResult",
    "ExportedSide",
    "OutputComparison",
    "SampleSpread",
    "Side",
    "SweepResult",
    "SweepRow",
    "check_plot_path",
    "compare_files",
    "compare_many",
    "compare_sweep",
    "open_side",
    "parse_int_range",
    "plot_sweep",
]
