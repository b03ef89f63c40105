"""Rich renderings of library results, one module per command family (`_inspect`, `_convert`,
`_cast`, `_compression`, `_activations`, `_compare`) over the helpers they share (`_shared`: tables
fitted to the terminal, shapes, metrics, the `--quiet` line). Formatting only: no numerics here.
Commands import from this package, lazily (rich's tables need not load for `--help`)."""

from __future__ import annotations

from .._common import console
from ._activations import activations_line, render_activation_quantization
from ._cast import cast_line, render_cast
from ._compare import comparison_line, render_comparison, render_sweep, sweep_line
from ._compression import compression_line, render_compression
from ._convert import conversion_line, render_conversion
from ._inspect import model_line, render_model_report
from ._shared import distinct_tails, fitted_table, print_line, reflow
from ._transform import render_transform, transform_line

__all__ = [
    "activations_line",
    "cast_line",
    "comparison_line",
    "compression_line",
    "console",
    "conversion_line",
    "distinct_tails",
    "fitted_table",
    "model_line",
    "print_line",
    "reflow",
    "render_activation_quantization",
    "render_cast",
    "render_comparison",
    "render_compression",
    "render_conversion",
    "render_model_report",
    "render_sweep",
    "render_transform",
    "sweep_line",
    "transform_line",
]
