"""The size-vs-accuracy plot of a sweep, as PNG (matplotlib is the optional extra `coreopt[plot]`)."""

from __future__ import annotations

from pathlib import Path

from coreai_opt._plot import pyplot, save_figure

from ._sweep import SweepResult


def check_plot_path(path: Path) -> None:
    """Fail before any work: a plot is a .png, and matplotlib must be there to draw it."""
    if Path(path).suffix.lower() != ".png":
        raise ValueError(f"{path}: a plot is written as .png")
    pyplot()


def plot_sweep(result: SweepResult, path: Path) -> None:
    """Size on disk (MiB) against the worst cosine, one labelled point per candidate and the
    reference at cosine 1; written atomically."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    mib = 1 << 20
    axes.scatter([result.reference_bytes / mib], [1.0], marker="*", s=120, color="black")
    axes.annotate(result.reference.name, (result.reference_bytes / mib, 1.0), fontsize=8,
                  xytext=(4, 4), textcoords="offset points")  # fmt: skip
    for row in result.rows:
        if row.cosine_min is None:
            continue
        axes.scatter([row.file_bytes / mib], [row.cosine_min], color="tab:blue")
        axes.annotate(f"{row.candidate.name} ({row.bits_per_weight:.2f} b/w)", (row.file_bytes / mib, row.cosine_min),
                      fontsize=8, xytext=(4, 4), textcoords="offset points")  # fmt: skip
    axes.set_xlabel("size on disk (MiB)")
    axes.set_ylabel("cosine to the reference (worst output and sample)")
    axes.set_title(f"size vs accuracy against {result.reference.name}")
    save_figure(figure, path)
