"""Run two Core AI assets on the same inputs and measure how closely their outputs agree."""

from ._compare import ComparisonResult, OutputComparison, compare_files
from ._inputs import parse_int_range

__all__ = ["ComparisonResult", "OutputComparison", "compare_files", "parse_int_range"]
