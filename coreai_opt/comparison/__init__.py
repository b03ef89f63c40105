"""Run two Core AI assets on the same inputs and measure how closely their outputs agree."""

from ._compare import ComparisonResult, OutputComparison, compare_files
from ._inputs import DEFAULT_INT_RANGE, parse_int_range

__all__ = ["DEFAULT_INT_RANGE", "ComparisonResult", "OutputComparison", "compare_files", "parse_int_range"]
