"""Run two models (`.aimodel` on the Core AI runtime, `.pt2` in PyTorch) on the same samples and
measure how closely their outputs agree."""

from ._compare import ComparisonResult, OutputComparison, SampleSpread, compare_files
from ._inputs import parse_int_range

__all__ = ["ComparisonResult", "OutputComparison", "SampleSpread", "compare_files", "parse_int_range"]
