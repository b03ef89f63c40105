"""Mixed precision found automatically: a setting per weight (kept, int8, int4 blocks, 8- to
2-bit look-up tables, optionally sparsity) under one budget - a size or an accuracy bound - from
estimated per-weight damage (Fisher, cached), an exact knapsack over the stored bytes, and
confirmation rounds on evaluation data. `optimize(program, budget, calibration, evaluation)`
gives the program written, the recipe that makes it (`coreopt apply`) and the report.
"""

from ._choices import DEFAULT_CHOICES, KEEP, Choice, builtin_choices, parse_choices
from ._config import OptimizeConfig
from ._costs import CostTable, cost_table
from ._optimize import optimize
from ._plot import plot_optimization
from ._records import Goal, Measured, Optimized, OptimizeReport, Round, Uniform
from ._solve import Plan, front, solve

__all__ = [
    "DEFAULT_CHOICES",
    "KEEP",
    "Choice",
    "CostTable",
    "Goal",
    "Measured",
    "OptimizeConfig",
    "OptimizeReport",
    "Optimized",
    "Plan",
    "Round",
    "Uniform",
    "builtin_choices",
    "cost_table",
    "front",
    "optimize",
    "parse_choices",
    "plot_optimization",
    "solve",
]
