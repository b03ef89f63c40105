"""Figures as PNG files, shared by every report that draws one (matplotlib is the optional extra
`coreopt[plot]`, imported only when a plot is asked for)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coreai_opt.io import write_atomically


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError("--plot needs matplotlib: pip install 'coreopt[plot]'") from error
    matplotlib.use("Agg")  # files only: no display
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure: Any, path: Path) -> None:
    """Lay out, write as PNG atomically and close a figure (closed on failure too)."""
    plt = pyplot()
    figure.axes[0].grid(True, alpha=0.3)
    figure.tight_layout()

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as stream:
            figure.savefig(stream, format="png")

    try:
        write_atomically(Path(path), write)
    finally:
        plt.close(figure)
